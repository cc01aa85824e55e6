"""x[key] and x[key] = v against PyTorch (Debian's python3-torch): a seeded fuzz over every kind of
key (integers, slices, None, ..., bools, masks and index tensors as lockstep tensors, NumPy arrays
and lists) on tensors of 1-4 axes, valid and invalid, and the bugs of issue 52 one by one."""
import numpy as np
import pytest

import lockstep

torch = pytest.importorskip("torch")

# What lockstep may raise for a key PyTorch refuses: never a crash.
ERRORS = (lockstep.Error, IndexError, TypeError, ValueError)


# ---- the fuzz ----------------------------------------------------------------------------------
# A key is a list of specs, each made into the same Python object for both libraries (or into a
# lockstep tensor and a torch tensor of the same values).

def _index_values(rng, size, shape):
    lo, hi = -size, size
    if size == 0 or rng.random() < 0.06:  # sometimes out of range
        lo, hi = -size - 2, size + 2
    if hi <= lo:
        hi = lo + 1
    return rng.integers(lo, hi, size=shape)


def _random_key(rng, shape):
    specs, axis, ellipses = [], 0, 0
    for _ in range(rng.integers(0, len(shape) + 2)):
        size = shape[axis] if axis < len(shape) else 1
        kind = rng.choice(["int", "slice", "slice", "none", "ellipsis", "bool", "mask", "index",
                           "index", "index0d"])
        form = rng.choice(["lockstep", "numpy", "list"])
        if kind == "int":
            specs.append(("int", int(_index_values(rng, size, ()))))
            axis += 1
        elif kind == "slice":
            pick = lambda: None if rng.random() < 0.4 else int(rng.integers(-6, 7))
            step = None if rng.random() < 0.5 else int(rng.choice([1, 2, 3, 0, -1] if rng.random()
                                                                 < 0.1 else [1, 2, 3]))
            specs.append(("slice", slice(pick(), pick(), step)))
            axis += 1
        elif kind == "none":
            specs.append(("none", None))
        elif kind == "ellipsis":
            if ellipses:
                continue  # two are an error in NumPy and lockstep, not in PyTorch 1.13
            ellipses += 1
            specs.append(("ellipsis", Ellipsis))
            axis = len(shape)  # the rest of the key addresses the last axes: sizes are guesses
        elif kind == "bool":
            specs.append(("bool", bool(rng.random() < 0.7)))
        elif kind == "mask":
            # PyTorch 1.13 misplaces a mask of two axes after an Ellipsis (it refuses matching
            # shapes: "the mask [3, 2] at index 0 does not match ... [3, 2] at index 1").
            k = int(rng.integers(1, 2 if ellipses else 3))
            dims = [shape[a] if a < len(shape) else 2 for a in range(axis, axis + k)]
            if rng.random() < 0.05:
                dims[0] += 1  # a mask that does not fit
            specs.append(("mask", rng.random(dims) < 0.5, form))
            axis += k
            if k > 1:
                break  # PyTorch 1.13 takes what follows for the mask's second axis (see below)
        elif kind == "index":
            ishape = [(2,), (3,), (1,), (0,), (2, 3), (3, 1), (1, 2)][rng.integers(0, 7)]
            dtype = np.int32 if rng.random() < 0.2 else np.int64
            specs.append(("index", _index_values(rng, size, ishape).astype(dtype), form))
            axis += 1
        else:  # a 0-d index tensor: an integer
            specs.append(("index", np.array(_index_values(rng, size, ())), "lockstep"))
            axis += 1
    return specs


def _objects(specs, lib):
    out = []
    for spec in specs:
        if spec[0] in ("mask", "index"):
            values, form = spec[1], spec[2]
            if form == "lockstep" or values.ndim == 0:
                out.append(lockstep.tensor(values) if lib == "lockstep" else
                           torch.from_numpy(values if values.dtype == bool else
                                            values.astype(np.int64)))
            elif form == "numpy":
                out.append(values)
            else:
                out.append(values.tolist())
        else:
            out.append(spec[1])
    return out


def _key(objects, how):
    if how == "tuple" or len(objects) != 1:
        return tuple(objects)
    return objects[0]


def _outcome(f):
    """(True, value) or (False, exception)."""
    try:
        return True, f()
    except Exception as e:  # noqa: BLE001: every exception is compared
        return False, e


def _x(rng, shape):
    dtype = rng.choice(["float32", "int64", "bool"], p=[0.6, 0.3, 0.1])
    a = np.asarray(rng.standard_normal(shape) * 10, dtype=np.float32)
    return np.asarray(a.astype(dtype) if dtype != "bool" else a > 0)


def _check(where, ok_t, t, ok_l, l):
    if not ok_t:
        assert not ok_l, "%s: PyTorch raised %r, lockstep did not" % (where, t)
        assert isinstance(l, ERRORS), "%s: lockstep raised %r" % (where, l)
        return
    assert ok_l, "%s: PyTorch gave %s, lockstep raised %r" % (where, tuple(t.shape), l)
    assert l.shape == t.shape, (where, l.shape, t.shape)
    assert l.dtype == t.dtype, (where, l.dtype, t.dtype)
    np.testing.assert_array_equal(l, t, err_msg=where)


def _fuzz_case(rng, i):
    shape = tuple(int(s) for s in rng.integers(0, 5, size=rng.integers(1, 5)))
    if rng.random() < 0.8:
        shape = tuple(max(s, 1) for s in shape)
    a = _x(rng, shape)
    specs = _random_key(rng, shape)
    how = rng.choice(["tuple", "bare"])
    key_t, key_l = _key(_objects(specs, "torch"), how), _key(_objects(specs, "lockstep"), how)
    where = "case %d: x%s[%s]" % (i, shape, ", ".join(repr(s[1]) for s in specs))

    ok_t, t = _outcome(lambda: torch.from_numpy(a.copy())[key_t].numpy())
    ok_l, l = _outcome(lambda: lockstep.tensor(a)[key_l].numpy())
    _check(where + " (get)", ok_t, t, ok_l, l)

    # x[key] = v, with v a number or a tensor of the indexed shape or one that broadcasts to it.
    if ok_t:
        target = t.shape
        positions = torch.arange(max(a.size, 1)).reshape(a.shape)[key_t] if a.size else None
        repeats = positions is not None and positions.numel() != positions.unique().numel()
        choice = rng.random()
        if choice < 0.3 or repeats:
            v_np = a.dtype.type(rng.standard_normal() * 10)
            v_t = v_l = v_np.item()
        else:
            vshape = list(target)
            if choice < 0.5 and vshape:
                vshape = vshape[int(rng.integers(0, len(vshape) + 1)):]
            elif choice < 0.7:
                vshape = [1 if rng.random() < 0.4 else s for s in vshape]
            elif choice < 0.75 and t.size:  # (PyTorch takes any values for no entries)
                vshape = vshape + [2]  # does not fit
            v_np = np.asarray(_x(rng, tuple(vshape)).astype(a.dtype))
            v_t, v_l = torch.from_numpy(v_np.copy()), lockstep.tensor(v_np)
    else:
        v_t = v_l = 1

    def set_torch():
        x = torch.from_numpy(a.copy())
        x[key_t] = v_t
        return x.numpy()

    def set_lockstep():
        x = lockstep.tensor(a)
        x[key_l] = v_l
        return x.numpy()

    ok_t, t = _outcome(set_torch)
    ok_l, l = _outcome(set_lockstep)
    _check(where + " = %r (set)" % (v_t,), ok_t, t, ok_l, l)


def test_fuzz_getitem_and_setitem_match_pytorch():
    rng = np.random.default_rng(52)
    for i in range(4000):
        _fuzz_case(rng, i)


# ---- the bugs of issue 52, one by one ---------------------------------------------------------

def test_tensors_arrays_and_lists_as_keys_do_not_crash():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = lockstep.tensor(a)
    assert x[lockstep.tensor([True, False, True])].tolist() == a[[True, False, True]].tolist()
    assert x[lockstep.tensor([2, 0])].tolist() == a[[2, 0]].tolist()
    assert x[:, lockstep.tensor([3, 1])].tolist() == a[:, [3, 1]].tolist()
    assert x[np.array([0, 2])].tolist() == a[[0, 2]].tolist()
    assert x[[0, 2]].tolist() == a[[0, 2]].tolist()
    assert x[x > 5].tolist() == a[a > 5].tolist()


def test_uint8_tensors_are_masks_as_in_pytorch():
    a = np.arange(12).reshape(3, 4)
    m = np.array([1, 0, 1], np.uint8)
    x = lockstep.tensor(a)
    assert x[lockstep.tensor(m)].tolist() == a[m.astype(bool)].tolist()
    x[lockstep.tensor(m)] = 0
    b = a.copy()
    b[m.astype(bool)] = 0
    assert x.tolist() == b.tolist()


def test_a_one_element_index_tensor_keeps_its_axis():
    x = lockstep.arange(12).reshape(3, 4)
    assert x[lockstep.tensor([2])].shape == (1, 4)
    assert x[lockstep.tensor(2)].shape == (4,)  # a 0-d tensor is an integer, as in PyTorch
    assert x[lockstep.tensor(-1)].tolist() == [8, 9, 10, 11]


def test_advanced_indices_broadcast_and_go_first_when_apart():
    a = np.arange(120).reshape(2, 3, 4, 5)
    x, t = lockstep.tensor(a), torch.from_numpy(a)
    i, j = [[0], [1]], [2, 0, 1]
    for key in [(slice(None), i, j), (i, slice(None), j), (Ellipsis, i, j), (0, slice(None), j),
                (i, None, j), (slice(1, None), [[0], [1]], [0, 1, 2])]:
        np.testing.assert_array_equal(x[key].numpy(), t[key].numpy(), err_msg=repr(key))


def test_index_tensors_stay_lazy_and_fail_at_the_read():
    x = lockstep.arange(12).reshape(3, 4)
    y = x[lockstep.tensor([0, 5])]  # recorded: no read, no error yet
    assert y.shape == (2, 4) and y.is_pending and x.is_pending
    with pytest.raises(lockstep.Error, match="out of range"):
        y.numpy()


def test_integers_out_of_range_name_the_axis_and_size():
    x = lockstep.zeros(2, 3)
    with pytest.raises(lockstep.Error, match="axis 1 of size 3"):
        x[0, 3]
    with pytest.raises(lockstep.Error, match="slice step"):
        x[::-1]
    with pytest.raises(lockstep.Error, match="valid indices"):
        x[1.5]
    with pytest.raises(lockstep.Error, match="i64, i32, bool or u8"):
        x[lockstep.tensor([1.0])]
    with pytest.raises(lockstep.Error, match="2 ellipses"):
        x[..., 0, ...]  # as NumPy (PyTorch 1.13 takes it)


def test_setitem_replaces_the_value_in_place():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x, t = lockstep.tensor(a), torch.from_numpy(a.copy())
    other = lockstep.Tensor(x)  # another handle to the same tensor sees the change
    for key, v in [((slice(None), slice(1, 3), 0), -1.0), ((0, [2, 0]), 7.0),
                   ((a[..., 0] > 10,), 0.5), ((Ellipsis, [1, 3]), [[9.0, 8.0]])]:
        x[key] = v if not isinstance(v, list) else lockstep.tensor(v)
        t[key] = v if not isinstance(v, list) else torch.tensor(v)
    np.testing.assert_array_equal(other.numpy(), t.numpy())


def test_a_mask_assignment_of_a_number_reads_nothing():
    x = lockstep.arange(6).reshape(2, 3)
    mask = (x % 2) == 0
    x[mask] = -1
    x[:, mask[0]] = lockstep.tensor([7])
    assert x.is_pending and mask.is_pending
    assert x.tolist() == [[7, 1, 7], [7, -1, 7]]


def test_gradients_flow_as_pytorch():
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    for key in [[2, 0], (slice(None), [1, 1, 3]), (a > 0,), (a[:, 0] > 0, slice(1, 3))]:
        x, xt = lockstep.tensor(a).requires_grad_(), torch.from_numpy(a).requires_grad_()
        (x[key] * x[key]).sum().backward()
        (xt[key] * xt[key]).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-6, err_msg=repr(key))
    # Assignment: the overwritten entries get no gradient, the values get theirs.
    x, xt = lockstep.tensor(a).requires_grad_(), torch.from_numpy(a).requires_grad_()
    v, vt = lockstep.tensor(b).requires_grad_(), torch.from_numpy(b).requires_grad_()
    y, yt = x * 2, xt * 2
    y[[2, 0]] = v * 3
    yt[[2, 0]] = vt * 3
    (y * y).sum().backward()
    (yt * yt).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(v.grad.numpy(), vt.grad.numpy(), rtol=1e-6)


def test_index_put_as_torch():
    a = np.zeros((3, 4), np.float32)
    x, t = lockstep.tensor(a), torch.from_numpy(a)
    i, v = [0, 2, 0], [1.0, 2.0, 3.0]
    got = lockstep.index_put(x, (lockstep.tensor(i), None), lockstep.tensor(v)[:, None],
                             accumulate=True)
    want = torch.index_put(t, (torch.tensor(i), ), torch.tensor(v)[:, None], accumulate=True)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    x.index_put_((lockstep.tensor([1]),), lockstep.tensor(5.0))
    assert x.tolist()[1] == [5.0] * 4


def test_indices_after_a_mask_of_two_axes_address_the_next_axis_as_numpy():
    # PyTorch 1.13 moves on by one axis after any mask, so it refuses these keys ("The shape of
    # the mask [2, 3] at index 1 does not match"); lockstep reads them as NumPy does. (A NumPy
    # array of two axes alone as the key is a tuple of its rows, in both.)
    a = np.arange(24).reshape(2, 3, 4)
    m = np.ones((2, 3), bool)
    x = lockstep.tensor(a)
    for key in [(m, 0), (m, slice(1, 3)), (m, None), (m, Ellipsis, 0), (m, [0, 1, 2, 3, 0, 1])]:
        np.testing.assert_array_equal(x[key].numpy(), a[key], err_msg=repr(key))


def test_hostile_keys_and_values_raise_and_never_crash():
    x = lockstep.zeros(2, 3)
    keys = [2**70, -2**70, "a", b"a", object(), {0: 1}, 1.5, np.array([1.5]), np.array(["a"]),
            lockstep.tensor([1.5]), (0, 0, 0), slice(0, 1, 0), ([0, [1, 2]],),
            lockstep.tensor([[True]]), slice(lockstep.tensor([1, 2]), None), (Ellipsis, Ellipsis),
            lockstep.tensor([0]).to(lockstep.bfloat16)]
    for key in keys:
        with pytest.raises(ERRORS):
            x[key]
        with pytest.raises(ERRORS):
            x[key] = 1.0
    for value in ["a", None, object(), lockstep.zeros(4), [[1.0, 2.0]]]:
        with pytest.raises(ERRORS):
            x[0] = value
    assert x.tolist() == [[0.0] * 3] * 2  # nothing was changed
    leaf = lockstep.zeros(2).requires_grad_()
    with pytest.raises(lockstep.Error, match="requires grad"):
        leaf[0] = 1.0  # as PyTorch's "a leaf Variable that requires grad"


def test_masks_inside_a_step():
    x = lockstep.arange(6).reshape(2, 3)
    with lockstep.step():
        y = x[x > 2]  # reads the mask: a sync inside the step
        x[x > 3] = 0
    assert y.tolist() == [3, 4, 5]
    assert x.tolist() == [[0, 1, 2], [3, 0, 0]]
