"""Programs written the way a PyTorch user writes them, not tuned for lockstep: one definition of
each model and training step, run by lockstep or by PyTorch eager (whichever module is imported as
`L`; the two share PyTorch's names), on fixed fake batches. They are the suite's check from
outside: other layers (5x5, strided and depthwise convolutions, average pooling, dropout, GRU,
bidirectional LSTM, BatchNorm1d), hand-written attention, other losses (a VAE's sampled latent and
KL term, a contrastive loss over normalized embeddings, regression), other optimizers, and sizes
from a 6k-parameter MLP to a 22M-parameter GPT.
    python3 bench/user_programs.py <program> <lockstep|pytorch|compile|xla> [steps=10] [threads=2]
The frameworks: lockstep (each step in `lockstep.step()`); PyTorch eager (whichever torch the
interpreter imports: Debian's 1.13 or PyTorch 2.x in a virtual environment); torch.compile
(PyTorch 2.x, Inductor: the step's forward and loss compiled as one function, its backward by
AOTAutograd, and `optimizer.step` compiled as the docs' "compiling the optimizer" recipe does);
xla (torch_xla on its CPU device, PJRT_DEVICE=CPU: every tensor made on the XLA device through
torch.set_default_device, each step in `torch_xla.step()` as the seed's loop does).
Times rounds of `steps` steps until half a second has passed, after a first step and warm-up
steps (3; 20 for compile and xla, whose steps settle later); prints "result <program>
<framework> ms <ms per step> first <first step ms> t100 <ms to the end of step 100, or -1>
rss_mb <peak resident MiB> loss <loss>". FIRST100=1 runs steps 2-100 after the first step and
times them (the time to the first 100 steps, compiles included). BF16=1 runs the forward under
bf16 autocast; LOCKSTEP_PROFILE=1 also prints lockstep's kernel timers. scripts/bench-programs
runs them all, alternating the frameworks.
"""
import contextlib
import math
import os
import resource
import sys

from step_timing import time_steps

PROGRAMS = ["mlp_tiny", "mlp_mnist", "mlp_wide", "lenet", "lenet_b8", "strided", "mobilenet",
            "mixcnn", "vgg", "nanogpt_tiny", "nanogpt", "gpt_long", "gpt_wide", "encoder_drop",
            "gru", "bilstm", "vae", "tabular", "contrastive", "small_cnn", "resnet18", "resnet50",
            "gpt_tiny"]
FRAMEWORKS = ("lockstep", "pytorch", "compile", "xla")
if len(sys.argv) < 3 or sys.argv[1] not in PROGRAMS or sys.argv[2] not in FRAMEWORKS:
    sys.exit(__doc__ + "programs: " + " ".join(PROGRAMS))
W, FW = sys.argv[1], sys.argv[2]
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 10
THREADS = int(sys.argv[4]) if len(sys.argv) > 4 else 2
if FW == "lockstep":
    import lockstep as L
else:
    import torch as L
if FW == "xla":
    import torch_xla
    import torch_xla.core.xla_model as xm
    L.set_default_device(torch_xla.device())
L.set_num_threads(THREADS)
nn, F = L.nn, L.nn.functional
L.manual_seed(0)


class MLP(nn.Module):
    def __init__(self, sizes, act):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])])
        self.act = act

    def forward(self, x):
        for i, l in enumerate(self.layers):
            x = l(x)
            if i + 1 < len(self.layers):
                x = self.act(x)
        return x


class LeNet(nn.Module):  # 5x5 convs, max-pool, no batch norm
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 5, padding=2)
        self.c2 = nn.Conv2d(32, 64, 5, padding=2)
        self.f1 = nn.Linear(64 * 7 * 7, 256)
        self.f2 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.f2(F.relu(self.f1(x.flatten(1))))


def cbr(i, o, s):
    return [nn.Conv2d(i, o, 3, stride=s, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]


class StridedCNN(nn.Module):  # stride-2 convs instead of pooling, 64x64
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(*(cbr(3, 32, 1) + cbr(32, 64, 2) + cbr(64, 64, 1) +
                                    cbr(64, 128, 2) + cbr(128, 128, 1) + cbr(128, 256, 2)))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(256, 100)

    def forward(self, x):
        return self.fc(self.pool(self.body(x)).flatten(1))


class Block(nn.Module):  # nanoGPT-style hand-written attention
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, self.h, d // self.h).transpose(1, 2)
        k = k.view(b, t, self.h, d // self.h).transpose(1, 2)
        v = v.view(b, t, self.h, d // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.h))
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab, block, d, h, layers):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList([Block(d, h) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, mask):
        h = self.tok(idx) + self.pos(L.arange(idx.shape[1]))
        for b in self.blocks:
            h = b(h, mask)
        return self.head(self.ln(h))


class GRULM(nn.Module):
    def __init__(self, vocab, emb, hidden):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = nn.GRU(emb, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x):
        y, _ = self.rnn(self.emb(x))
        return self.head(y)


class DWBlock(nn.Module):  # depthwise separable (MobileNet)
    def __init__(self, i, o, s):
        super().__init__()
        self.dw = nn.Conv2d(i, i, 3, stride=s, padding=1, groups=i, bias=False)
        self.b1 = nn.BatchNorm2d(i)
        self.pw = nn.Conv2d(i, o, 1, bias=False)
        self.b2 = nn.BatchNorm2d(o)

    def forward(self, x):
        return F.relu(self.b2(self.pw(F.relu(self.b1(self.dw(x))))))


class MobileNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(32), nn.ReLU())
        cfg = [(32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1),
               (256, 512, 2)]
        self.blocks = nn.Sequential(*[DWBlock(i, o, s) for i, o, s in cfg])
        self.fc = nn.Linear(512, 100)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(x.mean(dim=(2, 3)))


class Encoder(nn.Module):
    def __init__(self, vocab, d, h, layers, ff, drop):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(d, h, ff, dropout=drop, batch_first=True)
            for _ in range(layers)])
        self.head = nn.Linear(d, 2)

    def forward(self, x):
        h = self.emb(x)
        for l in self.layers:
            h = l(h)
        return self.head(h.mean(dim=1))


class BiLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5000, 100)
        self.rnn = nn.LSTM(100, 128, num_layers=1, batch_first=True, bidirectional=True)
        self.head = nn.Linear(256, 5)

    def forward(self, x):
        y, _ = self.rnn(self.emb(x))
        return self.head(y[:, -1])


class MixCNN(nn.Module):  # SiLU, LeakyReLU, AvgPool, dropout, 5x5 + 3x3 + 1x1
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 48, 5, padding=2)
        self.b = nn.Conv2d(48, 96, 3, padding=1)
        self.c = nn.Conv2d(96, 96, 1)
        self.d = nn.Conv2d(96, 192, 3, padding=1)
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(192 * 4 * 4, 10)

    def forward(self, x):
        x = F.avg_pool2d(F.silu(self.a(x)), 2)
        x = F.avg_pool2d(F.leaky_relu(self.b(x), 0.1), 2)
        x = F.silu(self.c(x))
        x = F.avg_pool2d(F.relu(self.d(x)), 2)
        return self.fc(self.drop(x.flatten(1)))


class GPTTiny(nn.Module):  # the suite's gpt_tiny (bench/seq_bench.cpp) from PyTorch's layers
    def __init__(self, vocab=65, block=64, d=128, h=4, layers=3, ff=512):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(d, h, ff, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx, mask):
        h = self.tok(idx) + self.pos(L.arange(idx.shape[1]))
        for layer in self.layers:
            h = layer(h, src_mask=mask)
        return self.head(self.ln(h))


def resnet(depth, small_stem):
    """The suite's ResNets (bench/workload_models.h): lockstep.models or torchvision's, 10
    classes; the small stem is a 3x3 stride-1 convolution without max-pooling."""
    if FW == "lockstep":
        return (L.models.resnet18 if depth == 18 else L.models.resnet50)(
            num_classes=10, small_stem=small_stem)
    import torchvision
    m = (torchvision.models.resnet18 if depth == 18 else torchvision.models.resnet50)(
        num_classes=10)
    if small_stem:
        m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        m.maxpool = nn.Identity()
    return m


class SmallCNN(nn.Module):  # a user's Fashion-MNIST CNN: few channels, batch norm, SGD momentum
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.f1, self.f2 = nn.Linear(32 * 7 * 7, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        return self.f2(F.relu(self.f1(x.flatten(1))))


class VAE(nn.Module):  # MNIST-sized variational autoencoder, reparameterized sampling
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(784, 400)
        self.mu, self.logvar = nn.Linear(400, 20), nn.Linear(400, 20)
        self.dec1, self.dec2 = nn.Linear(20, 400), nn.Linear(400, 784)

    def forward(self, x):
        h = F.relu(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + L.randn_like(mu) * L.exp(0.5 * logvar)
        return self.dec2(F.relu(self.dec1(z))), mu, logvar


def vae_loss(m, x):
    logits, mu, logvar = m(x)
    bce = F.binary_cross_entropy_with_logits(logits, x, reduction="sum")
    kl = -0.5 * L.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (bce + kl) / x.shape[0]


class Tabular(nn.Module):  # regression MLP with BatchNorm1d and dropout
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.SiLU(),
                                 nn.Dropout(0.3), nn.Linear(256, 256), nn.BatchNorm1d(256),
                                 nn.SiLU(), nn.Dropout(0.3), nn.Linear(256, 1))

    def forward(self, x):
        return self.net(x).squeeze(1)


class Projector(nn.Module):  # SimCLR-style: two views, normalized embeddings, InfoNCE loss
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128))

    def forward(self, a, b):
        za, zb = self.net(a), self.net(b)
        za = za / za.norm(dim=1, keepdim=True)
        zb = zb / zb.norm(dim=1, keepdim=True)
        logits = za @ zb.t() / 0.1
        target = L.arange(a.shape[0])
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


def vgg_stage(i, o):
    return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
            nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2)]


# vocab, block, d_model, heads, layers, batch
GPTS = {"nanogpt_tiny": (50, 32, 64, 4, 2, 64), "nanogpt": (256, 128, 256, 4, 4, 8),
        "gpt_long": (256, 512, 256, 4, 4, 4), "gpt_wide": (5000, 256, 768, 12, 2, 4)}


def classify(model, opt, x, classes):
    y = L.randint(0, classes, (x.shape[0],))
    return model, opt, lambda: F.cross_entropy(model(x), y)


def build():
    """The program's model, optimizer and loss function."""
    if W in GPTS:
        vocab, block, d, h, layers, batch = GPTS[W]
        m = NanoGPT(vocab, block, d, h, layers)
        o = L.optim.AdamW(m.parameters(), lr=3e-4)
        t = L.randint(0, vocab, (batch, block + 1))
        x, y = t[:, :-1], t[:, 1:]
        mask = L.triu(L.ones(block, block), diagonal=1) > 0.5
        return m, o, lambda: F.cross_entropy(m(x, mask).reshape(-1, vocab), y.reshape(-1))
    if W == "gru":
        m = GRULM(1000, 128, 256)
        o = L.optim.Adam(m.parameters(), lr=1e-3)
        t = L.randint(0, 1000, (32, 36))
        x, y = t[:, :-1], t[:, 1:]
        return m, o, lambda: F.cross_entropy(m(x).reshape(-1, 1000), y.reshape(-1))
    if W == "bilstm":
        m = BiLSTM()
        return classify(m, L.optim.Adam(m.parameters(), lr=1e-3),
                        L.randint(0, 5000, (64, 50)), 5)
    if W == "encoder_drop":
        m = Encoder(1000, 256, 8, 3, 1024, 0.1)
        return classify(m, L.optim.AdamW(m.parameters(), lr=1e-4),
                        L.randint(0, 1000, (16, 128)), 2)
    if W.startswith("mlp"):
        sizes, act, batch = {"mlp_tiny": ([32, 64, 64, 4], F.relu, 16),
                             "mlp_mnist": ([784, 300, 100, 10], F.relu, 256),
                             "mlp_wide": ([1024, 2048, 2048, 2048, 10], F.gelu, 64)}[W]
        m = MLP(sizes, act)
        o = L.optim.SGD(m.parameters(), lr=1e-2) if W == "mlp_tiny" else \
            L.optim.Adam(m.parameters(), lr=1e-3) if W == "mlp_mnist" else \
            L.optim.AdamW(m.parameters(), lr=1e-3)
        return classify(m, o, L.randn(batch, sizes[0]), sizes[-1])
    if W.startswith("lenet"):
        m = LeNet()
        return classify(m, L.optim.Adam(m.parameters(), lr=1e-3),
                        L.randn(8 if W == "lenet_b8" else 128, 1, 28, 28), 10)
    if W == "strided":
        m = StridedCNN()
        return classify(m, L.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4),
                        L.randn(32, 3, 64, 64), 100)
    if W == "mobilenet":
        m = MobileNetish()
        return classify(m, L.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                        L.randn(32, 3, 96, 96), 100)
    if W == "mixcnn":
        m = MixCNN()
        return classify(m, L.optim.RMSprop(m.parameters(), lr=1e-3), L.randn(64, 3, 32, 32), 10)
    if W == "vgg":
        m = nn.Sequential(*(vgg_stage(3, 32) + vgg_stage(32, 64) + vgg_stage(64, 128)),
                          nn.Flatten(), nn.Linear(128 * 4 * 4, 10))
        return classify(m, L.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True),
                        L.randn(64, 3, 32, 32), 10)
    if W == "gpt_tiny":
        m = GPTTiny()
        o = L.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.01)
        t = L.randint(0, 65, (32, 65))
        x, y = t[:, :-1], t[:, 1:]
        mask = nn.Transformer.generate_square_subsequent_mask(64)
        return m, o, lambda: F.cross_entropy(m(x, mask).reshape(-1, 65), y.reshape(-1))
    if W.startswith("resnet"):
        m = resnet(18, True) if W == "resnet18" else resnet(50, False)
        return classify(m, L.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
                        L.randn(64, 3, 32, 32) if W == "resnet18" else L.randn(16, 3, 64, 64), 10)
    if W == "small_cnn":
        m = SmallCNN()
        return classify(m, L.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
                        (L.rand(64, 1, 28, 28) - 0.2860) / 0.3530, 10)
    if W == "vae":
        m = VAE()
        x = L.rand(128, 784)
        return m, L.optim.Adam(m.parameters(), lr=1e-3), lambda: vae_loss(m, x)
    if W == "tabular":
        m = Tabular()
        x, y = L.randn(512, 64), L.randn(512)
        return m, L.optim.AdamW(m.parameters(), lr=1e-3), lambda: F.mse_loss(m(x), y)
    if W == "contrastive":
        m = Projector()
        a = L.randn(256, 256)
        b = a + 0.1 * L.randn(256, 256)
        return m, L.optim.Adam(m.parameters(), lr=1e-3), lambda: m(a, b)
    raise AssertionError("no program " + W)

def main():
    m, o, loss_fn = build()
    bf16 = os.environ.get("BF16") == "1"

    def autocast():
        if not bf16:
            return contextlib.nullcontext()
        if FW == "lockstep":
            return L.autocast()
        return L.autocast("xla" if FW == "xla" else "cpu", dtype=L.bfloat16)

    forward, optimizer_step = loss_fn, o.step
    if FW == "compile":
        forward, optimizer_step = L.compile(loss_fn), L.compile(o.step)

    def body():
        o.zero_grad()
        with autocast():
            loss = forward()
        loss.backward()
        optimizer_step()
        return loss

    step, wait = body, (lambda: None)
    if FW == "lockstep":
        def step():
            with L.step():
                return body()
        wait = L.wait
    elif FW == "xla":
        def step():
            with torch_xla.step():
                return body()

        def wait():
            torch_xla.sync()
            xm.wait_device_ops()

    # Rounds of STEPS steps until half a second has passed (a tiny program's step takes 0.2 ms).
    first100 = 100 if os.environ.get("FIRST100") == "1" else 0
    warmup = 20 if FW in ("compile", "xla") else 3
    first, t100, ms, loss = time_steps(step, wait, STEPS, min_seconds=0.5, warmup=warmup,
                                       first_n=first100)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"result {W} {FW} ms {ms:.3f} first {first * 1000:.0f} "
          f"t100 {t100 * 1000 if first100 else -1:.0f} rss_mb {rss:.0f} loss {loss.item():.4f}")
    if FW == "lockstep" and os.environ.get("LOCKSTEP_PROFILE"):
        print(L.metrics.report())


if __name__ == "__main__":
    main()
