"""The names and behaviours a PyTorch user reaches for: in-place variants, named-tuple returns,
schedulers with lambdas and of schedulers, per-group lrs, integer counters, nn.utils clipping,
lockstep.Error by its name, advice spelled in Python, a short hint for a NumPy array."""
import numpy as np
import pytest
import torch

import lockstep
import lockstep.nn as nn


def test_in_place_variants_change_every_handle_and_return_the_tensor():
    x = lockstep.tensor([-2.0, -0.5, 0.5, 3.0])
    alias = x
    assert x.clamp_(-1, 1) is x
    assert alias.tolist() == [-1.0, -0.5, 0.5, 1.0]
    x.abs_().mul_(2).sqrt_()
    np.testing.assert_allclose(x.tolist(), np.sqrt([2.0, 1.0, 1.0, 2.0]), rtol=1e-6)
    y = lockstep.tensor([[1.0, 2.0], [3.0, 4.0]])
    y.masked_fill_(y > 2, 0.0).neg_()
    assert y.tolist() == [[-1.0, -2.0], [0.0, 0.0]]
    z = lockstep.zeros(1000)
    z.uniform_(2.0, 3.0)
    assert 2.0 <= min(z.tolist()) and max(z.tolist()) <= 3.0
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    for name, args in [("tril_", ()), ("pow_", (2,)), ("exp_", ()), ("relu_", ()),
                       ("sigmoid_", ()), ("fmod_", (1.5,)), ("cumsum_", (1,))]:
        ours = lockstep.tensor(t.numpy())
        getattr(ours, name)(*args)
        theirs = t.clone()
        getattr(theirs, name)(*args)
        np.testing.assert_allclose(ours.tolist(), theirs.tolist(), rtol=1e-6, err_msg=name)


def test_values_and_indices_are_named_tuples():
    x = lockstep.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
    for r, (v, i) in [(x.max(1), (x.max(1))), (x.topk(2), x.topk(2)), (x.sort(1), x.sort(1)),
                      (lockstep.min(x, dim=0), lockstep.min(x, dim=0))]:
        assert r.values.tolist() == v.tolist() and r.indices.tolist() == i.tolist()
    assert x.max(1).values.tolist() == [3.0, 5.0] and x.max(1).indices.tolist() == [0, 1]
    assert type(x.topk(1)).__name__ == "topk"


def _lrs(make, steps=8, groups=2):
    ps = [lockstep.zeros(2, requires_grad=True) for _ in range(groups)]
    tps = [torch.zeros(2, requires_grad=True) for _ in range(groups)]
    opt = lockstep.optim.SGD([{"params": [p], "lr": 0.1 * (i + 1)} for i, p in enumerate(ps)],
                             lr=0.1)
    topt = torch.optim.SGD([{"params": [p], "lr": 0.1 * (i + 1)} for i, p in enumerate(tps)],
                           lr=0.1)
    s, ts = make(lockstep.optim.lr_scheduler, opt), make(torch.optim.lr_scheduler, topt)
    ours, theirs = [], []
    for _ in range(steps):
        ours.append(s.get_last_lr())
        theirs.append(ts.get_last_lr())
        topt.step()
        s.step()
        ts.step()
    return ours, theirs


@pytest.mark.parametrize("make", [
    lambda m, o: m.LambdaLR(o, lambda e: 0.9 ** e),
    lambda m, o: m.LambdaLR(o, [lambda e: 1.0 / (e + 1), lambda e: 0.5]),
    lambda m, o: m.MultiplicativeLR(o, lambda e: 0.8),
    lambda m, o: m.SequentialLR(o, [m.LinearLR(o, start_factor=0.25, total_iters=3),
                                    m.ExponentialLR(o, gamma=0.7)], milestones=[3]),
    lambda m, o: m.ChainedScheduler([m.StepLR(o, step_size=2, gamma=0.5),
                                     m.ExponentialLR(o, gamma=0.9)]),
    lambda m, o: m.StepLR(o, step_size=3),
], ids=["lambda", "lambda-per-group", "multiplicative", "sequential", "chained", "step"])
def test_schedulers_give_pytorchs_lr_for_every_group(make):
    ours, theirs = _lrs(make)
    assert len(ours[0]) == 2
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)


def test_step_count_is_an_integer_and_nn_utils_clips():
    p = lockstep.ones(3, requires_grad=True)
    opt = lockstep.optim.SGD([p], lr=0.1)
    for _ in range(3):
        with lockstep.step():
            opt.zero_grad()
            (p * lockstep.tensor([30.0, 40.0, 0.0])).sum().backward()
            norm = nn.utils.clip_grad_norm_(iter([p]), 5.0)
            opt.step()
    assert opt.step_count == 3 and isinstance(opt.step_count, int)
    assert abs(norm.item() - 50.0) < 1e-4
    np.testing.assert_allclose(p.tolist(), [1 - 3 * 0.1 * 3, 1 - 3 * 0.1 * 4, 1.0], rtol=1e-5)
    q = lockstep.ones(2, requires_grad=True)
    (q * lockstep.tensor([5.0, -0.5])).sum().backward()
    nn.utils.clip_grad_value_([q], 1.0)
    assert q.grad.tolist() == [1.0, -0.5]


def test_errors_are_lockstep_errors_spelled_for_python():
    assert repr(lockstep.Error) == "<class 'lockstep.Error'>"
    with pytest.raises(lockstep.Error) as e:
        nn.functional.cross_entropy(lockstep.randn(4, 3), lockstep.tensor([0.0, 1.0, 2.0, 0.0]))
    msg = str(e.value)
    assert "ls::" not in msg and "lockstep.int64" in msg, msg
    assert "targets.to(lockstep.int64)" in msg or ".to(lockstep.int64)" in msg, msg


def test_a_numpy_array_given_to_a_module_names_the_conversion():
    lin = nn.Linear(3, 2)
    with pytest.raises(TypeError, match=r"Linear\(\): argument 1 is a NumPy ndarray, not a "
                                        r"lockstep.Tensor; convert it with lockstep.from_numpy"):
        lin(np.ones((1, 3), np.float32))
    with pytest.raises(TypeError, match="lockstep.from_dlpack"):
        lin(torch.ones(1, 3))
