"""How the Python benchmarks (python_train.py, user_programs.py) time a training loop."""
import time


def time_steps(step, wait, steps, min_seconds=0.0):
    """Times one first step (compiles included), then three warm-up steps, then rounds of `steps`
    steps (`wait` after each) until `min_seconds` have passed, at least one round. Returns the
    first step's seconds, the milliseconds per timed step and the last step's result."""
    t0 = time.perf_counter()
    step()
    wait()
    first = time.perf_counter() - t0
    for _ in range(3):
        step()
    wait()
    t0, n = time.perf_counter(), 0
    while n == 0 or time.perf_counter() - t0 < min_seconds:
        for _ in range(steps):
            result = step()
        wait()
        n += steps
    return first, (time.perf_counter() - t0) * 1000 / n, result
