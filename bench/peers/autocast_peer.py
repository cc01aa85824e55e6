#!/usr/bin/env python3
"""PyTorch's side of scripts/bench-bf16: torchvision's ResNet trained on a fixed fake batch, in
f32 or under torch.autocast('cpu', dtype=torch.bfloat16), SGD momentum 0.9, lr 0.01, 10 classes.

    autocast_peer.py <resnet50_96|resnet18> <timed_steps> <threads> <f32|bf16>

Prints the result line scripts/bench-bf16 reads (the same as bench/workloads.h's print_result):
    result <workload> torch-<precision> first_step_ms X img_per_s X
"""
import sys
import time

import torch
import torchvision

workload, steps, threads, precision = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(threads)
torch.manual_seed(0)
if workload == "resnet50_96":
    batch, size = 16, 96
    model = torchvision.models.resnet50(num_classes=10)  # ImageNet stem
elif workload == "resnet18":
    batch, size = 64, 32
    model = torchvision.models.resnet18(num_classes=10)
    # lockstep's small stem: a 3x3 stride-1 convolution and no max pooling.
    model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = torch.nn.Identity()
else:
    sys.exit(f"unknown workload {workload!r} (resnet50_96, resnet18)")
model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images = torch.randn(batch, 3, size, size)
labels = torch.randint(0, 10, (batch,))


def step():
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    opt.step()
    return loss


t0 = time.perf_counter()
step()
first_ms = (time.perf_counter() - t0) * 1e3
for _ in range(2):
    step()
t0 = time.perf_counter()
for _ in range(steps):
    loss = step()
s = time.perf_counter() - t0
print(f"loss {loss.item():.4f}")
print(f"result {workload} torch-{precision} first_step_ms {first_ms:.1f} img_per_s {steps * batch / s:.2f}")
