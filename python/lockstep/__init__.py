"""lockstep: lazy tensors and explicit, transactional training steps.

Ops only record a graph; at a step boundary the whole step (forward, backward, optimizer update)
is compiled once, cached and run as one program::

    import lockstep
    for epoch in range(1, 3):
        for step, (data, target) in enumerate(loader):
            with lockstep.step():
                optimizer.zero_grad()
                loss = loss_fn(model(data), target)
                loss.backward()
                optimizer.step()

The C++ library does the work; this package only gives it Python's idioms. Errors are
lockstep.Error (a RuntimeError) and name the .py line that recorded the op.
"""

import atexit as _atexit
import builtins as _builtins
import functools as _functools
import os as _os
import sys as _sys

# How the OpenMP threads wait (lockstep/runtime.h, apply_thread_wait_default): libgomp reads it
# once, when it loads with the extension below; set here, before that, unless the environment
# chooses. Without effect when libgomp is loaded already (torch imported first).
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "10000"

from . import _lockstep as _C  # noqa: E402

# Frames in this package are not the user's: the extension's frames hook names the caller's line.
_C._set_package_dir(_os.path.dirname(_os.path.abspath(__file__)) + _os.sep)

from ._reexport import reexport as _reexport  # noqa: E402

_skip = {"nn", "optim", "models", "metrics", "debug", "dist", "data", "profiler", "amp"}
for _name in dir(_C):
    if not _name.startswith("_") and _name not in _skip:
        globals()[_name] = getattr(_C, _name)

Error = _C.Error
Tensor = _C.Tensor
_no_value = object()


class step:
    """A transactional training step, as a context manager or a decorator.

    Pending work is synced on entry, so the step's program covers exactly what happens inside;
    on normal exit the step is synced (enqueued to run while the caller goes on). If an exception
    (KeyboardInterrupt included) leaves it, every tensor the step changed is restored bit for bit,
    tensors it created are poisoned, and the exception propagates. ``autocast=lockstep.bfloat16``
    records the step's ops under autocast.
    """

    def __new__(cls, fn=None, *, autocast=None):
        self = super().__new__(cls)
        self._autocast = autocast
        self._active = []
        if fn is not None:  # @lockstep.step without parentheses
            return self(fn)
        return self

    # __enter__ and __exit__ are C++ (_install_step_protocol below): an interrupt cannot land
    # between __exit__'s taking the step and its commit or rollback.

    def __call__(self, fn):
        autocast = self._autocast

        @_functools.wraps(fn)
        def in_step(*args, **kwargs):
            with step(autocast=autocast):
                return fn(*args, **kwargs)

        return in_step


_C._install_step_protocol(step)


class autocast:
    """Records ops under bf16 autocast (matmuls and convolutions in bfloat16, as torch's)."""

    def __init__(self, dtype=None):
        self._dtype = bfloat16 if dtype is None else dtype  # noqa: F821 (from the extension)
        self._scopes = []

    def __enter__(self):
        s = _C._Autocast(self._dtype)
        s.enter()
        self._scopes.append(s)
        return self

    def __exit__(self, *exc):
        self._scopes.pop().exit()
        return False


class no_grad:
    """Ops recorded inside record no gradient history (a context manager or a decorator)."""

    def __init__(self):
        self._scopes = []

    def __enter__(self):
        s = _C._NoGrad()
        s.enter()
        self._scopes.append(s)
        return self

    def __exit__(self, *exc):
        self._scopes.pop().exit()
        return False

    def __call__(self, fn):
        @_functools.wraps(fn)
        def without_grad(*args, **kwargs):
            with no_grad():
                return fn(*args, **kwargs)

        return without_grad


class _Data:
    """``p.data`` as PyTorch's, for updates by hand (``p.data.add_(p.grad, alpha=-lr)``): its
    in-place methods (names ending in ``_``) change p with no gradient recorded; anything else is
    read from p's value, detached. lockstep's tensors are never views, so it is a handle on p, not
    a tensor of its own."""

    __slots__ = ("_tensor",)

    def __init__(self, tensor):
        object.__setattr__(self, "_tensor", tensor)

    def __getattr__(self, name):
        if name.endswith("_") and not name.startswith("_"):
            method = getattr(self._tensor, name)

            def in_place(*args, **kwargs):
                with no_grad():
                    method(*args, **kwargs)
                return self

            return in_place
        return getattr(self._tensor.detach(), name)

    def __repr__(self):
        return repr(self._tensor.detach())

    def __array__(self, dtype=None):
        return self._tensor.detach().__array__(dtype)


def _set_data(tensor, value):
    with no_grad():
        tensor.copy_(value._tensor if isinstance(value, _Data) else value)


# Every other Tensor method is defined in the extension (python/src/tensor.cpp).
Tensor.data = property(_Data, _set_data)


class device(str):
    """torch.device, as far as a script on one machine uses it: ``device("cpu")``,
    ``device("cuda", 0)``, its ``.type`` and ``.index``; it is the device's name, so it goes
    wherever lockstep takes one."""

    def __new__(cls, type, index=None):
        return super().__new__(cls, type if index is None else "%s:%d" % (type, index))

    @property
    def type(self):
        return self.split(":")[0]

    @property
    def index(self):
        return _builtins.int(self.split(":")[1]) if ":" in self else None  # int is a dtype here


from . import nn, optim, models, metrics, debug, dist, data, profiler, amp  # noqa: E402,F401
from .serialization import save, load  # noqa: E402,F401


def _drain_at_exit():
    # Queued programs and step closures run before Python finalizes: a closure needs the
    # interpreter, and an error nobody read is shown instead of lost, and fails the process (as
    # in C++: status 1), since nothing else reported it.
    failed = False
    try:
        _C.wait()
    except BaseException as e:  # noqa: BLE001 - reported, the process is ending anyway
        print("lockstep: error: %s\nlockstep: raised after the last blocking point of its thread "
              "(a read, lockstep.wait(), a sync), so nothing reported it: the process exits with "
              "status 1" % e, file=_sys.stderr)
        failed = True
    # MPI ends here, while the interpreter and the module's threads are still whole.
    if _C.dist.is_initialized():
        _C.dist.finalize()
    if failed:
        _sys.stdout.flush()
        _sys.stderr.flush()
        _os._exit(1)


_atexit.register(_drain_at_exit)
