"""Tensors from Python: values against NumPy, indexing, dtypes, reads, errors."""
import numpy as np
import pytest

import lockstep


def test_ops_match_numpy():
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    x, y = lockstep.tensor(a), lockstep.from_numpy(b)
    np.testing.assert_allclose((x @ y).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose((x * 2 - 1).exp().numpy(), np.exp(a * 2 - 1), rtol=1e-5)
    np.testing.assert_allclose(x.sum(1, keepdim=True).numpy(), a.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(lockstep.softmax(x, -1).numpy(),
                               np.exp(a) / np.exp(a).sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose((1 - x).numpy(), 1 - a, rtol=1e-6)
    np.testing.assert_allclose((x ** 2).numpy(), a ** 2, rtol=1e-6)
    np.testing.assert_allclose(x.max().item(), a.max(), rtol=1e-6)
    values, indices = x.max(1)
    np.testing.assert_array_equal(indices.numpy(), a.argmax(1))
    assert (x > 0).dtype == lockstep.bool
    assert np.array_equal(np.asarray(x > 0), a > 0)


def test_basic_indexing_as_numpy():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = lockstep.tensor(a)
    for key in [(slice(None), -1), (Ellipsis, slice(1, 3)), 0, (1, None, slice(None, None, 2)),
                (slice(-2, None), 1, slice(None, -1))]:
        np.testing.assert_array_equal(x[key].numpy(), a[key])
    np.testing.assert_array_equal(x[[0, 1]].numpy(), a[[0, 1]])  # test_indexing.py has more
    with pytest.raises(lockstep.Error, match="valid indices"):
        x[1.5]


def test_dtypes_and_reads():
    assert lockstep.tensor([1, 2]).dtype == lockstep.int64
    assert lockstep.tensor([1.5]).dtype == lockstep.float32
    assert lockstep.tensor(np.zeros(2, np.float64)).dtype == lockstep.float64
    assert lockstep.tensor([True]).dtype == lockstep.bool
    t = lockstep.tensor([[1, 2], [3, 4]])
    assert t.tolist() == [[1, 2], [3, 4]]
    assert t.shape == (2, 2) and t.size(1) == 2 and t.ndim == 2 and t.numel() == 4
    assert isinstance(t.sum().item(), int) and t.sum().item() == 10
    assert lockstep.tensor(2.5).item() == 2.5 and lockstep.tensor(2.5).shape == ()
    assert lockstep.tensor(np.float32(1)).shape == () and lockstep.tensor([[1.0]]).shape == (1, 1)
    h = lockstep.ones(3).to(lockstep.bfloat16)
    with pytest.raises(lockstep.Error, match="bfloat16"):
        h.numpy()
    assert h.float().tolist() == [1.0, 1.0, 1.0]


def test_like_creation_takes_shape_and_dtype():
    x = lockstep.zeros(2, 3, dtype=lockstep.float64)
    lockstep.manual_seed(3)
    z, u = lockstep.randn_like(x), lockstep.rand_like(x)
    assert z.shape == (2, 3) and z.dtype == lockstep.float64 and u.dtype == lockstep.float64
    lockstep.manual_seed(3)
    assert z.tolist() == lockstep.randn(2, 3, dtype=lockstep.float64).tolist()
    assert u.min().item() >= 0 and u.max().item() < 1
    assert lockstep.zeros_like(x).tolist() == [[0.0] * 3] * 2


def test_iteration_yields_rows():
    rows = list(lockstep.tensor([[1, 2], [3, 4], [5, 6]]))
    assert [r.tolist() for r in rows] == [[1, 2], [3, 4], [5, 6]]
    with pytest.raises(TypeError):
        iter(lockstep.tensor(1.0))


def test_iterating_a_pending_tensor_as_indices_computes_it_once():
    # nanoGPT's get_batch: `for i in ix`, each i an index. Rows are made as the loop reaches
    # them, from the tensor's value then: the first read computes ix, the others are host copies.
    lockstep.manual_seed(0)
    ix = lockstep.randint(0, 1000, (12,))
    syncs = lockstep.metrics.counter("syncs")
    got = [int(i) for i in ix]
    assert lockstep.metrics.counter("syncs") - syncs == 1
    assert got == ix.tolist()
    # Its `data[i + 1:i + 1 + block_size]`: exact integer arithmetic on the rows, on the host.
    syncs = lockstep.metrics.counter("syncs")
    assert [(int(i + 1), int(i + 1 + 16)) for i in ix] == [(v + 1, v + 17) for v in got]
    assert lockstep.metrics.counter("syncs") - syncs == 0
    # A change made during the loop is seen by the rows not reached yet, as PyTorch's views see it.
    x = lockstep.tensor([1, 2, 3])
    seen = []
    for r in x:
        seen.append(int(r))
        x[2] = 7
    assert seen == [1, 2, 7]


def test_in_place_updates_every_handle():
    x = lockstep.zeros(3)
    y = lockstep.Tensor(x)
    x += 2
    x.mul_(3)
    assert y.tolist() == [6.0, 6.0, 6.0]


def test_errors_are_lockstep_errors_naming_the_python_line():
    assert issubclass(lockstep.Error, RuntimeError)
    with pytest.raises(lockstep.Error) as e:
        lockstep.ones(2, 3) @ lockstep.ones(4, 5)  # THE LINE
    assert "test_tensor.py:" in str(e.value)
    line = [i for i, s in enumerate(open(__file__), 1) if s.rstrip().endswith("# THE LINE")][0]
    assert f"test_tensor.py:{line}" in str(e.value)


def test_autograd_against_finite_differences():
    a = np.random.default_rng(3).standard_normal(5)
    x = lockstep.tensor(a, dtype=lockstep.float64, requires_grad=True)
    y = (x.tanh() * x).sum()
    y.backward()
    eps = 1e-6
    f = lambda v: (np.tanh(v) * v).sum()  # noqa: E731
    fd = [(f(a + eps * np.eye(5)[i]) - f(a - eps * np.eye(5)[i])) / (2 * eps) for i in range(5)]
    np.testing.assert_allclose(x.grad.numpy(), fd, rtol=1e-6)


def test_clone_keeps_every_value_bit_for_bit():
    f32 = np.array([-0.0, 0.0, 1.5, np.inf], dtype=np.float32)
    f32 = np.concatenate([f32, np.array([0x7FC01234, 0xFFA00001], dtype=np.uint32).view(np.float32)])
    arrays = [f32, np.array([-0.0, np.nan, -np.inf], dtype=np.float64),
              np.array([-(2**31), 7, 2**31 - 1], dtype=np.int32),
              np.array([-(2**63), 7, 2**63 - 1], dtype=np.int64), np.array([True, False])]
    for a in arrays:
        x = lockstep.from_numpy(a)
        c = x.clone()
        assert c.dtype == x.dtype and not c.is_same(x)
        assert c.numpy().tobytes() == a.tobytes(), a.dtype
    b = lockstep.tensor([-0.0, 1.0, float("nan")]).to(lockstep.bfloat16)
    assert (b.clone().to(lockstep.float32).numpy().tobytes()
            == b.to(lockstep.float32).numpy().tobytes())
    assert np.signbit(lockstep.clone(lockstep.tensor([-0.0])).numpy()[0])  # was -0.0 + 0 = +0.0


def test_clone_is_a_new_tensor_that_in_place_updates_of_the_original_leave():
    x = lockstep.tensor([1.0, -0.0])
    c = x.clone()
    x.add_(1)
    x += 1
    assert x.tolist() == [3.0, 2.0]
    assert c.numpy().tobytes() == np.array([1.0, -0.0], dtype=np.float32).tobytes()
    c.mul_(2)
    assert x.tolist() == [3.0, 2.0]


def test_gradients_flow_through_clone_as_through_torchs():
    x = lockstep.tensor([1.0, -2.0, 3.0], requires_grad=True)
    c = x.clone()
    assert c.requires_grad
    (c * c).sum().backward()
    assert x.grad.tolist() == [2.0, -4.0, 6.0]
    assert c.grad is None  # not a leaf, as torch's clone
    assert not lockstep.ones(2).clone().requires_grad

