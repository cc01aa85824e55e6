"""pytorch/examples' mnist, dcgan and vae as ported in examples/pytorch/ (the diff against each
original is in its header): each runs as a script, and the same file, run by lockstep and by
PyTorch 1.13 (examples/pytorch/as_pytorch.py), gives the same losses over a few steps from the
same weights (PyTorch's initial state dict loaded into lockstep's model, or its weights_init
draws), the same data (standins.py) and the same random draws (PyTorch's, replayed to lockstep:
dropout masks, noise, the VAE's samples)."""
import importlib.util
import os
import sys

import numpy as np
import pytest

import lockstep
import lockstep.nn.functional  # noqa: F401 (as_pytorch.py reads the submodules as attributes)
import lockstep.nn.init  # noqa: F401
import lockstep.optim.lr_scheduler  # noqa: F401
from conftest import SOURCE_DIR, run_python

torch = pytest.importorskip("torch")

EXAMPLES = os.path.join(SOURCE_DIR, "examples", "pytorch")
sys.path.insert(0, EXAMPLES)
import as_pytorch  # noqa: E402
import standins  # noqa: E402


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A working directory whose ../data holds small random digits in MNIST's format (the
    programs read '../data')."""
    standins.write_fake_mnist(str(tmp_path / "data"), train_size=48, test_size=20)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    # The scripts run from there: the package's folder as an absolute path.
    package = os.path.dirname(os.path.dirname(os.path.abspath(lockstep.__file__)))
    monkeypatch.setenv("PYTHONPATH", package + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return work


def script(name, *args, cwd):
    r = run_python([os.path.join(EXAMPLES, name)] + list(args), cwd=str(cwd))
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


class Tape:
    """PyTorch's random draws, recorded in the PyTorch run and replayed in lockstep's."""

    def __init__(self):
        self.draws, self.at = [], 0

    def record(self, t):
        self.draws.append(t.detach().numpy().copy())
        return t

    def replay(self, shape):
        a = self.draws[self.at]
        self.at += 1
        assert tuple(a.shape) == tuple(shape), (a.shape, shape)
        return lockstep.from_numpy(a)


def overrides(fw, tape, losses):
    """Names put in front of the framework's for the run: the draws go through the tape, and
    the losses are kept (as tensors, read after the run)."""
    is_torch = fw is torch

    def randn(*size, **kw):
        size = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else size
        return tape.record(torch.randn(*size, **kw)) if is_torch else tape.replay(size)

    def randn_like(t):
        return tape.record(torch.randn_like(t)) if is_torch else tape.replay(t.shape)

    def normal_(t, mean=0.0, std=1.0):
        if is_torch:
            return tape.record(torch.nn.init.normal_(t, mean, std))
        with lockstep.no_grad():
            t.copy_(tape.replay(t.shape))
        return t

    class Dropout(fw.nn.Module):
        """PyTorch's dropout, with a mask drawn by PyTorch and replayed."""

        def __init__(self, p=0.5, inplace=False):
            super().__init__()
            self.p = p

        def forward(self, x):
            if not self.training:
                return x
            if is_torch:
                mask = tape.record((torch.rand(x.shape) >= self.p).float())
            else:
                mask = tape.replay(x.shape)
            return x * mask / (1 - self.p)

    def recording(fn):
        def record(*args, **kw):
            out = fn(*args, **kw)
            losses.append(out)
            return out
        return record

    base_bce = fw.nn.BCELoss

    def BCELoss(*args, **kw):
        return recording(base_bce(*args, **kw))

    return {"": {"randn": randn, "randn_like": randn_like},
            ".nn": {"Dropout": Dropout, "BCELoss": BCELoss},
            ".nn.init": {"normal_": normal_},
            ".nn.functional": {"nll_loss": recording(fw.nn.functional.nll_loss)}}


def load(name, fw, tape, losses, argv, run_name="port"):
    """Imports examples/pytorch/<name>.py with `lockstep` giving `fw` (lockstep or torch)."""
    path = os.path.join(EXAMPLES, name + ".py")
    old_argv = sys.argv
    sys.argv = [path] + argv
    try:
        with as_pytorch.framework(fw, overrides(fw, tape, losses)):
            spec = importlib.util.spec_from_file_location(run_name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    finally:
        sys.argv = old_argv
    return module


def values(losses):
    return np.array([float(l.item()) for l in losses])


def to_lockstep(state):
    return {k: lockstep.from_numpy(v.detach().numpy().copy()) for k, v in state.items()
            if not k.endswith("num_batches_tracked")}


def test_mnist_runs_as_a_script(data_dir):
    out = script("mnist.py", "--epochs", "1", "--batch-size", "16", "--test-batch-size", "10",
                 "--log-interval", "1", cwd=data_dir)
    assert out.count("Train Epoch: 1") == 3, out
    assert "Test set: Average loss" in out


def test_mnist_matches_pytorch(data_dir, monkeypatch):
    # Two epochs of 3 steps (Adadelta, StepLR between them) and the test pass after each.
    argv = ["--epochs", "2", "--batch-size", "16", "--test-batch-size", "10"]
    tape, runs = Tape(), {}
    for fw in (torch, lockstep):
        losses = []
        port = load("mnist", fw, tape, losses, argv)
        if fw is torch:
            start = port.Net()
            state = {k: v.clone() for k, v in start.state_dict().items()}
            port.Net = lambda: start
        else:
            net = port.Net

            def made():
                port.Net = net  # Net.__init__ reads the name Net (super(Net, self))
                model = net()
                port.Net = made
                model.load_state_dict(to_lockstep(state))
                return model
            port.Net = made
        with as_pytorch.framework(fw, overrides(fw, tape, losses)):
            monkeypatch.setattr(sys, "argv", ["mnist.py"] + argv)
            port.main()
        runs[fw.__name__] = values(losses)
    assert tape.at == len(tape.draws) > 0
    # 3 training losses (means) and 2 test sums per epoch.
    assert len(runs["torch"]) == len(runs["lockstep"]) == 10
    print(runs)  # with pytest -s: the losses compared
    np.testing.assert_allclose(runs["lockstep"], runs["torch"], rtol=1e-4)


def test_vae_runs_as_a_script(data_dir):
    out = script("vae.py", "--epochs", "1", "--batch-size", "16", "--log-interval", "1",
                 cwd=data_dir)
    assert out.count("Train Epoch: 1") == 3, out
    assert "====> Test set loss" in out
    assert os.path.exists(data_dir / "results" / "sample_1.npy")


def test_vae_matches_pytorch(data_dir):
    argv = ["--epochs", "1", "--batch-size", "16"]
    tape, runs = Tape(), {}
    for fw in (torch, lockstep):
        losses = []
        port = load("vae", fw, tape, losses, argv)
        if fw is torch:
            state = {k: v.clone() for k, v in port.model.state_dict().items()}
        else:
            port.model.load_state_dict(to_lockstep(state))
        inner = port.loss_function

        def loss_function(*args, inner=inner, losses=losses):
            loss = inner(*args)
            losses.append(loss)
            return loss
        port.loss_function = loss_function
        with as_pytorch.framework(fw, overrides(fw, tape, losses)):
            for epoch in (1, 2):
                port.train(epoch)
                port.test(epoch)
        runs[fw.__name__] = values(losses)
    assert tape.at == len(tape.draws) > 0
    assert len(runs["torch"]) == len(runs["lockstep"]) == 2 * (3 + 2)
    print(runs)  # with pytest -s: the losses compared
    np.testing.assert_allclose(runs["lockstep"], runs["torch"], rtol=1e-4)


DCGAN = ["--dataset", "fake", "--batchSize", "4", "--nz", "8", "--ngf", "4", "--ndf", "4",
         "--manualSeed", "1", "--niter", "1"]


def test_dcgan_runs_as_a_script(data_dir):
    out = script("dcgan.py", *DCGAN, "--dry-run", "--outf", str(data_dir / "out"), cwd=data_dir)
    assert out.count("Loss_D") == 1, out
    assert os.path.exists(data_dir / "out" / "netG_epoch_0.pth")


def test_dcgan_matches_pytorch(data_dir, monkeypatch):
    # 4 iterations of both updates on 16 fake images (the dataset's size made small).
    monkeypatch.setattr(standins.datasets.FakeData.__init__, "__defaults__",
                        (16,) + standins.datasets.FakeData.__init__.__defaults__[1:])
    tape, runs = Tape(), {}
    for fw in (torch, lockstep):
        losses = []
        load("dcgan", fw, tape, losses, DCGAN + ["--outf", str(data_dir / fw.__name__)])
        runs[fw.__name__] = values(losses)
    assert tape.at == len(tape.draws) > 0
    # errD_real, errD_fake, errG per iteration.
    assert len(runs["torch"]) == len(runs["lockstep"]) == 3 * 4
    print(runs)  # with pytest -s: the losses compared
    np.testing.assert_allclose(runs["lockstep"], runs["torch"], rtol=1e-4)


# ---- the names the ports needed, against PyTorch ----------------------------------------------

def test_adadelta_with_step_lr_matches_pytorch():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 5)).astype(np.float32), rng.integers(0, 3, 8)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    model = lockstep.nn.Sequential(lockstep.nn.Linear(5, 4), lockstep.nn.Tanh(),
                                   lockstep.nn.Linear(4, 3))
    model.load_state_dict(to_lockstep(ref.state_dict()))
    for kw in ({}, {"lr": 0.5, "rho": 0.8, "eps": 1e-5, "weight_decay": 0.02}):
        opt_t = torch.optim.Adadelta(ref.parameters(), **kw)
        opt_l = lockstep.optim.Adadelta(model.parameters(), **kw)
        sched_t = torch.optim.lr_scheduler.StepLR(opt_t, step_size=2, gamma=0.7)
        sched_l = lockstep.optim.lr_scheduler.StepLR(opt_l, step_size=2, gamma=0.7)
        for _ in range(5):
            opt_t.zero_grad()
            torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)),
                                              torch.from_numpy(y)).backward()
            opt_t.step()
            sched_t.step()
            with lockstep.step():
                opt_l.zero_grad()
                lockstep.nn.functional.cross_entropy(model(lockstep.from_numpy(x)),
                                                     lockstep.from_numpy(y)).backward()
                opt_l.step()
            sched_l.step()
        assert opt_l.param_groups[0]["lr"] == pytest.approx(opt_t.param_groups[0]["lr"])
        for (k, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
        state = opt_l.state_dict()
        np.testing.assert_allclose(state["0.acc_delta"].numpy(),
                                   opt_t.state[ref[0].weight]["acc_delta"].numpy(), rtol=1e-4,
                                   atol=1e-9)
    assert lockstep.optim.Adadelta(model.parameters()).lr == 1.0  # PyTorch's default
    with pytest.raises(lockstep.Error, match="rho"):
        lockstep.optim.Adadelta(model.parameters(), rho=1.5)
    with pytest.raises(lockstep.Error, match="eps"):
        lockstep.optim.Adadelta(model.parameters(), eps=-1.0)


def test_binary_cross_entropy_matches_pytorch():
    p = np.array([[0.0, 1.0, 0.25], [0.9, 0.5, 1e-3]], np.float32)
    t = np.array([[1.0, 0.0, 0.0], [1.0, 0.3, 0.7]], np.float32)
    w = np.array([1.0, 2.0, 0.5], np.float32)
    for reduction in ("mean", "sum", "none"):
        for weight in (None, w):
            pt = torch.tensor(p, requires_grad=True)
            pl = lockstep.from_numpy(p).requires_grad_()
            want = torch.nn.functional.binary_cross_entropy(
                pt, torch.from_numpy(t), None if weight is None else torch.from_numpy(weight),
                reduction=reduction)
            got = lockstep.nn.functional.binary_cross_entropy(
                pl, lockstep.from_numpy(t), None if weight is None else lockstep.from_numpy(weight),
                reduction=reduction)
            np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5)
            want.sum().backward()
            got.sum().backward()
            # PyTorch's gradient divides by max(x (1 - x), 1e-12); where a log is clamped (x = 0
            # with t = 1, x = 1 with t = 0) lockstep's passes 0. Elsewhere they agree.
            inside = (p > 0) & (p < 1)
            np.testing.assert_allclose(pl.grad.numpy()[inside], pt.grad.numpy()[inside],
                                       rtol=1e-4)
    loss = lockstep.nn.BCELoss(reduction="sum")
    np.testing.assert_allclose(
        loss(lockstep.from_numpy(p), lockstep.from_numpy(t)).item(),
        torch.nn.BCELoss(reduction="sum")(torch.from_numpy(p), torch.from_numpy(t)).item(),
        rtol=1e-6)
    with pytest.raises(lockstep.Error, match="binary_cross_entropy"):
        lockstep.nn.functional.binary_cross_entropy(lockstep.from_numpy(p),
                                                    lockstep.zeros(3, 2))


def test_inplace_flags_view_as_and_device_flags_as_pytorch():
    x = lockstep.from_numpy(np.array([-1.0, 2.0], np.float32))
    for m in (lockstep.nn.LeakyReLU(0.2, inplace=True), lockstep.nn.ReLU(True),
              lockstep.nn.ELU(inplace=True), lockstep.nn.Dropout(0.5, inplace=True).eval()):
        m(x)
    np.testing.assert_allclose(lockstep.nn.LeakyReLU(0.2, inplace=True)(x).numpy(), [-0.2, 2.0])
    np.testing.assert_allclose(x.numpy(), [-1.0, 2.0])  # out of place, as every lockstep op
    assert x.view_as(lockstep.zeros(2, 1)).shape == (2, 1)
    assert x.reshape_as(lockstep.zeros(1, 2)).shape == (1, 2)
    assert not x.is_cuda and not x.is_xpu and not x.is_mps
