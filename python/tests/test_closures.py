"""What a step closure sees (the values of the step it was added in, however far later steps were
traced), and that no closure error is lost: several are raised together, one at exit fails the
process with status 1."""
import threading

import pytest

import lockstep
from conftest import run_python


def test_a_closure_reads_its_own_steps_values_while_later_steps_are_queued():
    lockstep.set_max_queued_programs(16)
    try:
        release = threading.Event()
        w = lockstep.zeros(3)
        seen = []
        for i in range(4):
            with lockstep.step():
                w.add_(1.0)
                if i == 0:  # holds the runtime thread until the later steps are queued
                    lockstep.add_step_closure(release.wait)
                lockstep.add_step_closure(lambda: seen.append(w.tolist()[0]))
        release.set()
        lockstep.wait()
        assert seen == [1.0, 2.0, 3.0, 4.0]
    finally:
        lockstep.set_max_queued_programs(2)


def test_every_closure_error_before_a_blocking_point_is_raised():
    def fail(i):
        raise RuntimeError("closure %d failed" % i)

    for i in range(3):
        with lockstep.step():
            lockstep.add_step_closure(fail, args=(i,))
    with pytest.raises(RuntimeError) as info:
        lockstep.wait()
    for i in range(3):
        assert "closure %d failed" % i in str(info.value)
    lockstep.wait()  # raised once


def test_a_closure_error_surfacing_at_exit_fails_the_process():
    out = run_python(["-c", "import lockstep\n"
                      "def fail():\n    raise RuntimeError('late closure failed')\n"
                      "with lockstep.step():\n    lockstep.add_step_closure(fail)\n"])
    assert out.returncode == 1, out
    assert "late closure failed" in out.stderr


def test_a_step_dropped_without_exit_rolls_back_and_never_commits():
    import contextlib
    import gc
    w = lockstep.ones(2)
    stack = contextlib.ExitStack()
    stack.enter_context(lockstep.step())
    w.add_(1.0)
    stack.pop_all()  # the step's __exit__ will never run
    del stack
    gc.collect()
    assert not lockstep.in_step()
    assert w.tolist() == [1.0, 1.0]
    with lockstep.step():  # the next step works
        w.add_(1.0)
    assert w.tolist() == [2.0, 2.0]


def test_a_step_dropped_on_another_thread_rolls_back_on_its_own():
    w = lockstep.ones(2)
    s = lockstep.step()
    s.__enter__()
    w.add_(1.0)
    holder = [s._active.pop()]  # the native step object, about to die on another thread
    del s
    t = threading.Thread(target=holder.clear)
    t.start()
    t.join()
    lockstep.sync()  # this thread rolls the abandoned step back here
    assert not lockstep.in_step()
    assert w.tolist() == [1.0, 1.0]
