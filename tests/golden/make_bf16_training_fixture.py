#!/usr/bin/python3
"""Writes bf16_training.safetensors, which golden_training_test.cpp reads: the MLP and the small
CNN of make_training_fixtures.py (same initial states and batches) trained 5 SGD-momentum steps
under torch.autocast('cpu', dtype=torch.bfloat16): each step's loss and the final f32 weights.

Run once with Debian's /usr/bin/python3 (python3-torch); the output is committed, so the tests
need no Python.
"""
import os

import torch
import torch.nn.functional as F

from make_safetensors_fixture import write_safetensors
from make_training_fixtures import MLP, SGD, STEPS, FashionCNN

HERE = os.path.dirname(os.path.abspath(__file__))


def run(prefix, make, x, y, out):
    torch.manual_seed(0)
    model = make()
    for k, v in model.state_dict().items():
        out[prefix + "init." + k] = v.clone()
    model.train()
    opt = torch.optim.SGD(model.parameters(), **SGD)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for k, v in model.state_dict().items():
        out[prefix + "sgd." + k] = v
    out[prefix + "x"] = x
    out[prefix + "y"] = y
    out[prefix + "sgd.losses"] = torch.tensor(losses, dtype=torch.float32)


def main():
    out = {}
    torch.manual_seed(1)
    x = torch.randn(8, 20)
    y = torch.randint(0, 5, (8,))
    run("mlp.", lambda: MLP([20, 32, 16, 5]), x, y, out)
    torch.manual_seed(2)
    x = torch.randn(8, 1, 8, 8)
    y = torch.randint(0, 10, (8,))
    run("cnn.", lambda: FashionCNN(10, 1, 8), x, y, out)
    meta = {"torch": torch.__version__, "sgd": repr(SGD), "steps": str(STEPS),
            "autocast": "cpu, torch.bfloat16"}
    write_safetensors(os.path.join(HERE, "bf16_training.safetensors"), out, meta)


if __name__ == "__main__":
    main()
