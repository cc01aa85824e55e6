"""PyTorch's own example programs, ported with the smallest diff (examples/pytorch/:
pytorch/examples' word_language_model with an LSTM and with a Transformer, nanoGPT's model.py and train.py), run a
few steps by lockstep and, the same source, by PyTorch 1.13 (examples/pytorch/run.py), from the
same initial weights and on the same batches: every loss the model computes (training steps,
evaluation, the reloaded best model's test loss) agrees to 1e-4 (word_language_model's Elman
RNN_TANH and RNN_RELU too). And each runs as a script; and the names the ports needed are checked
against PyTorch's."""
import os
import sys

import numpy as np
import pytest

from conftest import SOURCE_DIR, run_python

PORTS = os.path.join(SOURCE_DIR, "examples", "pytorch")
sys.path.insert(0, PORTS)
import run as ports  # noqa: E402  (examples/pytorch/run.py)


def _eval_mode(model):
    # nn.Transformer's layers take dropout 0.1 whatever --dropout says: train() would drop at
    # random, differently in each framework; eval mode has no dropout and the same arithmetic.
    def train(mode=True):
        return type(model).train(model, False)
    object.__setattr__(model, "train", train)
    train()


def _compare(program, tmp_path, steps, on_model=None, min_losses=4):
    ports.make_data(str(tmp_path))
    theirs, _, initial = ports.run(program, "pytorch", str(tmp_path), steps, batches_seed=5,
                                   on_model=on_model)
    ours, times, _ = ports.run(program, "lockstep", str(tmp_path), steps, initial=initial,
                               batches_seed=5, on_model=on_model)
    assert len(ours) == len(theirs) >= min_losses
    assert np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    return ours, theirs


def test_word_language_model_lstm_matches_pytorch(tmp_path, capsys):
    # 2 epochs of 5 batches (SGD by hand, p.data.add_(p.grad, alpha=-lr), gradient clipping,
    # hidden state carried over and detached), validation after each, the best model saved and
    # loaded back, then tested.
    ours, theirs = _compare("wlm_lstm", tmp_path, 8, min_losses=12)
    print(capsys.readouterr().out)  # the program's own lines, in the test's log
    print("LSTM losses, lockstep:", ours, "PyTorch:", theirs)


def test_word_language_model_transformer_matches_pytorch(tmp_path, capsys):
    ours, theirs = _compare("wlm_transformer", tmp_path, 8, on_model=_eval_mode, min_losses=12)
    print(capsys.readouterr().out)
    print("Transformer losses, lockstep:", ours, "PyTorch:", theirs)


@pytest.mark.parametrize("program", ["wlm_rnn_tanh", "wlm_rnn_relu"])
def test_word_language_model_elman_rnns_match_pytorch(program, tmp_path):
    _compare(program, tmp_path, 4, min_losses=8)


def test_nanogpt_matches_pytorch(tmp_path, capsys):
    # 6 iterations of 2 micro-steps (AdamW with decayed and undecayed groups, warm-up then cosine
    # learning rates, clipping), estimate_loss at 0, 3 and 6 (checkpoints saved at 3 and 6).
    ours, theirs = _compare("nanogpt", tmp_path, 6, min_losses=12)
    assert os.path.exists(os.path.join(str(tmp_path), "out", "ckpt.pt"))
    print(capsys.readouterr().out)
    print("nanoGPT losses, lockstep:", ours, "PyTorch:", theirs)


@pytest.mark.parametrize("program", ports.PROGRAMS)
def test_a_port_runs_as_a_script(program):
    r = run_python([os.path.join(PORTS, "run.py"), program, "lockstep", "4"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("result %s lockstep ms " % program), r.stdout


def test_saved_checkpoints_load_back(tmp_path):
    import lockstep
    model = lockstep.nn.Linear(3, 2)
    opt = lockstep.optim.AdamW(model.parameters(), lr=0.1)
    with lockstep.step():
        model(lockstep.ones(4, 3)).sum().backward()
        opt.step()
    path = str(tmp_path / "ckpt.pt")
    lockstep.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": 3},
                  path)
    back = lockstep.load(path)
    assert back["iter_num"] == 3
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(back["model"][k].numpy(), v.numpy())
    other = lockstep.nn.Linear(3, 2)
    other.load_state_dict(back["model"])
    np.testing.assert_array_equal(other.weight.numpy(), model.weight.numpy())
    with pytest.raises(lockstep.Error, match="state_dict"):
        lockstep.save(model, path)


# ---- The names the ports use that lockstep lacked, each against PyTorch's -------------------

def test_updates_by_hand_through_data():
    import lockstep
    import torch
    rng = np.random.default_rng(0)
    w0, x = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 3))
    p = lockstep.nn.Parameter(lockstep.from_numpy(w0))
    tp = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    for w, xs, mod in ((p, lockstep.from_numpy(x.astype(np.float32)), lockstep),
                       (tp, torch.from_numpy(x.astype(np.float32)), torch)):
        (xs @ w).square().sum().backward()
        w.data.add_(w.grad, alpha=-0.1)  # word_language_model's SGD
        w.data.sub_(w.grad, alpha=0.05)
        w.data.mul_(0.5)
    np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-6)
    assert p.requires_grad and p.data.shape == (3, 4)
    p.data = lockstep.zeros(3, 4)  # assigning .data replaces the value, keeps the parameter
    assert p.requires_grad and float(p.sum().item()) == 0.0
    with pytest.raises(lockstep.Error, match="requires grad"):
        p.add_(p, alpha=2.0)  # without .data (or no_grad) it is still refused


def test_small_tensor_and_module_names():
    import lockstep
    import torch
    t = lockstep.arange(6, dtype=lockstep.long, device="cpu").reshape(2, 3)
    assert t.new_zeros(2, 1).dtype == lockstep.int64 and t.new_ones(4).shape == (4,)
    assert t.type(lockstep.float32).dtype == lockstep.float32
    assert lockstep.arange(0, 3, device=t.device).tolist() == [0, 1, 2]
    assert f"{t.sum():.2f}" == f"{torch.arange(6).sum():.2f}" == "15.00"
    assert f"{t}" == str(t)
    r = lockstep.randint(7, (50,)).numpy()
    assert r.shape == (50,) and r.min() >= 0 and r.max() < 7
    assert str(lockstep.device("cpu")) == "cpu" and lockstep.device("cuda", 1).index == 1
    assert lockstep.device("cuda:0").type == "cuda"
    with pytest.raises(lockstep.Error, match="unknown device"):
        lockstep.arange(3, device="tpu")
    assert lockstep.nn.Linear(2, 2, bias=False).bias is None  # as torch's
    m = lockstep.nn.Module()
    m.a, m.b = lockstep.nn.Linear(2, 2), lockstep.nn.Linear(2, 3)
    params = m.parameters()
    assert len(params) == 4 and next(params).shape == (2, 2) and next(params).shape == (2,)
    d = lockstep.nn.ModuleDict(dict(wte=lockstep.nn.Embedding(5, 2)))
    assert d.wte is d["wte"]
    with pytest.raises(AttributeError):
        d.wpe
    lockstep.nn.LSTM(2, 3).flatten_parameters()


def test_layer_norm_functional_matches_pytorch():
    import lockstep
    import torch
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    w, b = np.linspace(0.5, 2, 4, dtype=np.float32), np.linspace(-1, 1, 4, dtype=np.float32)
    F, TF = lockstep.nn.functional, torch.nn.functional
    for args, targs in (((4,), ((4,),)),  # an int is one axis (PyTorch's functional wants a tuple)
                        ((4, lockstep.from_numpy(w), None), ((4,), torch.from_numpy(w), None)),
                        (((3, 4),), ((3, 4),))):
        ours = F.layer_norm(lockstep.from_numpy(x), *args)
        theirs = TF.layer_norm(torch.from_numpy(x), *targs)
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    ours = F.layer_norm(lockstep.from_numpy(x), (4,), lockstep.from_numpy(w),
                        lockstep.from_numpy(b), 1e-3)
    theirs = TF.layer_norm(torch.from_numpy(x), (4,), torch.from_numpy(w), torch.from_numpy(b),
                           1e-3)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(lockstep.Error, match="normalized_shape"):
        F.layer_norm(lockstep.from_numpy(x), (3,))


def test_a_transformer_subclass_replaces_the_decoder_as_pytorchs_does():
    import lockstep
    import torch

    def build(nn):
        class LM(nn.Transformer):  # word_language_model's TransformerModel, in short
            def __init__(self):
                super().__init__(d_model=8, nhead=2, dim_feedforward=16, num_encoder_layers=1)
                self.input_emb = nn.Embedding(11, 8)
                self.decoder = nn.Linear(8, 11)
        return LM()

    ours, theirs = build(lockstep.nn), build(torch.nn)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert isinstance(ours.decoder, lockstep.nn.Linear)


def test_optimizer_signatures_and_a_disabled_grad_scaler():
    import inspect
    import lockstep
    params = inspect.signature(lockstep.optim.AdamW).parameters
    assert "fused" in params and params["lr"].default == 1e-3  # nanoGPT asks for fused
    assert params["betas"].default == (0.9, 0.999)
    p = lockstep.nn.Parameter(lockstep.ones(2))
    lockstep.optim.AdamW([p], lr=0.1, fused=False)
    scaler = lockstep.amp.GradScaler(enabled=False)
    loss = (p * p).sum()
    assert scaler.scale(loss) is loss and not scaler.is_enabled()
    with pytest.raises(lockstep.Error, match="float16"):
        lockstep.amp.GradScaler(enabled=True)


def _nanogpt_model_module(framework):
    """nanoGPT's model.py as a module of its own, under lockstep or (the same source) PyTorch."""
    import importlib.util
    names = ("lockstep", "lockstep.nn", "lockstep.nn.functional")
    saved = {n: sys.modules.get(n) for n in names}
    if framework == "pytorch":
        sys.modules.update(ports._pytorch_modules()[1])
    try:
        spec = importlib.util.spec_from_file_location(
            "nanogpt_model_" + framework, os.path.join(PORTS, "nanogpt", "model.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        for n in names:
            sys.modules.pop(n, None)
            if saved[n] is not None:
                sys.modules[n] = saved[n]


def test_nanogpt_generates_as_pytorch_does():
    # model.generate: crop to the block, the last position's logits, top-k by torch.topk and a
    # masked assignment, softmax, torch.multinomial, torch.cat. With top_k=1 the draw is the
    # argmax, so both frameworks must produce the same tokens from the same weights.
    import lockstep
    import torch
    ours_m, theirs_m = _nanogpt_model_module("lockstep"), _nanogpt_model_module("pytorch")
    cfg = dict(block_size=8, vocab_size=13, n_layer=2, n_head=2, n_embd=16, bias=True)
    theirs = theirs_m.GPT(theirs_m.GPTConfig(**cfg)).eval()
    ours = ours_m.GPT(ours_m.GPTConfig(**cfg)).eval()
    own = ours.state_dict()
    ours.load_state_dict({k: lockstep.from_numpy(v.numpy()) for k, v in
                          theirs.state_dict().items() if k in own})
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    got = ours.generate(lockstep.from_numpy(prompt), 12, temperature=0.9, top_k=1)
    want = theirs.generate(torch.from_numpy(prompt), 12, temperature=0.9, top_k=1)
    assert got.tolist() == want.tolist()
    sampled = ours.generate(lockstep.from_numpy(prompt), 5, top_k=4).numpy()
    assert sampled.shape == (2, 8) and sampled.min() >= 0 and sampled.max() < 13


@pytest.mark.parametrize("kw", [dict(), dict(nonlinearity="relu", num_layers=2),
                                dict(bidirectional=True, batch_first=True, num_layers=2)])
def test_rnn_matches_pytorch(kw):
    import lockstep
    import torch
    theirs, ours = torch.nn.RNN(3, 4, **kw), lockstep.nn.RNN(3, 4, **kw)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    ours.load_state_dict({k: lockstep.from_numpy(v.detach().numpy())
                          for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(2).standard_normal((5, 2, 3)).astype(np.float32)
    batch = 5 if kw.get("batch_first") else 2
    h0 = np.random.default_rng(3).standard_normal(
        (kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1), batch, 4))
    h0 = h0.astype(np.float32)
    tx = torch.from_numpy(x).requires_grad_()
    lx = lockstep.from_numpy(x).requires_grad_()
    tout, th = theirs(tx, torch.from_numpy(h0))
    lout, lh = ours(lx, lockstep.from_numpy(h0))
    np.testing.assert_allclose(lout.numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lh.numpy(), th.detach().numpy(), rtol=1e-5, atol=1e-6)
    ((tout * tout).sum() + th.sum()).backward()
    ((lout * lout).sum() + lh.sum()).backward()
    np.testing.assert_allclose(lx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-6)
    for (n, p), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=n)
    single, tsingle = ours(lx[:, 0]), theirs(tx[:, 0])  # unbatched, no initial state
    np.testing.assert_allclose(single[0].numpy(), tsingle[0].detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(lockstep.Error, match="nonlinearity"):
        lockstep.nn.RNN(3, 4, nonlinearity="sigmoid")
