"""The training loops of bench/train_bench.cpp (ResNet-18 at 32x32 batch 64, ResNet-50 at 64x64
batch 16, SGD with momentum) and bench/gpt_bench.cpp (the tiny GPT, AdamW, clipping) written
from Python, with lockstep or with PyTorch eager in the same interpreter, on fixed fake batches.
Prints "result <workload> <framework> ms_per_step <x> first_step_ms <y> loss <z>".
    python3 bench/python_train.py <resnet18|resnet50|gpt_tiny> <lockstep|pytorch> [steps] [threads]
scripts/bench-python runs it against the C++ loops.
"""
import sys

from step_timing import time_steps

WORKLOADS = {  # batch, channels, side, stem
    "resnet18": (64, 3, 32, "small"),
    "resnet50": (16, 3, 64, "imagenet"),
}
GPT = dict(vocab=65, block=64, d=128, heads=4, layers=3, ff=512, batch=32)


def lockstep_loop(workload, threads):
    import lockstep as ls
    ls.set_num_threads(threads)
    ls.manual_seed(0)
    if workload == "gpt_tiny":
        g = GPT
        model = ls.models.GPT(vocab_size=g["vocab"], block_size=g["block"], d_model=g["d"],
                              nhead=g["heads"], num_layers=g["layers"],
                              dim_feedforward=g["ff"])
        opt = ls.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        tokens = ls.randint(0, g["vocab"], (g["batch"], g["block"] + 1))
        x, y = tokens[:, :-1], tokens[:, 1:]

        def body():
            opt.zero_grad()
            loss = ls.nn.functional.cross_entropy(model(x).reshape(-1, g["vocab"]),
                                                  y.reshape(-1))
            loss.backward()
            ls.optim.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss
    else:
        batch, c, side, stem = WORKLOADS[workload]
        make = ls.models.resnet18 if workload == "resnet18" else ls.models.resnet50
        model = make(num_classes=10, small_stem=stem == "small")
        opt = ls.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        images, labels = ls.randn(batch, c, side, side), ls.randint(0, 10, (batch,))

        def body():
            opt.zero_grad()
            loss = ls.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            return loss

    def step():
        with ls.step():
            return body()

    ls.wait()
    return step, ls.wait, lambda loss: loss.item()


def pytorch_loop(workload, threads):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if workload == "gpt_tiny":
        g = GPT

        class TorchGPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok_emb = nn.Embedding(g["vocab"], g["d"])
                self.pos_emb = nn.Embedding(g["block"], g["d"])
                self.layers = nn.ModuleList([
                    nn.TransformerEncoderLayer(g["d"], g["heads"], g["ff"], dropout=0.0,
                                               activation="gelu", batch_first=True,
                                               norm_first=True) for _ in range(g["layers"])])
                self.ln_f = nn.LayerNorm(g["d"])
                self.head = nn.Linear(g["d"], g["vocab"])

            def forward(self, tokens):
                t = tokens.shape[1]
                h = self.tok_emb(tokens) + self.pos_emb(torch.arange(t))
                mask = nn.Transformer.generate_square_subsequent_mask(t)
                for layer in self.layers:
                    h = layer(h, src_mask=mask)
                return self.head(self.ln_f(h))

        model = TorchGPT()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        tokens = torch.randint(0, g["vocab"], (g["batch"], g["block"] + 1))
        x, y = tokens[:, :-1], tokens[:, 1:]

        def step():
            opt.zero_grad()
            loss = F.cross_entropy(model(x).reshape(-1, g["vocab"]), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss
    else:
        import torchvision
        batch, c, side, stem = WORKLOADS[workload]
        make = torchvision.models.resnet18 if workload == "resnet18" else torchvision.models.resnet50
        model = make(num_classes=10)
        if stem == "small":  # lockstep's small stem: a 3x3 stride-1 conv, no max-pool
            model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            model.maxpool = nn.Identity()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        images, labels = torch.randn(batch, c, side, side), torch.randint(0, 10, (batch,))

        def step():
            opt.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            return loss

    return step, lambda: None, lambda loss: loss.item()


def main():
    workload, framework = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    if workload not in list(WORKLOADS) + ["gpt_tiny"] or framework not in ("lockstep", "pytorch"):
        sys.exit(__doc__)
    step, wait, read = (lockstep_loop if framework == "lockstep" else pytorch_loop)(workload,
                                                                                  threads)
    first, _, ms, loss = time_steps(step, wait, steps)
    name = "lockstep-python" if framework == "lockstep" else "pytorch"
    print(f"result {workload} {name} ms_per_step {ms:.2f} first_step_ms "
          f"{1e3 * first:.1f} loss {read(loss):.4f}", flush=True)


if __name__ == "__main__":
    main()
