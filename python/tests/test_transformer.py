"""The Transformer modules and Embedding(padding_idx) against PyTorch 1.13: the same state_dict
keys, PyTorch's weights loaded, then outputs and the gradients of inputs and parameters compared
(encoder with a causal src_mask and a key padding mask, decoder with a causal tgt_mask and a
memory key padding mask, sequence-first and batch-first, post-norm and pre-norm); the padding
row of an Embedding left as it is by SGD and Adam steps, as PyTorch's."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import lockstep
import lockstep.nn as nn

D, H, FF, N, S, T = 8, 2, 16, 3, 6, 5


def _ours(t):
    return lockstep.from_numpy(np.ascontiguousarray(t.detach().numpy()))


def _load_torch_weights(ours, theirs):
    state = theirs.state_dict()
    assert list(ours.state_dict()) == list(state)  # PyTorch's names, in its order
    ours.load_state_dict({k: _ours(v) for k, v in state.items()})


def _padding(lengths, size):
    return np.array([[i >= n for i in range(size)] for n in lengths])


def _seq(rng, length, batch_first):
    x = rng.standard_normal((N, length, D) if batch_first else (length, N, D)).astype(np.float32)
    return x


def _compare(ours, theirs, outs, touts, inputs, tinputs, rng):
    """Compares the outputs, then the gradients of a weighted sum of them."""
    np.testing.assert_allclose(outs.numpy(), touts.detach().numpy(), rtol=1e-4, atol=1e-5)
    w = rng.standard_normal(touts.shape).astype(np.float32)
    (outs * lockstep.from_numpy(w)).sum().backward()
    (touts * torch.from_numpy(w)).sum().backward()
    for x, tx in zip(inputs, tinputs):
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    tparams = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tparams[name].grad.numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=name)


def _inputs(*arrays):
    ours = [lockstep.from_numpy(a).requires_grad_() for a in arrays]
    theirs = [torch.from_numpy(a.copy()).requires_grad_() for a in arrays]
    return ours, theirs


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_matches_pytorch(batch_first, norm_first):
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    activation = "gelu" if norm_first else "relu"
    tlayer = torch.nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation=activation,
                                              batch_first=batch_first, norm_first=norm_first)
    theirs = torch.nn.TransformerEncoder(tlayer, 2, norm=torch.nn.LayerNorm(D),
                                         enable_nested_tensor=False).eval()
    layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation=activation,
                                       batch_first=batch_first, norm_first=norm_first)
    ours = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D)).eval()
    _load_torch_weights(ours, theirs)
    (src,), (tsrc,) = _inputs(_seq(rng, S, batch_first))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(S)
    pad = _padding([6, 4, 5], S)
    outs = ours(src, mask=nn.Transformer.generate_square_subsequent_mask(S),
                src_key_padding_mask=lockstep.from_numpy(pad))
    touts = theirs(tsrc, mask=mask, src_key_padding_mask=torch.from_numpy(pad))
    _compare(ours, theirs, outs, touts, [src], [tsrc], rng)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_matches_pytorch(batch_first, norm_first):
    torch.manual_seed(2)
    rng = np.random.default_rng(3)
    tlayer = torch.nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=batch_first,
                                              norm_first=norm_first)
    theirs = torch.nn.TransformerDecoder(tlayer, 2, norm=torch.nn.LayerNorm(D)).eval()
    layer = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=batch_first,
                                       norm_first=norm_first)
    ours = nn.TransformerDecoder(layer, 2, norm=nn.LayerNorm(D)).eval()
    _load_torch_weights(ours, theirs)
    (tgt, memory), (ttgt, tmemory) = _inputs(_seq(rng, T, batch_first), _seq(rng, S, batch_first))
    tgt_pad, mem_pad = _padding([5, 5, 3], T), _padding([6, 2, 4], S)
    outs = ours(tgt, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(T),
                tgt_key_padding_mask=lockstep.from_numpy(tgt_pad),
                memory_key_padding_mask=lockstep.from_numpy(mem_pad))
    touts = theirs(ttgt, tmemory, tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(T),
                   tgt_key_padding_mask=torch.from_numpy(tgt_pad),
                   memory_key_padding_mask=torch.from_numpy(mem_pad))
    _compare(ours, theirs, outs, touts, [tgt, memory], [ttgt, tmemory], rng)


def test_decoder_layer_alone_and_the_causal_hint():
    torch.manual_seed(4)
    rng = np.random.default_rng(5)
    theirs = torch.nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, activation="gelu").eval()
    ours = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, activation="gelu").eval()
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    _load_torch_weights(ours, theirs)
    (tgt, memory), (ttgt, tmemory) = _inputs(_seq(rng, T, False), _seq(rng, S, False))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
    outs = ours(tgt, memory, tgt_mask=_ours(mask))
    touts = theirs(ttgt, tmemory, tgt_mask=mask)
    _compare(ours, theirs, outs, touts, [tgt, memory], [ttgt, tmemory], rng)
    # tgt_is_causal=True alone masks as the causal mask does.
    hinted = ours(tgt, memory, tgt_is_causal=True)
    np.testing.assert_allclose(hinted.numpy(), touts.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_transformer_matches_pytorch():
    torch.manual_seed(6)
    rng = np.random.default_rng(7)
    kw = dict(d_model=D, nhead=H, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=FF,
              dropout=0.0, batch_first=True)
    theirs = torch.nn.Transformer(**kw).eval()
    ours = nn.Transformer(**kw).eval()
    assert (ours.d_model, ours.nhead, ours.batch_first) == (D, H, True)
    _load_torch_weights(ours, theirs)
    (src, tgt), (tsrc, ttgt) = _inputs(_seq(rng, S, True), _seq(rng, T, True))
    pad = _padding([6, 3, 5], S)
    outs = ours(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(T),
                src_key_padding_mask=lockstep.from_numpy(pad),
                memory_key_padding_mask=lockstep.from_numpy(pad))
    touts = theirs(tsrc, ttgt, tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(T),
                   src_key_padding_mask=torch.from_numpy(pad),
                   memory_key_padding_mask=torch.from_numpy(pad))
    _compare(ours, theirs, outs, touts, [src, tgt], [tsrc, ttgt], rng)


def test_stacks_copy_their_layer_and_expose_pytorchs_attributes():
    layer = nn.TransformerEncoderLayer(D, H, FF)
    encoder = nn.TransformerEncoder(layer, 3)
    assert len(encoder.layers) == 3 and encoder.norm is None
    # PyTorch deep-copies the layer: equal values, parameters of their own.
    first, last = encoder.layers[0], encoder.layers[2]
    np.testing.assert_array_equal(first.linear1.weight.numpy(), layer.linear1.weight.numpy())
    assert not first.linear1.weight.is_same(last.linear1.weight)
    assert len(encoder.parameters()) == 3 * len(layer.parameters())
    model = nn.Transformer(d_model=D, nhead=H, num_encoder_layers=1, num_decoder_layers=2,
                           dim_feedforward=FF)
    assert len(model.decoder.layers) == 2
    assert isinstance(model.decoder.layers[1].multihead_attn, nn.MultiheadAttention)
    assert isinstance(model.encoder.norm, nn.LayerNorm)
    assert list(model.state_dict()) == list(torch.nn.Transformer(
        D, H, 1, 2, FF).state_dict())
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    np.testing.assert_array_equal(mask.numpy(),
                                  torch.nn.Transformer.generate_square_subsequent_mask(4).numpy())
    with pytest.raises(lockstep.Error, match="activation"):
        nn.TransformerDecoderLayer(D, H, activation="tanh")
    assert nn.TransformerDecoderLayer(D, H, activation=nn.functional.gelu) is not None


def test_embedding_padding_row_stays_under_sgd_and_adam():
    V, E, pad = 7, 4, -3  # row 4
    rng = np.random.default_rng(8)
    for make, tmake in [(lambda p: lockstep.optim.SGD(p, lr=0.5, momentum=0.9),
                         lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9)),
                        (lambda p: lockstep.optim.Adam(p, lr=0.1),
                         lambda p: torch.optim.Adam(p, lr=0.1))]:
        torch.manual_seed(9)
        theirs = torch.nn.Embedding(V, E, padding_idx=pad)
        ours = nn.Embedding(V, E, padding_idx=pad)
        assert ours.padding_idx == theirs.padding_idx == 4
        np.testing.assert_array_equal(ours.weight.numpy()[4], np.zeros(E, np.float32))
        _load_torch_weights(ours, theirs)
        start = ours.weight.numpy().copy()
        opt, topt = make(ours.parameters()), tmake(theirs.parameters())
        for _ in range(4):
            idx = rng.integers(0, V, size=(3, 5))
            idx[:, 0] = 4
            w = rng.standard_normal((3, 5, E)).astype(np.float32)
            with lockstep.step():
                opt.zero_grad()
                out = ours(lockstep.tensor(idx))
                (out * lockstep.from_numpy(w)).sum().backward()
                opt.step()
            topt.zero_grad()
            tout = theirs(torch.from_numpy(idx))
            (tout * torch.from_numpy(w)).sum().backward()
            topt.step()
            np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-6)
        weight = ours.weight.numpy()
        np.testing.assert_array_equal(weight[4], start[4])
        assert not np.allclose(weight, start)
        np.testing.assert_allclose(weight, theirs.weight.detach().numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(lockstep.Error, match="padding_idx 7 is out of range"):
        nn.Embedding(V, E, padding_idx=7)
    with pytest.raises(lockstep.Error, match="padding_idx"):
        nn.Embedding(V, E, padding_idx=-8)
    assert nn.Embedding(V, E).padding_idx is None


def test_attention_is_fused_over_64_keys_and_more_by_default():
    # The cpu backend fuses a causal attention (forward and backward) only where that pays: over
    # at least 64 keys. Over fewer, the primitives ran faster (docs/performance.md). A fresh
    # interpreter, so that the variable is unset whatever the tests' environment sets.
    script = """
import os
import lockstep
import lockstep.nn.functional as F
for t in (32, 64):
    q, k, v, w = (lockstep.randn(2, 2, t, 16, requires_grad=i < 3) for i in range(4))
    before = lockstep.metrics.counter("fused_attentions")
    with lockstep.step():
        loss = (F.scaled_dot_product_attention(q, k, v, is_causal=True) * w).sum()
        loss.backward()
    print(t, lockstep.metrics.counter("fused_attentions") - before, float(q.grad.abs().sum()) > 0)
"""
    env = {k: v for k, v in os.environ.items() if k != "LOCKSTEP_FUSED_ATTENTION"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["32 0 True", "64 1 True"], r.stdout
