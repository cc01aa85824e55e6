#!/usr/bin/python3
"""Writes bf16.safetensors, which bf16_test.cpp reads: f32 values with rounding cases (ties,
subnormals, overflow, NaN) and PyTorch's bf16 of them ("round"), and PyTorch's bf16 results of
a few ops on bf16 inputs (PyTorch's elementwise CPU kernels widen to f32, compute, round; the
matmul is computed in f32 and rounded once).

Run once with Debian's /usr/bin/python3 (python3-torch); the output is committed.
"""
import os

import torch

from make_safetensors_fixture import write_safetensors

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    torch.manual_seed(6)
    cases = torch.tensor([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.3895e38, 3.4028e38,
                          -3.4028e38, 2**-133, 2**-134, 3 * 2**-134, 1e-40, float("inf"),
                          float("nan"), 0.1, -0.0, 65504.0, 1 / 3], dtype=torch.float32)
    a = torch.randn(4, 8).bfloat16()
    b = torch.randn(4, 8).bfloat16()
    w = torch.randn(8, 5).bfloat16()
    out = {"cases": cases, "round": cases.bfloat16(), "a": a, "b": b, "w": w,
           "add": a + b, "mul": a * b, "div": a / (b.abs() + 1), "exp": a.exp(),
           "tanh": a.tanh(),
           # f32 accumulation, rounded once (the definition); PyTorch 1.13's own bf16 matmul on
           # a CPU without AMX rounds partial sums and is off by up to 10% here.
           "matmul": (a.float() @ w.float()).bfloat16(), "sum": a.float().sum(1).bfloat16(),
           "to_f32": a.float()}
    path = os.path.join(HERE, "bf16.safetensors")
    write_safetensors(path, out, {"generator": "tests/golden/make_bf16_fixture.py",
                                  "torch": torch.__version__})


if __name__ == "__main__":
    main()
