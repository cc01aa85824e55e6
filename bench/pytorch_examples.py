"""pytorch/examples' programs as ported in examples/pytorch/ (mnist, dcgan, vae), timed as their
users run them: the port itself, with lockstep, or unchanged with PyTorch eager (as_pytorch.py),
with its default arguments (one epoch, on random data of standins.py sized to the steps; DCGAN
with a batch of 16).
    python3 bench/pytorch_examples.py <ex_mnist|ex_dcgan|ex_vae> <lockstep|pytorch> [steps=10]
        [threads=2]
A step is one iteration of the program's training loop (one `with torch.step():`, data loading
and the program's own reads and prints included); the time of the last `steps` steps, after 4
first ones, to the end of the last (lockstep.wait()), divided by `steps`; prints "result
<program> <framework> ms <ms per step> first <first step ms> loss -" as bench/user_programs.py
does, for scripts/bench-programs. The programs are run as written: with BF16=1 there is
nothing to time (no result line).
"""
import os
import resource
import sys
import tempfile
import time

PROGRAMS = ["ex_mnist", "ex_dcgan", "ex_vae"]
if len(sys.argv) < 3 or sys.argv[1] not in PROGRAMS or sys.argv[2] not in ("lockstep", "pytorch"):
    sys.exit(__doc__)
NAME, FW = sys.argv[1], sys.argv[2]
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 10
THREADS = int(sys.argv[4]) if len(sys.argv) > 4 else 2
WARM = 4
if os.environ.get("BF16") == "1":
    sys.exit(0)

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "pytorch")
sys.path.insert(0, EXAMPLES)
import as_pytorch  # noqa: E402
import standins  # noqa: E402

if FW == "lockstep":
    import lockstep as base
    import lockstep.nn.functional  # noqa: F401
    import lockstep.nn.init  # noqa: F401
    import lockstep.optim.lr_scheduler  # noqa: F401
    step_type = base.step
else:
    import torch as base
    step_type = as_pytorch._Step
base.set_num_threads(THREADS)
entries, end = [], []
total = WARM + STEPS


class TimedStep:
    """The framework's step, noting when each is entered, and when the last one is done."""

    def __init__(self, *args, **kwargs):
        self._step = step_type(*args, **kwargs)

    def __enter__(self):
        entries.append(time.perf_counter())
        return self._step.__enter__()

    def __exit__(self, *exc):
        out = self._step.__exit__(*exc)
        if len(entries) == total:
            if FW == "lockstep":
                base.wait()
            end.append(time.perf_counter())
        return out


work = tempfile.mkdtemp()
os.makedirs(os.path.join(work, "run"))
os.chdir(os.path.join(work, "run"))
if NAME == "ex_mnist":
    argv = ["--epochs", "1", "--test-batch-size", "64"]
    standins.write_fake_mnist(os.path.join(work, "data"), train_size=total * 64, test_size=64)
elif NAME == "ex_vae":
    argv = ["--epochs", "1"]
    standins.write_fake_mnist(os.path.join(work, "data"), train_size=total * 128, test_size=128)
else:
    # A batch of 16, not 64: at 64 one step of DCGAN takes seconds on two cores.
    argv = ["--dataset", "fake", "--niter", "1", "--manualSeed", "1", "--outf", work,
            "--batchSize", "16"]
    defaults = standins.datasets.FakeData.__init__.__defaults__
    standins.datasets.FakeData.__init__.__defaults__ = (total * 16,) + defaults[1:]

path = os.path.join(EXAMPLES, NAME[3:] + ".py")
sys.argv = [path] + argv
devnull = open(os.devnull, "w")
with as_pytorch.framework(base, {"": {"step": TimedStep}}):
    stdout, sys.stdout = sys.stdout, devnull  # the programs' own lines
    try:
        import runpy
        runpy.run_path(path, run_name="__main__")
    finally:
        sys.stdout = stdout
assert len(entries) == total and end, (len(entries), total)
ms = (end[0] - entries[WARM]) / STEPS * 1000
first = (entries[1] - entries[0]) * 1000
print(f"result {NAME} {FW} ms {ms:.3f} first {first:.0f} t100 -1 rss_mb "
      f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} loss -")
