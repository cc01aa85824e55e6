"""The calls entered below pybind11's dispatcher (python/src/fast_calls.cpp): operators, the
elementwise functions of one tensor and a built-in layer called on one tensor give what the
general path gives, for every form of operand, checked against NumPy; every other form falls
through to the general path; errors name the user's line; objects are freed exactly once."""
import gc
import sys
import weakref

import numpy as np
import pytest

import lockstep


def line_of(marker):
    return [i for i, s in enumerate(open(__file__), 1) if s.rstrip().endswith("# " + marker)][0]


A = np.arange(1, 7, dtype=np.float32).reshape(2, 3) / 4
B = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3) + 0.1


def t(a):
    return lockstep.tensor(a)


OPERATORS = [
    ("+", lambda a, b: a + b, np.add),
    ("-", lambda a, b: a - b, np.subtract),
    ("*", lambda a, b: a * b, np.multiply),
    ("/", lambda a, b: a / b, np.divide),
]


@pytest.mark.parametrize("name,op,ref", OPERATORS, ids=[o[0] for o in OPERATORS])
def test_operators_on_tensors_numbers_and_parameters_match_numpy(name, op, ref):
    x, y = t(A), t(B)
    p = lockstep.nn.Parameter(t(B))
    cases = [
        (x, y, A, B), (x, 2.5, A, np.float32(2.5)), (2.5, x, np.float32(2.5), A),
        (x, 3, A, np.float32(3)), (3, x, np.float32(3), A), (x, True, A, np.float32(1)),
        (x, p, A, B), (p, x, B, A), (p, 2.0, B, np.float32(2.0)),
        # NumPy scalars: a float64 is a Python float; an int64 takes the general path.
        (x, np.float64(1.5), A, np.float32(1.5)), (x, np.int64(2), A, np.float32(2)),
    ]
    for a, b, ra, rb in cases:
        got = op(a, b)
        assert isinstance(got, lockstep.Tensor)
        np.testing.assert_allclose(got.numpy(), ref(ra, rb), rtol=1e-6, err_msg=name)


def test_integer_and_mixed_dtypes_promote_as_on_the_general_path():
    i = lockstep.tensor(np.array([1, 2, 3], dtype=np.int64))
    assert (i + 1).dtype == lockstep.int64 and (i + 1).tolist() == [2, 3, 4]
    assert (i * 2.5).dtype == lockstep.float32
    assert (i / 2).dtype == lockstep.float32 and (i / 2).tolist() == [0.5, 1.0, 1.5]
    big = 2**70  # beyond int64: the general path decides (as before)
    with pytest.raises(TypeError):
        i + big


def test_unary_operators_functions_and_methods_match_numpy():
    x = t(B)
    np.testing.assert_allclose((-x).numpy(), -B)
    np.testing.assert_allclose(lockstep.neg(x).numpy(), -B)
    np.testing.assert_allclose(x.neg().numpy(), -B)
    np.testing.assert_allclose(lockstep.relu(x).numpy(), np.maximum(B, 0))
    np.testing.assert_allclose(x.relu().numpy(), np.maximum(B, 0))
    np.testing.assert_allclose(lockstep.exp(x).numpy(), np.exp(B), rtol=1e-6)
    np.testing.assert_allclose(x.tanh().numpy(), np.tanh(B), rtol=1e-6)
    np.testing.assert_allclose(lockstep.abs(x).numpy(), np.abs(B))
    np.testing.assert_allclose(lockstep.add(x, 1.0).numpy(), B + 1)
    np.testing.assert_allclose(lockstep.mul(2.0, x).numpy(), 2 * B)
    np.testing.assert_allclose(lockstep.maximum(x, t(A)).numpy(), np.maximum(A, B))
    np.testing.assert_allclose(x.sub(t(A)).numpy(), B - A)
    # Keywords and other forms reach the general path.
    np.testing.assert_allclose(lockstep.neg(input=x).numpy(), -B)
    np.testing.assert_allclose(lockstep.add(x, other=t(A)).numpy(), A + B)
    np.testing.assert_allclose((t(A) @ t(B).T).numpy(), A @ B.T, rtol=1e-6)


def test_wrong_operands_give_the_same_errors_as_before():
    x = t(A)
    with pytest.raises(TypeError):
        lockstep.neg(3.0)
    with pytest.raises(TypeError):
        lockstep.relu()
    with pytest.raises(TypeError):
        x + "a"
    with pytest.raises(TypeError):
        "a" - x
    with pytest.raises(TypeError):
        x @ 2.0
    assert lockstep.neg.__name__ == "neg" and "neg" in lockstep.neg.__doc__


def test_an_error_from_an_operator_names_the_users_line():
    x, y = lockstep.randn(2, 3), lockstep.randn(4, 5)
    with pytest.raises(lockstep.Error) as e:
        x + y  # BROADCAST
    assert "test_fast_calls.py:%d" % line_of("BROADCAST") in str(e.value)
    with pytest.raises(lockstep.Error) as e:
        x @ y  # MATMUL
    assert "test_fast_calls.py:%d" % line_of("MATMUL") in str(e.value)


def test_a_layer_called_on_one_tensor_is_its_forward_and_names_the_line():
    lin = lockstep.nn.Linear(3, 2)
    x = t(A)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    np.testing.assert_allclose(lin(x).numpy(), A @ w.T + b, rtol=1e-5)
    np.testing.assert_allclose(lin.forward(x).numpy(), lin(x).numpy())
    with pytest.raises(lockstep.Error) as e:
        lin(lockstep.randn(2, 5))  # LAYER
    assert "test_fast_calls.py:%d" % line_of("LAYER") in str(e.value)
    # Other forms take Module.__call__: keywords, a NumPy array (refused naming the conversion).
    np.testing.assert_allclose(lin(input=x).numpy(), lin(x).numpy())
    with pytest.raises(TypeError, match="from_numpy"):
        lin(A)


def test_a_subclass_of_a_layer_keeps_its_own_forward():
    class Doubled(lockstep.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2.0

    m = Doubled(3, 2)
    x = t(A)
    np.testing.assert_allclose(m(x).numpy(), m.forward(x).numpy(), rtol=1e-6)
    np.testing.assert_allclose(m(x).numpy(), 2 * (A @ m.weight.numpy().T + m.bias.numpy()),
                               rtol=1e-5)


def test_a_subclass_of_tensor_with_its_own_operator_keeps_it():
    class Loud(lockstep.Tensor):
        def __add__(self, other):
            return "mine"

    lockstep._lockstep._install_fast_slots(Loud)
    x = Loud(t(A))
    assert x + 1.0 == "mine"
    np.testing.assert_allclose((x * 2.0).numpy(), A * 2)
    with pytest.raises(TypeError):
        lockstep._lockstep._install_fast_slots(int)


def test_in_place_methods_return_the_same_object():
    x = t(A)
    assert x.add_(1.0) is x and x.mul_(t(B)) is x and x.zero_() is x and x.fill_(2.0) is x
    assert x.copy_(t(B)) is x and x.requires_grad_() is x
    p = lockstep.nn.Parameter(t(A))
    assert p.requires_grad_(False) is p
    z = t(B)
    y = z
    y += 1.0
    assert y is z
    np.testing.assert_allclose(z.numpy(), B + 1)


def test_every_result_is_freed_once_and_weak_references_see_it_go():
    x, p = t(A), lockstep.nn.Parameter(t(B))
    lin = lockstep.nn.Linear(3, 3)
    gc.collect()  # earlier tests' tensors (each instance holds a reference to its type)
    before = sys.getrefcount(lockstep.Tensor), sys.getrefcount(lockstep.nn.Parameter)
    for _ in range(200):
        for make in (lambda: x + x, lambda: -p, lambda: lockstep.relu(x), lambda: lin(x),
                     lambda: x.sum(0), lambda: lockstep.nn.Parameter(x), lambda: x.add_(0.0)):
            make()
    gc.collect()
    assert (sys.getrefcount(lockstep.Tensor), sys.getrefcount(lockstep.nn.Parameter)) == before
    y = x * 3.0
    gone = []
    r = weakref.ref(y, lambda _: gone.append(True))
    assert r() is y
    del y
    assert gone == [True] and r() is None


def test_a_training_step_through_the_fast_calls_matches_numpy():
    # y = relu(x W^T + b); loss = sum(y * 0.5 - 1.0) / n: its gradient against NumPy's.
    lin = lockstep.nn.Linear(3, 4)
    w, b = lin.weight.numpy().copy(), lin.bias.numpy().copy()
    opt = lockstep.optim.SGD(lin.parameters(), lr=0.1)
    with lockstep.step():
        opt.zero_grad()
        y = lockstep.relu(lin(t(A)))
        loss = (y * 0.5 - 1.0).sum() / 6.0
        loss.backward()
        opt.step()
    z = A @ w.T + b
    g = (z > 0) * 0.5 / 6.0
    np.testing.assert_allclose(lin.weight.numpy(), w - 0.1 * g.T @ A, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(lin.bias.numpy(), b - 0.1 * g.sum(0), rtol=1e-5, atol=1e-7)
