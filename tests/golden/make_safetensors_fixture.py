#!/usr/bin/python3
"""Writes tests/golden/pytorch.safetensors, the fixture safetensors_test.cpp reads.

Run once with Debian's /usr/bin/python3 (python3-torch); the output is committed, so the tests
need no Python. The `safetensors` package is not in Debian, so the file is written here by hand
the way the reference implementation writes it: tensor bytes from PyTorch, data ordered by
alignment then name, header keys in another (sorted) order, JSON escaped with \\uXXXX (the
default of Python's json), padded with spaces to a multiple of 8 bytes.
"""
import json
import os
import struct

import torch

TENSORS = {
    "weight": torch.tensor([[0.5, -1.25, 3.0], [-0.0, 1e-3, 65504.0]], dtype=torch.float32),
    "bias": torch.tensor([0.1, -2.5, 1e300], dtype=torch.float64),
    "step": torch.tensor(42, dtype=torch.int64),  # 0-d
    "labels": torch.tensor([-7, 0, 2**31 - 1, -(2**31)], dtype=torch.int32),
    "mask": torch.tensor([[True, False], [False, True]]),
    "empty": torch.zeros(0, 3, dtype=torch.float32),
    "gr\u00f6\u00dfe/\u03c0\U0001F600": torch.tensor([-1], dtype=torch.int64),
}
METADATA = {"format": "pt", "note": 'tab\there "quoted" caf\u00e9'}
NAMES = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32", torch.int64: "I64",
         torch.bool: "BOOL", torch.bfloat16: "BF16"}


def write_safetensors(path, tensors, metadata):
    """Writes `tensors` (name -> torch.Tensor) and `metadata` (str -> str) to `path`."""
    # Data layout of the reference writer: larger element size first, then by name.
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header, data, offset = {}, b"", 0
    for name in order:
        t = tensors[name].detach().contiguous()
        # little-endian on every host we run on; numpy has no bfloat16: its bits as int16
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        assert len(raw) == t.numel() * t.element_size()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    header["__metadata__"] = metadata
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    print(f"wrote {path}: {8 + len(text) + len(data)} bytes, torch {torch.__version__}")


def main():
    write_safetensors(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                   "pytorch.safetensors"), TENSORS, METADATA)


if __name__ == "__main__":
    main()
