#!/usr/bin/python3
"""bench/gpt_bench.cpp's GPT in PyTorch eager (Debian's python3-torch): the same sizes, layers,
optimizer, clipping and loss. Prints "result gpt_<size> pytorch ms_per_step <x> ...".
    gpt_peer.py <tiny|small> [timed_steps=20] [threads]"""
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

size = sys.argv[1] if len(sys.argv) > 1 else "tiny"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
if len(sys.argv) > 3:
    torch.set_num_threads(int(sys.argv[3]))
VOCAB = 65
if size == "tiny":
    BLOCK, D, HEADS, LAYERS, FF, BATCH = 64, 128, 4, 3, 512, 32
else:
    BLOCK, D, HEADS, LAYERS, FF, BATCH = 256, 384, 6, 6, 1536, 16


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, D)
        self.pos_emb = nn.Embedding(BLOCK, D)
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        for layer in self.layers:
            x = layer(x, src_mask=mask)
        return self.head(self.ln_f(x))


torch.manual_seed(0)
model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
                        weight_decay=0.01)
tokens = torch.randint(0, VOCAB, (BATCH, BLOCK + 1))
x, y = tokens[:, :-1], tokens[:, 1:]


def step():
    opt.zero_grad()
    loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    loss.backward()
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
print(f"result gpt_{size} pytorch ms_per_step {1e3 * s / steps:.2f} first_step_ms "
      f"{1e3 * first:.1f} loss {loss.item():.4f}", flush=True)
