#!/usr/bin/python3
"""Writes gpt_training.safetensors, which golden_gpt_test.cpp reads: a small GPT-style model
(token and position embeddings, 2 pre-norm TransformerEncoderLayers with GELU under a causal
mask, a final LayerNorm, a linear head), its initial state ("init.<name>", lockstep's names),
5 batches of a synthetic next-token task ("x" [5, N, T], "y") and PyTorch's losses of 5 AdamW
steps ("losses"), one batch per step.

Run once with Debian's /usr/bin/python3 (python3-torch); the output is committed. The model
mirrors lockstep::models::GPT, parameter names included.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from make_safetensors_fixture import write_safetensors

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, BLOCK, D, HEADS, LAYERS, FF = 16, 32, 64, 4, 2, 256
N, T, STEPS = 8, 24, 5


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


def batch(gen):
    """Arithmetic sequences mod VOCAB: x_t = (a + b t) mod V; the target is the next term."""
    a = torch.randint(0, VOCAB, (N, 1), generator=gen)
    b = torch.randint(1, 4, (N, 1), generator=gen)
    seq = (a + b * torch.arange(T + 1)) % VOCAB
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def attention_cases():
    """nn.MultiheadAttention with a bool attn_mask and a key padding mask, and a post-norm ReLU
    TransformerEncoderLayer with key padding: weights, inputs, outputs and input gradients."""
    torch.manual_seed(3)
    out = {}
    mha = nn.MultiheadAttention(16, 4)
    q = torch.randn(5, 3, 16, requires_grad=True)
    k = torch.randn(7, 3, 16, requires_grad=True)
    v = torch.randn(7, 3, 16, requires_grad=True)
    am = torch.rand(5, 7) < 0.3
    am[:, 0] = False  # every query keeps a key
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, 5:] = True
    o, w = mha(q, k, v, key_padding_mask=kpm, attn_mask=am)
    wo, ww = torch.randn(o.shape), torch.randn(w.shape)
    ((o * wo).sum() + (w * ww).sum()).backward()
    for name, t in mha.state_dict().items():
        out[f"mha.init.{name}"] = t.detach().clone()
    for name, t in dict(q=q, k=k, v=v).items():
        out[f"mha.{name}"] = t.detach().clone()
        out[f"mha.grad_{name}"] = t.grad.clone()
    out.update({"mha.attn_mask": am, "mha.key_padding_mask": kpm, "mha.out": o.detach(),
                "mha.weights": w.detach(), "mha.w_out": wo, "mha.w_weights": ww,
                "mha.grad_in_proj_weight": mha.in_proj_weight.grad.clone()})
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0)
    src = torch.randn(6, 2, 16, requires_grad=True)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, 4:] = True
    y = layer(src, src_key_padding_mask=pad)
    wy = torch.randn(y.shape)
    (y * wy).sum().backward()
    for name, t in layer.state_dict().items():
        out[f"enc.init.{name}"] = t.detach().clone()
    out.update({"enc.src": src.detach().clone(), "enc.pad": pad, "enc.out": y.detach(),
                "enc.w": wy, "enc.grad_src": src.grad.clone(),
                "enc.grad_linear1.weight": layer.linear1.weight.grad.clone()})
    return out


def recurrent_cases():
    """A 2-layer bidirectional LSTM with initial states and a batch-first GRU: weights, inputs,
    outputs, final states and the input gradients of sum(output * w) + sum(h_n * w2)."""
    torch.manual_seed(4)
    out = {}
    lstm = nn.LSTM(5, 7, num_layers=2, bidirectional=True)
    x = torch.randn(6, 3, 5, requires_grad=True)
    h0, c0 = torch.randn(4, 3, 7), torch.randn(4, 3, 7)
    y, (hn, cn) = lstm(x, (h0, c0))
    wy, wh, wc = torch.randn(y.shape), torch.randn(hn.shape), torch.randn(cn.shape)
    ((y * wy).sum() + (hn * wh).sum() + (cn * wc).sum()).backward()
    for name, t in lstm.state_dict().items():
        out[f"lstm.init.{name}"] = t.detach().clone()
    out.update({"lstm.x": x.detach().clone(), "lstm.h0": h0, "lstm.c0": c0, "lstm.out": y.detach(),
                "lstm.h_n": hn.detach(), "lstm.c_n": cn.detach(), "lstm.w_out": wy,
                "lstm.w_h": wh, "lstm.w_c": wc, "lstm.grad_x": x.grad.clone(),
                "lstm.grad_weight_hh_l1_reverse": lstm.weight_hh_l1_reverse.grad.clone()})
    gru = nn.GRU(4, 6, batch_first=True)
    x = torch.randn(2, 5, 4, requires_grad=True)
    y, hn = gru(x)
    wy, wh = torch.randn(y.shape), torch.randn(hn.shape)
    ((y * wy).sum() + (hn * wh).sum()).backward()
    for name, t in gru.state_dict().items():
        out[f"gru.init.{name}"] = t.detach().clone()
    out.update({"gru.x": x.detach().clone(), "gru.out": y.detach(), "gru.h_n": hn.detach(),
                "gru.w_out": wy, "gru.w_h": wh, "gru.grad_x": x.grad.clone(),
                "gru.grad_weight_ih_l0": gru.weight_ih_l0.grad.clone()})
    return out


def main():
    torch.manual_seed(7)
    model = GPT()
    init = {f"init.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(11)
    xs, ys = zip(*[batch(gen) for _ in range(STEPS)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = []
    for x, y in zip(xs, ys):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = dict(init)
    out["x"] = torch.stack(xs)
    out["y"] = torch.stack(ys)
    out["losses"] = torch.tensor(losses, dtype=torch.float64)
    out.update(attention_cases())
    out.update(recurrent_cases())
    path = os.path.join(HERE, "gpt_training.safetensors")
    write_safetensors(path, out, {"generator": "tests/golden/make_gpt_fixture.py",
                                  "torch": torch.__version__})
    print("losses", losses)


if __name__ == "__main__":
    main()
