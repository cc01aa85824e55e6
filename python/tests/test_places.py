"""The user's .py line, named by one frames hook (no binding passes a place): in errors, graph
dumps, cache-miss explanations and per-site metrics, for ops recorded from Python functions,
modules, step closures on the runtime thread and Python threads; blocking calls that release the
GIL name their line too, and C++ loader threads record without Python."""
import threading

import pytest

import lockstep
import lockstep.nn.functional as F


def line_of(marker):
    return [i for i, s in enumerate(open(__file__), 1) if s.rstrip().endswith("# " + marker)][0]


def here(marker):
    return "test_places.py:%d" % line_of(marker)


def test_every_node_of_a_dump_names_the_line_that_recorded_it():
    x = lockstep.randn(3, 3)
    lockstep.sync()
    y = x * 2.0 + 1  # SCALARS
    z = y.clamp_min(0.5).sum()  # COMPOSITE
    lockstep.sync()
    lockstep.wait()
    text = lockstep.debug.last_graph_text()
    nodes = [line for line in text.splitlines() if " = " in line]
    scalars = [line for line in nodes if "scalar(" in line]
    assert scalars and all(here("SCALARS") in s or here("COMPOSITE") in s for s in scalars), text
    assert any(here("COMPOSITE") in line for line in nodes if "sum" in line or "reduce" in line), text
    assert "python/src" not in text and "src/tensor" not in text, text
    del z


def test_a_training_steps_nodes_name_only_python_lines():
    # Layers, loss, backward and the optimizer's update (recorded inside lockstep, some by its
    # public headers' operators) all name the user's lines; shapes no other test records.
    model = lockstep.nn.Linear(7, 5)
    opt = lockstep.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, t = lockstep.randn(13, 7), lockstep.randint(0, 5, (13,))
    lockstep.sync()
    with lockstep.step():
        loss = F.cross_entropy(model(x), t)
        loss.backward()
        opt.step()
    lockstep.wait()
    text = lockstep.debug.last_graph_text()
    places = [line.split("  # ")[1] for line in text.splitlines() if "  # " in line]
    assert places and all(p.split(",")[0].split(":")[0] == __file__ for p in places), text


def test_blocking_calls_name_their_line_in_the_sites():
    lockstep.metrics.reset()
    x = lockstep.ones(2) * 3
    x.sum().item()  # READ
    lockstep.sync()  # SYNC
    with lockstep.step():  # STEP
        (x * 2).sum()
    lockstep.wait()
    sites = [s["site"] for s in lockstep.debug.sites()]
    assert any(s.startswith("item at ") and s.endswith(here("READ")) for s in sites), sites
    assert any(s.startswith("sync at ") and s.endswith(here("SYNC")) for s in sites), sites
    assert any(s.startswith("step at ") and s.endswith(here("STEP")) for s in sites), sites


def test_errors_in_a_builtin_layer_name_the_call_and_in_a_python_forward_its_line():
    with pytest.raises(lockstep.Error, match=here("LAYER CALL")):
        lockstep.nn.Linear(3, 4)(lockstep.ones(2, 5))  # LAYER CALL

    class Net(lockstep.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = lockstep.nn.Linear(3, 4)

        def forward(self, x):
            return x @ lockstep.ones(5, 5)  # IN FORWARD

    with pytest.raises(lockstep.Error, match=here("IN FORWARD")):
        Net()(lockstep.ones(2, 3))


def test_a_step_closure_on_the_runtime_thread_records_at_its_own_line():
    seen = []

    def closure():
        seen.append(threading.get_ident())
        lockstep.ones(2, 3) @ lockstep.ones(4, 5)  # IN CLOSURE

    with lockstep.step():
        lockstep.ones(2).sum()
        lockstep.add_step_closure(closure)
    with pytest.raises(lockstep.Error, match=here("IN CLOSURE")):
        lockstep.wait()
    assert seen and seen[0] != threading.get_ident()


def test_python_threads_record_at_their_own_lines():
    errors = []

    def work():
        try:
            lockstep.ones(2, 3) @ lockstep.ones(4, 5)  # IN THREAD
        except lockstep.Error as e:
            errors.append(str(e))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 3 and all(here("IN THREAD") in e for e in errors), errors


def test_loader_threads_record_without_python():
    # Worker threads of the C++ loader upload batches without the GIL: the hook must not look at
    # Python's frames from them (a crash or a hang if it did).
    ds = lockstep.data.dataset("fake", shape=(1, 4, 4), num_classes=3, size=64)
    loader = lockstep.data.DataLoader(ds, batch_size=8, num_workers=2)
    total = 0
    for images, labels in loader:
        total += int(labels.numel())
    assert total == 64


def test_a_cache_miss_names_the_line_of_a_scalar_operand():
    for dtype in (lockstep.float32, lockstep.float64):
        with lockstep.step():
            y = lockstep.ones(3, dtype=dtype) * 2.0  # DTYPE CHANGES
            y.sum()
    lockstep.wait()
    miss = lockstep.debug.last_cache_miss()
    assert here("DTYPE CHANGES") in miss["where"], miss["text"]


def test_functional_and_methods_agree():
    x = lockstep.tensor([-1.0, 0.5, 2.0])
    assert x.clamp_min(0.0).tolist() == lockstep.clamp_min(x, 0.0).tolist() == [0.0, 0.5, 2.0]
    assert x.clamp_max(1.0).tolist() == lockstep.clamp_max(x, 1.0).tolist() == [-1.0, 0.5, 1.0]
    assert lockstep.clamp(x, min=lockstep.zeros(3), max=lockstep.ones(3)).tolist() == [0, 0.5, 1]
    assert F.relu(x).tolist() == x.relu().tolist()
    assert x.reshape(3, 1).shape == x.view((3, 1)).shape == (3, 1)
    assert x.expand(2, -1).shape == (2, 3)
    assert lockstep.ones(2, 3).T.shape == (3, 2) and lockstep.ones(2, 3).t().shape == (3, 2)
    assert lockstep.ones(4, 2, 3).mT.shape == (4, 3, 2)
    assert x.contiguous() is x
    assert x.type_as(lockstep.zeros(1, dtype=lockstep.float64)).dtype == lockstep.float64
