"""Imports that never lie: every dtype and byte order either converts exactly or is an error
naming it; uint8 is a dtype of its own (not bool), with PyTorch's wrapping arithmetic."""
import numpy as np
import pytest
import torch

import lockstep
from lockstep.data import DeviceLoader


def test_a_torch_uint8_image_arrives_with_its_values():
    img = torch.tensor([[0, 1, 127, 128, 254, 255]], dtype=torch.uint8)
    x = lockstep.from_dlpack(img)
    assert x.dtype == lockstep.uint8
    assert x.tolist() == img.tolist()
    assert (x.float() / 255).tolist() == (img.float() / 255).tolist()
    # Through the loader, as an image pipeline hands its batches over.
    batches = [(img, torch.tensor([3])), (img.flip(1), torch.tensor([4]))]
    got = [(a.dtype, a.tolist(), b.tolist()) for a, b in DeviceLoader(batches)]
    assert got == [(lockstep.uint8, b[0].tolist(), b[1].tolist()) for b in batches]


def test_a_bool_stays_bool_through_dlpack_and_the_loader():
    # PyTorch 1.13 cannot export bool through DLPack: from_dlpack reads its NumPy view instead.
    m = torch.tensor([True, False, True])
    x = lockstep.from_dlpack(m)
    assert x.dtype == lockstep.bool and x.tolist() == [True, False, True]
    (y,) = list(DeviceLoader([m]))
    assert y.dtype == lockstep.bool and y.tolist() == [True, False, True]


def test_uint8_round_trips_through_torch_and_numpy():
    x = lockstep.tensor(np.array([0, 7, 200, 255], dtype=np.uint8))
    assert x.dtype == lockstep.uint8 and x.byte().dtype == lockstep.uint8
    t = torch.from_dlpack(x)
    assert t.dtype == torch.uint8 and t.tolist() == [0, 7, 200, 255]
    a = x.numpy()
    assert a.dtype == np.uint8 and a.tolist() == [0, 7, 200, 255]


def test_uint8_arithmetic_is_pytorchs():
    a = np.array([0, 1, 100, 200, 255, 17], dtype=np.uint8)
    b = np.array([255, 2, 200, 100, 1, 4], dtype=np.uint8)
    x, y = lockstep.tensor(a), lockstep.tensor(b)
    tx, ty = torch.tensor(a), torch.tensor(b)
    for name, got, want in [("add", x + y, tx + ty), ("sub", x - y, tx - ty),
                            ("mul", x * y, tx * ty), ("neg", -x, -tx),
                            ("floor_divide", x // (y % 100 + 1), tx // (ty % 100 + 1)),
                            ("remainder", x % (y % 100 + 1), tx % (ty % 100 + 1)),
                            ("max", lockstep.maximum(x, y), torch.maximum(tx, ty)),
                            ("gt", x > y, tx > ty), ("scalar", x + 3, tx + 3),
                            ("to float", x / 2, tx / 2)]:
        assert str(want.dtype).replace("torch.", "lockstep.") == repr(got.dtype), name
        assert got.tolist() == want.tolist(), name
    # PyTorch's promotions: a sum is int64; with int32 the result is int32; with a float, float.
    assert x.sum().dtype == lockstep.int64 and x.sum().item() == int(tx.sum())
    assert (x + lockstep.tensor([1, 2, 3, 4, 5, 6], dtype=lockstep.int32)).dtype == lockstep.int32
    assert (x.float() + 0.5).dtype == lockstep.float32
    # Casts to uint8: integers wrap; floats saturate (PyTorch's are undefined outside [0, 255]).
    i = lockstep.tensor([-1, 256, 300, 5])
    assert i.to(lockstep.uint8).tolist() == [255, 0, 44, 5]
    assert lockstep.tensor([-3.5, 2.7, 999.0]).to(lockstep.uint8).tolist() == [0, 2, 255]


def test_other_byte_orders_are_read_as_their_values():
    for dt in [">f4", ">f8", ">i4", ">i8", ">u2", ">i2"]:
        a = np.array([1, 2, 3, 100], dtype=dt)
        x = lockstep.from_numpy(a)
        assert x.tolist() == a.tolist(), dt
    assert lockstep.tensor(np.array([1.0], dtype=">f4")).item() == 1.0


def test_integers_of_other_widths_convert_exactly_and_huge_ones_are_refused():
    for dt in [np.int8, np.int16, np.uint16, np.uint32, np.uint64]:
        a = np.array([0, 1, min(np.iinfo(dt).max, 2**63 - 1)], dtype=dt)
        x = lockstep.from_numpy(a)
        assert x.dtype == lockstep.int64 and x.tolist() == a.tolist(), dt
    h = np.array([0, 1.5, 65504], dtype=np.float16)
    assert lockstep.from_numpy(h).tolist() == [0.0, 1.5, 65504.0]
    with pytest.raises(lockstep.Error, match=r"2\^63 or more"):
        lockstep.from_numpy(np.array([1, 2**63], dtype=np.uint64))
    with pytest.raises(lockstep.Error, match=r"2\^63 or more"):
        lockstep.tensor([2**63])
    assert lockstep.tensor([2**63 - 1]).tolist() == [2**63 - 1]
    with pytest.raises(lockstep.Error, match="complex128"):
        lockstep.from_numpy(np.array([1j]))


def test_dlpack_dtypes_lockstep_has_not_are_refused_by_name():
    with pytest.raises(lockstep.Error, match="no lockstep dtype"):
        lockstep.from_dlpack(torch.tensor([1, 2], dtype=torch.int16))
    with pytest.raises(lockstep.Error, match="no lockstep dtype"):
        lockstep.from_dlpack(torch.tensor([1.0], dtype=torch.float16))
