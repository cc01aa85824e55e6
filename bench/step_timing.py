"""How the Python benchmarks (python_train.py, user_programs.py) time a training loop."""
import time


def time_steps(step, wait, steps, min_seconds=0.0, warmup=3, first_n=0):
    """Times one first step (compiles included), then, with first_n, the steps up to first_n
    (the time from the first step's start to the end of step first_n), then `warmup` steps, then
    rounds of `steps` steps (`wait` after each) until `min_seconds` have passed, at least one
    round. Returns the first step's seconds, the seconds to the end of step first_n (0 without
    it), the milliseconds per timed step and the last step's result."""
    t0 = time.perf_counter()
    step()
    wait()
    first = time.perf_counter() - t0
    to_n = 0.0
    if first_n > 1:
        for _ in range(first_n - 1):
            step()
        wait()
        to_n = time.perf_counter() - t0
    for _ in range(warmup):
        step()
    wait()
    t0, n = time.perf_counter(), 0
    while n == 0 or time.perf_counter() - t0 < min_seconds:
        for _ in range(steps):
            result = step()
        wait()
        n += steps
    return first, to_n, (time.perf_counter() - t0) * 1000 / n, result
