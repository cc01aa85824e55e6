#!/usr/bin/python3
"""bench/seq_bench.cpp's workloads in PyTorch eager (Debian's python3-torch): the same models,
sizes, optimizers, clipping and losses. Prints
"result <workload> pytorch ms_per_step <x> first_step_ms <x> loss <x> peak_mib <x>".
    seq_peer.py <gpt_tiny|gpt_small|encoder|lstm> [timed_steps=20] [threads] [f32|bf16]"""
import contextlib
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

name = sys.argv[1] if len(sys.argv) > 1 else "gpt_tiny"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
if len(sys.argv) > 3:
    torch.set_num_threads(int(sys.argv[3]))
bf16 = len(sys.argv) > 4 and sys.argv[4] == "bf16"


class GPT(nn.Module):
    def __init__(self, vocab, block, d, heads, layers, ff):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(block, d)
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        for layer in self.layers:
            x = layer(x, src_mask=mask)
        return self.head(self.ln_f(x))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(1000, 256)
        self.pos = nn.Embedding(128, 256)
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
            for _ in range(2)])
        self.head = nn.Linear(256, 4)

    def forward(self, tokens, padding):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=padding)
        return self.head(x.mean(1))


class CharLstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(65, 128)
        self.lstm = nn.LSTM(128, 256, num_layers=2, batch_first=True)
        self.head = nn.Linear(256, 65)

    def forward(self, tokens):
        return self.head(self.lstm(self.emb(tokens))[0])


torch.manual_seed(0)
clip = False
if name in ("gpt_tiny", "gpt_small"):
    if name == "gpt_tiny":
        BLOCK, D, HEADS, LAYERS, FF, BATCH = 64, 128, 4, 3, 512, 32
    else:
        BLOCK, D, HEADS, LAYERS, FF, BATCH = 256, 384, 6, 6, 1536, 16
    model = GPT(65, BLOCK, D, HEADS, LAYERS, FF)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    tokens = torch.randint(0, 65, (BATCH, BLOCK + 1))
    x, y = tokens[:, :-1], tokens[:, 1:].reshape(-1)
    loss_of = lambda: F.cross_entropy(model(x).reshape(-1, 65), y)
    clip = True
elif name == "encoder":
    model = Encoder()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randint(0, 1000, (32, 128))
    padding = (torch.arange(32) % 4 == 0).unsqueeze(1) & (torch.arange(128) >= 96).unsqueeze(0)
    y = torch.randint(0, 4, (32,))
    loss_of = lambda: F.cross_entropy(model(x, padding), y)
elif name == "lstm":
    model = CharLstm()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 65, (32, 65))
    x, y = tokens[:, :-1], tokens[:, 1:].reshape(-1)
    loss_of = lambda: F.cross_entropy(model(x).reshape(-1, 65), y)
    clip = True
else:
    sys.exit(f"usage: seq_peer.py <gpt_tiny|gpt_small|encoder|lstm> [steps] [threads] [f32|bf16]")


def step():
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
        loss = loss_of()
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


t0 = time.perf_counter()
step()
first = time.perf_counter() - t0
for _ in range(3):
    step()
t0 = time.perf_counter()
for _ in range(steps):
    loss = step()
s = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"result {name}{'_bf16' if bf16 else ''} pytorch ms_per_step {1e3 * s / steps:.2f} "
      f"first_step_ms {1e3 * first:.1f} loss {loss.item():.4f} peak_mib {peak:.1f}", flush=True)
