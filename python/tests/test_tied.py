"""Weight tying (nanoGPT's `self.out.weight = self.tok.weight`): one parameter, listed once, handed
to the optimizer once, computed with by both layers, saved under both names, and loaded and
trained as PyTorch does."""
import numpy as np
import pytest
import torch

import lockstep
import lockstep.nn as nn

V, D, T, B = 11, 8, 5, 3


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, V, bias=False)
        self.out.weight = self.tok.weight

    def forward(self, idx):
        return self.out(self.norm(self.tok(idx)))


class TorchTiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(V, D)
        self.norm = torch.nn.LayerNorm(D)
        self.out = torch.nn.Linear(D, V, bias=False)
        self.out.weight = self.tok.weight

    def forward(self, idx):
        return self.out(self.norm(self.tok(idx)))


def test_a_tied_weight_is_one_parameter():
    m = TiedLM()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["tok.weight", "norm.weight", "norm.bias"]  # PyTorch's, in its order
    assert names == [n for n, _ in TorchTiedLM().named_parameters()]
    assert len(m.parameters()) == 3
    assert m.out.weight.is_same(m.tok.weight)
    sd = m.state_dict()
    assert list(sd) == list(TorchTiedLM().state_dict())  # both names, as PyTorch saves them
    assert sd["out.weight"].is_same(sd["tok.weight"])


def test_tied_training_matches_pytorch_and_round_trips_through_it():
    rng = np.random.default_rng(0)
    m, tm = TiedLM(), TorchTiedLM()
    tm.load_state_dict({k: torch.from_numpy(np.asarray(v.numpy()))
                        for k, v in m.state_dict().items()})
    assert tm.out.weight is tm.tok.weight  # PyTorch keeps its tie through the load
    opt = lockstep.optim.AdamW(m.parameters(), lr=1e-2)
    topt = torch.optim.AdamW(tm.parameters(), lr=1e-2)
    ours, theirs = [], []
    for _ in range(6):
        idx = rng.integers(0, V, size=(B, T))
        tgt = rng.integers(0, V, size=(B * T,))
        with lockstep.step():
            opt.zero_grad()
            logits = m(lockstep.tensor(idx))
            loss = nn.functional.cross_entropy(logits.reshape(B * T, V), lockstep.tensor(tgt))
            loss.backward()
            opt.step()
        ours.append(loss.item())
        topt.zero_grad()
        tl = torch.nn.functional.cross_entropy(tm(torch.from_numpy(idx)).reshape(B * T, V),
                                               torch.from_numpy(tgt))
        tl.backward()
        topt.step()
        theirs.append(tl.item())
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    # The trained embedding is what both names hold, in lockstep and loaded into PyTorch.
    sd = m.state_dict()
    np.testing.assert_array_equal(sd["out.weight"].numpy(), sd["tok.weight"].numpy())
    np.testing.assert_allclose(sd["tok.weight"].numpy(), tm.tok.weight.detach().numpy(),
                               rtol=1e-4, atol=1e-5)
    back = TorchTiedLM()
    back.load_state_dict({k: torch.from_numpy(np.asarray(v.numpy())) for k, v in sd.items()})
    np.testing.assert_array_equal(back.out.weight.detach().numpy(), sd["tok.weight"].numpy())


def test_loading_keeps_the_tie_and_a_reassigned_buffer_is_saved():
    m = TiedLM()
    state = {k: lockstep.tensor(np.full(v.shape, 0.5, np.float32))
             for k, v in m.state_dict().items()}
    m.load_state_dict(state)
    assert m.out.weight.is_same(m.tok.weight)
    assert m.out.weight.tolist()[0][0] == 0.5

    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", lockstep.zeros(1))

        def forward(self, x):
            self.count = self.count + 1
            return x

    w = WithBuffer()
    w(lockstep.ones(1))
    w(lockstep.ones(1))
    assert w.state_dict()["count"].tolist() == [2.0]
    assert [n for n, _ in w.named_buffers()] == ["count"]


def test_tying_in_cxx_names_what_is_not_there():
    m = TiedLM()
    with pytest.raises(lockstep.Error, match="has no parameter 'weights'; it has: weight"):
        m.out.set_parameter("weights", m.tok.weight)
    with pytest.raises(lockstep.Error, match="no child module 'outs'"):
        m.set_parameter("outs.weight", m.tok.weight)
    m.set_parameter("out.weight", lockstep.nn.Parameter(lockstep.zeros(V, D)))
    assert not m.out.weight.is_same(m.tok.weight)
    assert [n for n, _ in m.named_parameters()] == ["tok.weight", "norm.weight", "norm.bias",
                                                    "out.weight"]
