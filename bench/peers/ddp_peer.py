#!/usr/bin/python3
# PyTorch DDP (gloo) twin of bench/dist_bench.cpp: the same workloads (bench/workloads.h: MLP
# 784-1024-1024-10 batch 128, ResNet-18 small stem 32x32 batch 64, per rank), SGD momentum 0.9
# lr 0.01, one fixed random batch per rank, 3 warm-up steps, then timed steps. Rank 0 prints
#   result <workload> <mode> ranks R threads T img_per_s X step_ms S
#   ddp_peer.py <mlp|resnet18> [timed_steps=20] [threads=1] [ranks=1] [mode=ddp]
# mode: ddp (DistributedDataParallel), zero1 (DDP with torch.distributed.optim.
# ZeroRedundancyOptimizer: the optimizer's state sharded), fsdp2_grad_op (FSDP2's fully_shard
# with reshard_after_forward=False: gradients and state sharded, parameters gathered once per
# step, ZeRO-2's traffic) or fsdp2 (reshard_after_forward=True: ZeRO-3). The FSDP2 modes need
# PyTorch 2.6 or later.
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class ResNet18Small(nn.Module):
    """torchvision's resnet18 with lockstep's small stem (3x3 stride-1 conv, no max-pool)."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def worker(rank, world, workload, steps, threads, port, mode):
    torch.set_num_threads(threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    if workload == "mlp":
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10))
        batch = 128
        images = torch.randn(batch, 784)
    else:
        model = ResNet18Small()
        batch = 64
        images = torch.randn(batch, 3, 32, 32)
    labels = torch.randint(0, 10, (batch,))
    if mode.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard
        reshard = mode == "fsdp2"
        blocks = model.layers if workload != "mlp" else [m for m in model if isinstance(m, nn.Linear)]
        for block in blocks:
            fully_shard(block, reshard_after_forward=reshard)
        ddp = fully_shard(model, reshard_after_forward=reshard)
    else:
        ddp = nn.parallel.DistributedDataParallel(model)
    if mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.01,
                                      momentum=0.9)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    def train(n):
        for _ in range(n):
            opt.zero_grad()
            F.cross_entropy(ddp(images), labels).backward()
            opt.step()

    train(3)
    dist.barrier()
    t0 = time.perf_counter()
    train(steps)
    dist.barrier()
    took = time.perf_counter() - t0
    if rank == 0:
        print(f"result {workload} {mode} ranks {world} threads {threads} "
              f"img_per_s {batch * world * steps / took:.2f} step_ms {took * 1e3 / steps:.2f}",
              flush=True)
    dist.destroy_process_group()


def main():
    workload = sys.argv[1] if len(sys.argv) > 1 else "mlp"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    ranks = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    mode = sys.argv[5] if len(sys.argv) > 5 else "ddp"
    if mode not in ("ddp", "zero1", "fsdp2_grad_op", "fsdp2"):
        sys.exit(f"ddp_peer.py: mode is ddp, zero1, fsdp2_grad_op or fsdp2, not {mode!r}")
    port = 29500 + os.getpid() % 1000
    mp.spawn(worker, args=(ranks, workload, steps, threads, port, mode), nprocs=ranks, join=True)


if __name__ == "__main__":
    main()
