#!/usr/bin/python3
"""Writes optim.safetensors, which optim_golden_test.cpp reads: for a small model (Linear 6->5,
tanh, Linear 5->3) on one fixed batch, the initial state and the state after 5 steps of each
optimizer configuration below (PyTorch's RMSprop, Adagrad, Adadelta; Lion as its paper defines it; SGD
and AdamW with parameter groups), and the learning rates (and momenta) PyTorch's schedulers
give over their first steps.

Run once with Debian's /usr/bin/python3 (python3-torch); the output is committed.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from make_safetensors_fixture import write_safetensors

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 5


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023), as lion-pytorch writes it."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                b1, b2 = group["betas"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m * b1 + p.grad * (1 - b1)), alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


def make_model():
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def groups(model, lr, wd):
    """Weights decayed at `wd` with the optimizer's lr; biases in their own group, lr / 2, no
    decay."""
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights, "weight_decay": wd}, {"params": biases, "lr": lr / 2,
                                                     "weight_decay": 0.0}]


CONFIGS = {
    "rmsprop": lambda m: torch.optim.RMSprop(m.parameters(), lr=1e-2),
    "rmsprop_centered": lambda m: torch.optim.RMSprop(m.parameters(), lr=1e-2, centered=True,
                                                      momentum=0.9, weight_decay=0.01),
    "adagrad": lambda m: torch.optim.Adagrad(m.parameters(), lr=0.1, lr_decay=0.01,
                                             weight_decay=0.02, initial_accumulator_value=0.1),
    "lion": lambda m: Lion(m.parameters(), lr=1e-3, weight_decay=0.1),
    "adadelta": lambda m: torch.optim.Adadelta(m.parameters()),
    "adadelta_decay": lambda m: torch.optim.Adadelta(m.parameters(), lr=0.5, rho=0.8, eps=1e-5,
                                                     weight_decay=0.02),
    "sgd_groups": lambda m: torch.optim.SGD(groups(m, 0.1, 0.01), lr=0.1, momentum=0.9),
    "adamw_groups": lambda m: torch.optim.AdamW(groups(m, 1e-2, 0.1), lr=1e-2),
}


def schedules():
    out = {}
    p = [torch.zeros(1, requires_grad=True)]

    def run(opt, sched, n, momentum=None):
        lrs, ms = [], []
        for _ in range(n):
            lrs.append(opt.param_groups[0]["lr"])
            if momentum:
                ms.append(opt.param_groups[0][momentum] if momentum != "betas"
                          else opt.param_groups[0]["betas"][0])
            opt.step()
            sched.step()
        return torch.tensor(lrs, dtype=torch.float64), torch.tensor(ms, dtype=torch.float64)

    opt = torch.optim.SGD(p, lr=0.1, momentum=0.9)
    out["sched.onecycle.lr"], out["sched.onecycle.momentum"] = run(
        opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=30), 30, "momentum")
    opt = torch.optim.Adam(p, lr=0.1)
    out["sched.onecycle3.lr"], out["sched.onecycle3.momentum"] = run(
        opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=20, three_phase=True,
                                                 anneal_strategy="linear"), 20, "betas")
    opt = torch.optim.SGD(p, lr=0.1)
    out["sched.linear.lr"], _ = run(opt, torch.optim.lr_scheduler.LinearLR(opt), 8)
    opt = torch.optim.SGD(p, lr=0.1)
    out["sched.exponential.lr"], _ = run(opt, torch.optim.lr_scheduler.ExponentialLR(opt, 0.8), 8)
    opt = torch.optim.SGD(p, lr=1.0)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=2, factor=0.5, cooldown=1,
                                                       min_lr=0.1)
    metrics = [5.0, 4.0, 4.0, 4.0, 4.0, 3.9999, 4.5, 4.5, 4.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    lrs = []
    for x in metrics:
        sched.step(x)
        lrs.append(opt.param_groups[0]["lr"])
    out["sched.plateau.metrics"] = torch.tensor(metrics, dtype=torch.float64)
    out["sched.plateau.lr"] = torch.tensor(lrs, dtype=torch.float64)
    return out


def main():
    torch.manual_seed(1)
    x = torch.randn(8, 6)
    y = torch.randint(0, 3, (8,))
    out = {"x": x, "y": y}
    for k, v in make_model().state_dict().items():
        out[f"init.{k}"] = v.clone()
    for name, make_opt in CONFIGS.items():
        model = make_model()
        opt = make_opt(model)
        for _ in range(STEPS):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        for k, v in model.state_dict().items():
            out[f"{name}.{k}"] = v.detach().clone()
    out.update(schedules())
    path = os.path.join(HERE, "optim.safetensors")
    write_safetensors(path, out, {"generator": "tests/golden/make_optim_fixtures.py",
                                  "torch": torch.__version__})


if __name__ == "__main__":
    main()
