#!/usr/bin/python3
"""Writes ops.safetensors, which ops_golden_test.cpp reads: for each case, its inputs
("<case>.in<i>"), PyTorch's outputs ("<case>.out<k>"), and for float cases the gradients of
sum_k sum(out_k * w_k) ("<case>.w<k>", "<case>.grad<i>") with respect to each float input.

Run once with Debian's /usr/bin/python3 (python3-torch); the output is committed, so the tests
need no Python. The C++ side has one lambda per case name, written as a libtorch user would.
"""
import os

import torch
import torch.nn.functional as F

from make_safetensors_fixture import write_safetensors

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(20261201)


def normal(*shape, scale=1.0):
    return torch.randn(*shape, dtype=torch.float32) * scale


def distinct(*shape):
    n = 1
    for s in shape:
        n *= s
    return (torch.randperm(n).to(torch.float32) * 0.37 - n * 0.1).reshape(shape)


def away_from_zero(*shape):
    x = torch.rand(*shape) * 2 + 0.5
    return torch.where(torch.rand(*shape) < 0.5, -x, x)


def ints(lo, hi, *shape):
    return torch.randint(lo, hi, shape, dtype=torch.int64)


def nonzero_ints(*shape):
    x = torch.randint(1, 8, shape, dtype=torch.int64)
    return torch.where(torch.rand(*shape) < 0.5, -x, x)


# name: (inputs, fn(inputs) -> list of outputs)
CASES = {
    "chunk": ([normal(7, 5)], lambda x: list(torch.chunk(x, 3, 0))),
    "split_size": ([normal(7, 5)], lambda x: list(torch.split(x, 2, 1))),
    "split_sizes": ([normal(7, 5)], lambda x: list(torch.split(x, [3, 4], 0))),
    "stack": ([normal(3, 4), normal(3, 4)], lambda a, b: [torch.stack([a, b], 1)]),
    "unbind": ([normal(3, 4)], lambda x: list(torch.unbind(x, 1))),
    "repeat": ([normal(2, 3)], lambda x: [x.repeat(2, 1, 3)]),
    "flip": ([normal(3, 4, 5)], lambda x: [torch.flip(x, [0, 2])]),
    "roll": ([normal(3, 4)], lambda x: [torch.roll(x, (1, -2), (0, 1))]),
    "roll_flat": ([normal(3, 4)], lambda x: [torch.roll(x, 3)]),
    "index_select": ([normal(5, 4), torch.tensor([3, 0, 3])],
                     lambda x, i: [torch.index_select(x, 0, i)]),
    "take_along_dim": ([normal(4, 5), ints(0, 5, 4, 2)],
                       lambda x, i: [torch.take_along_dim(x, i, 1)]),
    "narrow": ([normal(6, 4)], lambda x: [torch.narrow(x, 0, -4, 2)]),
    "movedim": ([normal(2, 3, 4)], lambda x: [torch.movedim(x, 0, 2)]),
    "tril": ([normal(2, 4, 5)], lambda x: [torch.tril(x, 1), torch.tril(x, -1)]),
    "triu": ([normal(2, 4, 5)], lambda x: [torch.triu(x), torch.triu(x, 2)]),
    "masked_fill": ([normal(3, 4), torch.rand(4) < 0.5],
                    lambda x, m: [x.masked_fill(m, -1.5)]),
    "where_scalars": ([torch.rand(5) < 0.5], lambda c: [torch.where(c, 1.5, -2.0)]),
    "fmod": ([normal(20, scale=5), away_from_zero(20)], lambda a, b: [torch.fmod(a, b)]),
    "remainder": ([normal(20, scale=5), away_from_zero(20)],
                  lambda a, b: [torch.remainder(a, b), a % 1.5]),
    "fmod_int": ([ints(-9, 10, 20), nonzero_ints(20)],
                 lambda a, b: [torch.fmod(a, b), torch.remainder(a, b), a % 4]),
    "floor_divide": ([normal(20, scale=5), away_from_zero(20)],
                     lambda a, b: [torch.floor_divide(a.detach(), b.detach())]),
    "floor_divide_int": ([ints(-9, 10, 20), nonzero_ints(20)],
                         lambda a, b: [torch.floor_divide(a.detach(), b.detach())]),
    "clamp_tensor": ([normal(10), normal(10) - 1.0, normal(10) + 1.0],
                     lambda x, lo, hi: [torch.clamp(x, lo, hi)]),
    "cumsum": ([normal(3, 7)], lambda x: [torch.cumsum(x, 1), torch.cumsum(x, 0)]),
    "cumsum_int": ([ints(-9, 10, 3, 7).to(torch.int32)], lambda x: [torch.cumsum(x, 1)]),
    "cumprod": ([normal(3, 7)], lambda x: [torch.cumprod(x, 1)]),
    "cumprod_zero": ([torch.tensor([2.0, -1.5, 0.0, 3.0, 0.5])], lambda x: [torch.cumprod(x, 0)]),
    "var_std": ([normal(4, 6)], lambda x: [torch.var(x, 1), torch.var(x, 1, correction=0),
                                           torch.std(x), torch.std(x, 0, keepdim=True)]),
    "norm": ([normal(4, 6)], lambda x: [torch.linalg.vector_norm(x, 2, 1),
                                        torch.linalg.vector_norm(x, 1, 1),
                                        torch.linalg.vector_norm(x, 3, 1),
                                        torch.linalg.vector_norm(x, float("inf"), 1),
                                        torch.linalg.vector_norm(x)]),
    "prod": ([normal(3, 5)], lambda x: [torch.prod(x, 1), torch.prod(x)]),
    "any_all": ([torch.rand(3, 4) < 0.3], lambda x: [torch.any(x, 1), torch.all(x, 0),
                                                      torch.any(x)]),
    "sort": ([distinct(4, 7)], lambda x: list(torch.sort(x, 1)) + list(torch.sort(x, 0, True))),
    "sort_ties": ([torch.tensor([3.0, 1.0, 3.0, 2.0, 1.0, 3.0])],
                  lambda x: list(torch.sort(x, stable=True)) +
                  list(torch.sort(x, descending=True, stable=True))),
    "argsort": ([distinct(4, 7)], lambda x: [torch.argsort(x, 1, True)]),
    "topk": ([distinct(4, 7)], lambda x: list(torch.topk(x, 3, 1)) +
             list(torch.topk(x, 2, 0, largest=False))),
    "einsum_bmm": ([normal(2, 3, 4), normal(2, 4, 5)],
                   lambda a, b: [torch.einsum("bij,bjk->bik", a, b)]),
    "einsum_transpose": ([normal(3, 4)], lambda a: [torch.einsum("ij->ji", a)]),
    "einsum_dot": ([normal(6), normal(6)], lambda a, b: [torch.einsum("i,i->", a, b)]),
    "einsum_outer": ([normal(3), normal(4)], lambda a, b: [torch.einsum("i,j->ij", a, b)]),
    "einsum_attention": ([normal(2, 2, 3, 4), normal(2, 2, 5, 4)],
                         lambda q, k: [torch.einsum("bhqd,bhkd->bhqk", q, k)]),
    "einsum_ellipsis": ([normal(2, 3, 4), normal(4, 5)],
                        lambda a, b: [torch.einsum("...ij,jk->...ik", a, b)]),
    "einsum_sum": ([normal(2, 3, 4)], lambda a: [torch.einsum("ijk->", a),
                                                 torch.einsum("ijk->ki", a)]),
    "einsum_chain": ([normal(2, 3), normal(3, 4), normal(4, 2)],
                     lambda a, b, c: [torch.einsum("ij,jk,kl->il", a, b, c)]),
    "einsum_implicit": ([normal(3, 4), normal(4, 5)], lambda a, b: [torch.einsum("ij,jk", a, b)]),
    "one_hot": ([torch.tensor([0, 3, 1, 3, 2])], lambda i: [F.one_hot(i, 4)]),
    "linspace": ([], lambda: [torch.linspace(-1, 2, 7), torch.linspace(0, 1, 10),
                              torch.linspace(3, 3, 1)]),
    "log1p": ([torch.tensor([1e-9, -1e-7, 1e-4, 0.5, 3.0, -0.5, 0.0])],
              lambda x: [torch.log1p(x)]),
    "activations": ([normal(64, scale=4)],
                    lambda x: [F.leaky_relu(x), F.leaky_relu(x, 0.2), F.elu(x), F.elu(x, 0.5),
                               F.silu(x), F.softplus(x), F.softplus(x * 10, 2.0, 15.0),
                               F.hardswish(x), F.mish(x), F.logsigmoid(x),
                               F.gelu(x, approximate="tanh"), F.gelu(x)]),
    "promote": ([ints(-9, 10, 4), normal(4), ints(-9, 10, 4).to(torch.int32), torch.rand(4) < 0.5],
                lambda i, f, i32, b: [i + f, i * 2.5, i / 2, i / i32, i + i32, b + 1, b * 0.5,
                                      f + torch.tensor(2.0, dtype=torch.float64),
                                      i + torch.tensor(1.5, dtype=torch.float64)]),
}


def main():
    out = {}
    for name, (inputs, fn) in CASES.items():
        leaves = []
        for i, x in enumerate(inputs):
            out[f"{name}.in{i}"] = x.clone()
            leaf = x.clone()
            if leaf.is_floating_point():
                leaf.requires_grad_(True)
            leaves.append(leaf)
        results = fn(*leaves)
        loss = None
        for k, y in enumerate(results):
            out[f"{name}.out{k}"] = y.detach().clone().contiguous()
            if y.requires_grad:
                w = torch.randn(y.shape, dtype=y.dtype)
                out[f"{name}.w{k}"] = w
                term = (y * w).sum()
                loss = term if loss is None else loss + term
        if loss is not None:
            loss.backward()
            for i, leaf in enumerate(leaves):
                if leaf.requires_grad:
                    g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                    out[f"{name}.grad{i}"] = g.detach().clone()
    path = os.path.join(HERE, "ops.safetensors")
    write_safetensors(path, out, {"generator": "tests/golden/make_ops_fixtures.py",
                                  "torch": torch.__version__})
    print(f"wrote {path}: {len(CASES)} cases, {len(out)} tensors")


if __name__ == "__main__":
    main()
