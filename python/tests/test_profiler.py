"""Step timelines (lockstep.profiler, lockstep-train --trace): the files are checked against the
Trace Event Format (fields, nesting per thread, process and thread names) and hold one
ProfilerStep#N per step, a compile with its reason first and cache hits after."""
import glob
import json
import os
import shutil
import subprocess

import pytest

import lockstep
import lockstep.nn.functional as F


def check_trace(path):
    """The events of a Chrome Trace Event file, after checking what viewers rely on."""
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    process_names, thread_names = {}, {}
    spans = {}
    for e in events:
        for field in ("ph", "ts", "pid", "tid", "name"):
            assert field in e, (field, e)
        assert isinstance(e["ts"], (int, float)) and e["name"]
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
            spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        elif e["ph"] == "M":
            if e["name"] == "process_name":
                process_names[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                thread_names[(e["pid"], e["tid"])] = e["args"]["name"]
        else:
            assert e["ph"] in ("B", "E", "i"), e
    for thread, intervals in spans.items():
        assert thread in thread_names, thread
        ends = []
        for begin, end in sorted(intervals, key=lambda s: (s[0], -s[1])):
            while ends and ends[-1] <= begin:
                ends.pop()
            assert not ends or end <= ends[-1], ("overlapping spans", thread, begin, end)
            ends.append(end)
    assert all(e["pid"] in process_names for e in events)
    return events, process_names, thread_names


def check_steps(events, site_part, min_steps):
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    assert len(steps) >= min_steps
    numbers = [int(e["name"].split("#")[1]) for e in steps]
    assert numbers == sorted(set(numbers))
    assert all(site_part in e["args"]["site"] for e in steps)

    def within(e, s):
        return (e["ph"] == "X" and e["tid"] == s["tid"] and e["ts"] >= s["ts"]
                and e["ts"] + e["dur"] <= s["ts"] + s["dur"])

    first = [e for e in events if e["name"] == "compile" and within(e, steps[0])]
    assert first and all(e["args"]["reason"] for e in first)
    later_hits = [e for e in events if e["name"] == "cache hit"
                  and any(within(e, s) for s in steps[2:])]
    later_compiles = [e for e in events if e["name"] == "compile"
                      and any(within(e, s) for s in steps[2:])]
    assert len(later_hits) >= len(steps) - 2 and not later_compiles
    names = {e["name"] for e in events}
    assert {"recording", "build graph", "execute", "memory"} <= names, names
    return steps


class Net(lockstep.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = lockstep.nn.Linear(12, 16)
        self.fc2 = lockstep.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(lockstep.relu(self.fc1(x)))


def test_trace_of_a_few_python_steps(tmp_path):
    lockstep.manual_seed(0)
    model = Net()
    opt = lockstep.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, t = lockstep.randn(6, 12), lockstep.tensor([0, 1, 2, 0, 1, 2])
    with lockstep.profiler.trace(tmp_path / "tr", level="fine") as tr:
        assert lockstep.profiler.enabled()
        for _ in range(4):
            with lockstep.profiler.record_function("my step"):
                with lockstep.step():
                    opt.zero_grad()
                    F.cross_entropy(model(x), t).backward()
                    opt.step()
    assert not lockstep.profiler.enabled()
    assert glob.glob(str(tmp_path / "tr" / "*")) == [tr.path]
    assert tr.path.endswith("-%d.trace.json" % os.getpid())
    events, processes, threads = check_trace(tr.path)
    assert list(processes) == [os.getpid()]
    check_steps(events, "test_profiler.py", 4)
    assert "lockstep runtime" in threads.values()
    assert sum(e["name"] == "my step" for e in events) == 4
    assert any(e.get("cat") == "kernel" and e["name"].startswith("mat_mul")
               and "gflop_per_s" in e["args"] for e in events)
    assert lockstep.profiler.stop() == ""
    with pytest.raises(lockstep.Error):
        lockstep.profiler.start(tmp_path, level="medium")


def train_exe():
    exe = os.environ.get("LOCKSTEP_TRAIN_EXE")
    assert exe, "LOCKSTEP_TRAIN_EXE is not set: run the tests through ctest"
    return exe


def test_lockstep_train_trace(tmp_path):
    r = subprocess.run(
        [train_exe(), "--model", "mlp", "--data", "fake", "--num-steps", "6", "--log-steps", "3",
         "--batch-size", "16", "--workers", "1", "--trace", str(tmp_path / "tr")],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert r.returncode == 0, r.stdout + r.stderr
    files = glob.glob(str(tmp_path / "tr" / "*.trace.json"))
    assert len(files) == 1 and "-rank" not in files[0], files
    events, processes, threads = check_trace(files[0])
    check_steps(events, "lockstep-train.cpp", 6)
    assert {"lockstep runtime", "main"} <= set(threads.values()), threads
    assert any(e["name"] == "step closures" for e in events)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")
def test_lockstep_train_trace_per_rank(tmp_path):
    r = subprocess.run(
        [train_exe(), "--nprocs", "2", "--model", "mlp", "--data", "fake", "--num-steps", "4",
         "--log-steps", "2", "--batch-size", "16", "--workers", "0",
         "--trace", str(tmp_path / "tr")],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    files = sorted(glob.glob(str(tmp_path / "tr" / "*.trace.json")))
    assert len(files) == 2 and [f.endswith("-rank%d.trace.json" % k)
                                for k, f in enumerate(files)] == [True, True], files
    pids = set()
    for rank, path in enumerate(files):
        events, processes, _ = check_trace(path)
        (pid, name), = processes.items()
        assert "-%d-rank%d." % (pid, rank) in os.path.basename(path)
        assert name.startswith("lockstep rank %d " % rank), name
        pids.add(pid)
        check_steps(events, "lockstep-train.cpp", 4)
        assert any(e["name"] == "collective wait" and e["args"]["bytes"] > 0 for e in events)
    assert len(pids) == 2
