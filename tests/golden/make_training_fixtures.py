#!/usr/bin/python3
"""Writes the training golden files that golden_training_test.cpp reads: for an MLP and the small
CNN, the initial state, one batch, the loss and every gradient of one step, and the state after 5
SGD-momentum steps and after 5 AdamW steps (same batch every step).

Run once with Debian's /usr/bin/python3 (python3-torch); the outputs are committed, so the tests
need no Python. Models mirror lockstep::models::MLP and FashionCNN, parameter names included.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from make_safetensors_fixture import write_safetensors

HERE = os.path.dirname(os.path.abspath(__file__))
SGD = dict(lr=0.1, momentum=0.9, weight_decay=1e-4)
# PyTorch's defaults. (With lr 1e-2 the CNN's 5-step trajectory is chaotic enough that PyTorch's
# own float32 and float64 runs differ by 2e-5 in fc1.weight: the comparison would measure
# rounding noise, not the update rule. At lr 1e-3 they agree to 1e-7.)
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
STEPS = 5


class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i + 2 < len(sizes):
                layers.append(nn.ReLU())
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x.flatten(1))


class FashionCNN(nn.Module):
    def __init__(self, num_classes=10, in_channels=1, image_size=28):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        side = image_size // 4
        self.fc1 = nn.Linear(64 * side * side, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        h = F.max_pool2d(F.relu(self.bn2(self.conv2(h))), 2)
        h = F.relu(self.fc1(h.flatten(1)))
        return self.fc2(h)


def train(make, init, x, y, opt_class, opt_args):
    model = make()
    model.load_state_dict(init)
    model.train()
    opt = opt_class(model.parameters(), **opt_args)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.state_dict(), torch.tensor(losses, dtype=torch.float32)


def fixture(name, make, x, y):
    torch.manual_seed(0)
    model = make()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    out = {"x": x, "y": y, "loss": loss.detach().reshape([])}
    for k, v in init.items():
        out["init." + k] = v
    for k, p in model.named_parameters():
        out["grad." + k] = p.grad
    sgd_state, sgd_losses = train(make, init, x, y, torch.optim.SGD, SGD)
    adamw_state, adamw_losses = train(make, init, x, y, torch.optim.AdamW, ADAMW)
    for k, v in sgd_state.items():
        out["sgd." + k] = v
    for k, v in adamw_state.items():
        out["adamw." + k] = v
    out["sgd.losses"] = sgd_losses
    out["adamw.losses"] = adamw_losses
    meta = {"torch": torch.__version__, "sgd": repr(SGD), "adamw": repr(ADAMW), "steps": str(STEPS)}
    write_safetensors(os.path.join(HERE, name + ".safetensors"), out, meta)


def main():
    torch.manual_seed(1)
    x = torch.randn(8, 20)
    y = torch.randint(0, 5, (8,))
    fixture("mlp_training", lambda: MLP([20, 32, 16, 5]), x, y)
    torch.manual_seed(2)
    x = torch.randn(8, 1, 8, 8)
    y = torch.randint(0, 10, (8,))
    fixture("cnn_training", lambda: FashionCNN(10, 1, 8), x, y)


if __name__ == "__main__":
    main()
