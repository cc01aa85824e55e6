"""Native code for the cpu backend's fused trees (src/backends/cpu/native.h), end to end: a
training run whose trees run as native code, compiled before the first step, from the cache, or
in the background while the interpreter runs them and switched over mid-run, gives the losses and
weights of a run on the interpreter bit for bit; a compiler that is missing leaves the interpreter
and says so once."""
import os
import re

from conftest import run_python

PROGRAM = """
import sys, time, lockstep as ls
import lockstep.nn as nn
ls.manual_seed(0)
model = nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.LayerNorm(96), nn.Linear(96, 96),
                      nn.Tanh(), nn.Linear(96, 10))
opt = ls.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
x = ls.randn(64, 48)
y = ls.randint(0, 10, [64])
losses = []
def step():
    with ls.step():
        opt.zero_grad()
        h = model(x)
        loss = nn.functional.cross_entropy(h * ls.sigmoid(h), y)
        loss.backward()
        opt.step()
    losses.append(loss)
steps, until_native = int(sys.argv[1]), int(sys.argv[2])
for _ in range(steps):
    step()
if until_native:  # on until the background compiles are loaded, then a few steps more
    start = time.time()
    while ls.metrics.counter("native_trees") < until_native and time.time() - start < 120:
        step()
        ls.sync()
    before = len(losses)
    for _ in range(5):
        step()
    print("switched after", before)
print("steps", len(losses))
print("losses", " ".join(repr(l.item()) for l in losses))
print("weights", " ".join(repr(p.sum().item()) for p in model.parameters()))
print("native_trees", ls.metrics.counter("native_trees"))
print("native_compiles", ls.metrics.counter("native_compiles"))
"""


def train(tmp_path, mode, steps, until_native=0, cache="cache", **env):
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    old = dict(os.environ)
    os.environ.update(LOCKSTEP_NATIVE=mode, LOCKSTEP_NATIVE_DIR=str(tmp_path / cache), **env)
    try:
        r = run_python([str(script), str(steps), str(until_native)])
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert r.returncode == 0, r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    return out, r.stderr


def test_native_code_trains_bit_for_bit_as_the_interpreter(tmp_path):
    want, _ = train(tmp_path, "0", 20)
    assert want["native_trees"] == "0"
    got, _ = train(tmp_path, "sync", 20)
    assert int(got["native_trees"]) > 10 and int(got["native_compiles"]) >= 1
    assert (got["losses"], got["weights"]) == (want["losses"], want["weights"])
    # The second run loads what the first compiled.
    again, _ = train(tmp_path, "sync", 20)
    assert again["native_compiles"] == "0" and again["native_trees"] == got["native_trees"]
    assert (again["losses"], again["weights"]) == (want["losses"], want["weights"])


def test_a_background_compile_switches_trees_mid_run_without_changing_a_value(tmp_path):
    trees = int(train(tmp_path, "sync", 1, cache="sync")[0]["native_trees"])
    got, _ = train(tmp_path, "auto", 3, until_native=trees)
    assert got["native_trees"] == str(trees)
    switched = int(got["switched"].split()[-1])
    assert switched >= 3
    want, _ = train(tmp_path, "0", int(got["steps"]))
    assert (got["losses"], got["weights"]) == (want["losses"], want["weights"])


def test_a_missing_compiler_leaves_the_interpreter_and_says_so_once(tmp_path):
    want, _ = train(tmp_path, "0", 10)
    got, err = train(tmp_path, "sync", 10, LOCKSTEP_NATIVE_CXX=str(tmp_path / "no-such-c++"))
    assert got["native_trees"] == "0"
    assert len(re.findall("no native code for fused elementwise trees", err)) == 1, err
    assert "could not start" in err and "no-such-c++" in err
    assert (got["losses"], got["weights"]) == (want["losses"], want["weights"])


def test_a_compile_running_at_exit_completes_the_cache_for_the_next_run(tmp_path):
    import time
    want, _ = train(tmp_path, "0", 2)
    first, _ = train(tmp_path, "auto", 1)  # exits while its compiles run (or are queued)
    cache = tmp_path / "cache"
    deadline = time.time() + 120
    while time.time() < deadline and not list(cache.glob("*.so")):
        time.sleep(0.2)
    # The program's first module (its initialization) was compiling at exit: it is in place,
    # with no temporary file left beside it once the compiler is done.
    assert list(cache.glob("*.so")), list(cache.iterdir())
    while time.time() < deadline and list(cache.glob("*.*.*.cpp")):
        time.sleep(0.2)
    assert not list(cache.glob("*.*.*")), list(cache.iterdir())
    again, _ = train(tmp_path, "auto", 2)
    assert int(again["native_trees"]) > 0
    assert (again["losses"], again["weights"]) == (want["losses"], want["weights"])
