"""Modules subclassed in Python, state dicts by PyTorch's names, optimizers and checkpoints."""
import os

import numpy as np
import pytest

import lockstep
import lockstep.nn as nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.scale = nn.Parameter(lockstep.ones(1))
        self.register_buffer("seen", lockstep.zeros(1))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 8 * 8, 10))

    def forward(self, x):
        return self.head(lockstep.relu(self.bn(self.conv(x))) * self.scale)


def test_registration_by_attribute_names_as_torch():
    m = Block()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["scale", "conv.weight", "conv.bias", "bn.weight", "bn.bias",
                     "head.1.weight", "head.1.bias"]
    keys = list(m.state_dict().keys())
    assert "bn.running_mean" in keys and "seen" in keys and "bn.num_batches_tracked" in keys
    assert m.training
    m.eval()
    assert not m.training and not m.bn.training
    kinds = []
    m.apply(lambda mod: kinds.append(type(mod).__name__))
    # PyTorch's order: each child's subtree, then the module itself.
    assert kinds == ["Conv2d", "BatchNorm2d", "Flatten", "Linear", "Sequential", "Block"], kinds


def test_module_dict_names_its_children_as_torch():
    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleDict({"cls": nn.Linear(4, 3), "box": Block()})

        def forward(self, x):
            return self.heads["cls"](x)

    m = Heads()
    assert list(m.heads.keys()) == ["cls", "box"] and len(m.heads) == 2 and "box" in m.heads
    assert isinstance(m.heads["box"], Block)  # the Python object, forward and all
    names = [n for n, _ in m.named_parameters()]
    assert names[:2] == ["heads.cls.weight", "heads.cls.bias"] and "heads.box.scale" in names
    assert m(lockstep.ones(2, 4)).shape == (2, 3)
    with pytest.raises(KeyError):
        m.heads["nope"]
    with pytest.raises(lockstep.Error, match="already there"):
        m.heads["cls"] = nn.Linear(1, 1)


def test_the_cxx_helpers_bound_with_torchs_arguments():
    padded, mask, lengths = nn.pad_sequences([lockstep.ones(2, 3), lockstep.ones(4, 3)])
    assert padded.shape == (2, 4, 3) and lengths == [2, 4]
    assert mask.tolist() == [[False, False, True, True], [False] * 4]
    batch = nn.pad_token_batch([[1, 2, 3], [4]], buckets=[2, 8], pad_id=0)
    assert batch.padded.shape == (2, 8) and batch.padded.tolist()[1][:2] == [4, 0]
    assert nn.bucket_length(5, [4, 8]) == 8
    w = nn.init.kaiming_uniform_(lockstep.zeros(64, 32), mode="fan_in", nonlinearity="relu")
    bound = nn.init.calculate_gain("relu") * (3.0 / 32) ** 0.5
    assert 0 < float(w.abs().max()) <= bound
    assert nn.init.calculate_fan_in_and_fan_out(lockstep.zeros(8, 4, 3, 3)) == (36, 72)
    values, indices = nn.functional.max_pool2d_with_indices(
        lockstep.arange(16, dtype=lockstep.float32).reshape(1, 1, 4, 4), 2)
    assert values.tolist() == [[[[5.0, 7.0], [13.0, 15.0]]]]
    assert indices.tolist() == [[[[5, 7], [13, 15]]]]


def test_load_state_dict_round_trip_and_strictness():
    a, b = Block(), Block()
    b.load_state_dict(a.state_dict())
    x = lockstep.randn(2, 3, 8, 8)
    a.eval()
    b.eval()
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    bad = dict(a.state_dict())
    bad.pop("scale")
    with pytest.raises(lockstep.Error, match="scale"):
        b.load_state_dict(bad)


def test_resnet18_state_dict_has_torchvisions_names():
    torchvision = pytest.importorskip("torchvision")
    ours = list(lockstep.models.resnet18(num_classes=10).state_dict().keys())
    theirs = list(torchvision.models.resnet18(num_classes=10).state_dict().keys())
    assert sorted(ours) == sorted(theirs)


def test_checkpoint_with_optimizer_and_scheduler(tmp_path):
    m = Block()
    opt = lockstep.optim.SGD([{"params": m.parameters(), "lr": 0.05}], lr=0.1, momentum=0.9)
    sched = lockstep.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    x, t = lockstep.randn(2, 3, 8, 8), lockstep.tensor([1, 2])
    for _ in range(3):
        with lockstep.step():
            opt.zero_grad()
            lockstep.nn.functional.cross_entropy(m(x), t).backward()
            opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
    path = os.path.join(tmp_path, "ck.safetensors")
    lockstep.save_checkpoint(path, m, opt, sched, metadata={"epoch": 3})
    m2 = Block()
    opt2 = lockstep.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
    sched2 = lockstep.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    meta = lockstep.load_checkpoint(path, m2, opt2, sched2)
    assert meta["epoch"] == "3"
    assert sched2.last_epoch == 3
    for (n, p), (_, q) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert p.numpy().tobytes() == q.numpy().tobytes(), n


def test_training_matches_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 4)).astype(np.float32) * 0.3
    b0 = np.zeros(3, np.float32)
    xs = rng.standard_normal((8, 4)).astype(np.float32)
    ts = np.array([0, 1, 2, 0, 1, 2, 0, 1])

    lin = nn.Linear(4, 3)
    with lockstep.no_grad():
        lin.weight.copy_(lockstep.tensor(w0))
        lin.bias.copy_(lockstep.tensor(b0))
    opt = lockstep.optim.SGD(lin.parameters(), lr=0.5, momentum=0.9)
    ours = []
    for _ in range(5):
        with lockstep.step():
            opt.zero_grad()
            loss = lockstep.nn.functional.cross_entropy(lin(lockstep.tensor(xs)), lockstep.tensor(ts))
            loss.backward()
            opt.step()
        ours.append(loss.item())

    tl = torch.nn.Linear(4, 3)
    with torch.no_grad():
        tl.weight.copy_(torch.from_numpy(w0))
        tl.bias.copy_(torch.from_numpy(b0))
    topt = torch.optim.SGD(tl.parameters(), lr=0.5, momentum=0.9)
    theirs = []
    for _ in range(5):
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tl(torch.from_numpy(xs)), torch.from_numpy(ts))
        loss.backward()
        topt.step()
        theirs.append(loss.item())
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_device_loader_takes_any_iterable_of_numpy_arrays():
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((4, 3)).astype(np.float32), rng.integers(0, 2, 4))
               for _ in range(5)]
    lin = nn.Linear(3, 2)
    opt = lockstep.optim.SGD(lin.parameters(), lr=0.1)
    seen = []
    for x, t in lockstep.data.DeviceLoader(iter(batches)):
        assert x.dtype == lockstep.float32 and t.dtype == lockstep.int64
        seen.append(x.numpy())
        with lockstep.step():
            opt.zero_grad()
            lockstep.nn.functional.cross_entropy(lin(x), t).backward()
            opt.step()
    assert len(seen) == 5 and all(np.array_equal(a, b[0]) for a, b in zip(seen, batches))

    def failing():
        yield np.zeros(2, np.float32)
        raise OSError("the disk went away")

    got = []
    with pytest.raises(OSError, match="disk went away"):
        for b in lockstep.data.DeviceLoader(failing()):
            got.append(b)
    assert len(got) == 1
    # Leaving the loop early stops the background thread.
    for b in lockstep.data.DeviceLoader(iter([np.ones(1)] * 100)):
        break
