"""DLPack and NumPy exchange: no copy out of lockstep, and the rule for memory lockstep updates."""
import gc
import threading

import numpy as np
import pytest

import lockstep


def test_numpy_sees_the_memory_without_a_copy():
    t = lockstep.arange(6).reshape(2, 3).float() * 1.5
    a = np.from_dlpack(t)
    assert a.dtype == np.float32 and a.shape == (2, 3)
    np.testing.assert_array_equal(a, np.arange(6).reshape(2, 3) * 1.5)
    b = np.from_dlpack(t)
    assert a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    i = np.from_dlpack(lockstep.arange(5))
    assert i.dtype == np.int64 and i.tolist() == [0, 1, 2, 3, 4]


def test_torch_round_trips_f32_i64_bf16():
    torch = pytest.importorskip("torch")
    for t, dtype in [(lockstep.randn(3, 4), torch.float32), (lockstep.arange(7), torch.int64),
                     (lockstep.randn(5).to(lockstep.bfloat16), torch.bfloat16)]:
        x = torch.from_dlpack(t)
        assert x.dtype == dtype and tuple(x.shape) == t.shape
        assert torch.equal(x.float(), torch.tensor(t.float().tolist()))
        back = lockstep.from_dlpack(x)
        assert back.dtype == t.dtype and back.float().tolist() == t.float().tolist()
    # The same memory: a write through torch is what lockstep's next program reads.
    t = lockstep.zeros(3)
    torch.from_dlpack(t)[1] = 7.0
    assert (t * 2).tolist() == [0.0, 14.0, 0.0]


def test_an_export_is_never_updated_in_place_and_no_update_is_lost():
    lin = lockstep.nn.Linear(64, 64)
    opt = lockstep.optim.SGD(lin.parameters(), lr=0.1)
    x = lockstep.randn(8, 64)

    def train(n):
        for _ in range(n):
            with lockstep.step():
                opt.zero_grad()
                lin(x).square().mean().backward()
                opt.step()
        lockstep.wait()

    train(2)
    exported = np.from_dlpack(lin.weight)
    snapshot = exported.copy()
    seen_torn = []

    def reader():  # reads the export while steps update the weight
        for _ in range(2000):
            if not np.array_equal(exported, snapshot):
                seen_torn.append(True)
                return

    th = threading.Thread(target=reader)
    th.start()
    train(5)
    th.join()
    assert not seen_torn
    np.testing.assert_array_equal(exported, snapshot)  # the export keeps its values
    assert not np.array_equal(lin.weight.numpy(), snapshot)  # and the updates happened
    # Once the export is gone, updates go back to being made in place.
    del exported
    gc.collect()
    before = lockstep.metrics.counter("in_place_outputs")
    train(2)
    assert lockstep.metrics.counter("in_place_outputs") > before


def test_from_dlpack_refuses_what_it_cannot_take():
    with pytest.raises(lockstep.Error, match="contiguous"):
        lockstep.from_dlpack(np.arange(12.0).reshape(3, 4)[:, ::2])
    with pytest.raises(lockstep.Error, match="dtype"):
        lockstep.from_dlpack(np.zeros(3, np.float16))


def test_writes_through_the_export_of_a_copy_leave_the_original():
    torch = pytest.importorskip("torch")
    w = lockstep.tensor([1.0, 2.0, 3.0])
    for copy in [w.clone(), lockstep.cat([w]), w.reshape(3), w.to(lockstep.float32)]:
        torch.from_dlpack(copy)[0] = 100.0
        assert w.tolist() == [1.0, 2.0, 3.0]
        assert copy.tolist() == [100.0, 2.0, 3.0]
    c = w.clone()
    np.from_dlpack(w)  # a read-only look: the clone keeps the value
    torch.from_dlpack(w)[1] = 7.0
    assert c.tolist() == [1.0, 2.0, 3.0] and w.tolist() == [1.0, 7.0, 3.0]
