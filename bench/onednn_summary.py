#!/usr/bin/env python3
"""Sums a ONEDNN_VERBOSE=1 log by primitive: time per step and achieved GFLOP/s.

    ONEDNN_VERBOSE=1 build/release/bench/train_bench resnet50 12 2 > log.txt
    bench/onednn_summary.py log.txt 20

STEPS is how many times the training step ran in the log: train_bench resnet50 N runs it N + 8
times (warm-up, first step, idle-tracing steps); with LOCKSTEP_PROFILE=1 it is the `conv2d` count
divided by the model's convolutions (53 for ResNet-50). Convolution FLOPs are counted as direct
convolution over the padded problem (2 * mb * ic * oc * oh * ow * kh * kw), so Winograd
primitives and small padded maps show more GFLOP/s than they execute. A helper for reading
logs; lockstep does not need it.
"""
import collections
import re
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: onednn_summary.py LOG STEPS")
    steps = int(sys.argv[2])
    if steps <= 0:
        sys.exit("STEPS must be a positive count of step runs in the log")
    time = collections.defaultdict(float)
    flops = collections.defaultdict(float)
    calls = collections.defaultdict(int)
    with open(sys.argv[1]) as f:
        for line in f:
            p = line.strip().split(",")
            if len(p) < 6 or p[0] not in ("onednn_verbose", "dnnl_verbose") or p[1] != "exec":
                continue
            kind, impl, prop = p[3], p[4], p[5]
            key = (kind, impl, prop if kind == "convolution" else "")
            time[key] += float(p[-1])
            calls[key] += 1
            if kind == "convolution":
                d = p[-2]
                dim = lambda k: int(re.search(k + r"(\d+)", d).group(1))
                flops[key] += 2.0 * dim("mb") * dim("ic") * dim("oc") * dim("oh") * dim(
                    "ow") * dim("kh") * dim("kw")
    if not time:
        sys.exit("no oneDNN exec lines in the log (was it run with ONEDNN_VERBOSE=1?)")
    print(f"{'primitive':<58} {'calls':>6} {'ms/step':>8} {'GFLOP/s':>8}")
    for key in sorted(time, key=lambda k: -time[k]):
        name = " ".join(k for k in key if k)
        rate = f"{flops[key] / time[key] / 1e6:8.1f}" if flops[key] else ""
        print(f"{name:<58} {calls[key]:>6} {time[key] / steps:8.2f} {rate}")
    conv_ms = sum(t for k, t in time.items() if k[0] == "convolution")
    conv_flops = sum(flops.values())
    all_ms = sum(time.values()) / steps
    print(f"convolutions: {conv_ms / steps:.2f} ms/step, {conv_flops / steps / 1e9:.2f} "
          f"GFLOP/step, {conv_flops / conv_ms / 1e6:.1f} GFLOP/s; all primitives {all_ms:.2f} "
          "ms/step")

if __name__ == "__main__":
    main()
