"""The cost of recording one op from Python against C++ (issue: recording from Python at most
1.5x C++ per op). Alternates, for `rounds` rounds, the C++ twin (bench/record_cost.cpp, a fresh
process) and these timeit loops in this process, each the best of 7 loops of 20,000 calls, as
timeit reports; prints per op the median over the rounds of each side's ns per call and of the
per-round ratios Python / C++.
  python3 bench/record_cost.py <record_cost executable> [rounds=5]
(scripts/bench-binding builds both sides and runs it.)"""
import statistics
import subprocess
import sys
import timeit

import lockstep

OPS = [("x + 1.0", "y = x + 1.0"), ("x + x", "y = x + x"), ("neg(x)", "y = neg(x)"),
       ("Linear", "y = linear(batch)")]
N, REPEATS = 20000, 7


def python_side():
    lockstep.manual_seed(0)
    env = {"x": lockstep.randn(64, 64), "batch": lockstep.randn(8, 64),
           "linear": lockstep.nn.Linear(64, 64), "neg": lockstep.neg}
    lockstep.sync()
    return {name: min(timeit.repeat(stmt, number=N, repeat=REPEATS, globals=env)) / N * 1e9
            for name, stmt in OPS}


def cpp_side(exe):
    out = subprocess.run([exe, str(N), str(REPEATS)], check=True, capture_output=True, text=True)
    return {name: float(ns) for name, ns in (line.split("\t") for line in out.stdout.splitlines())}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    exe, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
    runs = []
    for r in range(rounds):
        # Alternate which side goes first.
        if r % 2:
            py = python_side()
            cpp = cpp_side(exe)
        else:
            cpp = cpp_side(exe)
            py = python_side()
        runs.append((cpp, py))
    print("ns per op (median of %d rounds, each the best of %d loops of %d)" % (rounds, REPEATS, N))
    print("%-10s %8s %8s %8s" % ("op", "C++", "Python", "Py/C++"))
    for name, _ in OPS:
        cpp = statistics.median(c[name] for c, _ in runs)
        py = statistics.median(p[name] for _, p in runs)
        ratio = statistics.median(p[name] / c[name] for c, p in runs)
        print("%-10s %8.0f %8.0f %7.2fx" % (name, cpp, py, ratio))


if __name__ == "__main__":
    main()
