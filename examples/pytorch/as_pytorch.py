"""Runs a port of this folder with PyTorch itself: while it runs, `import lockstep` (and
lockstep.nn, lockstep.nn.functional, lockstep.optim, lockstep.optim.lr_scheduler) give torch's
modules, and `lockstep.step()` is a context that does nothing. The same file then trains with
either framework, on the same data (standins.py), which is how the tests compare them.

    python3 examples/pytorch/as_pytorch.py examples/pytorch/mnist.py --epochs 1
"""
import contextlib
import os
import runpy
import sys
import types

NAMES = ("", ".nn", ".nn.functional", ".nn.init", ".optim", ".optim.lr_scheduler")


class _Module(types.ModuleType):
    """A module whose names are another's, with some of its own (`extra`) in front."""

    def __init__(self, name, base, extra=None):
        super().__init__(name)
        self._base = base
        self.__dict__.update(extra or {})

    def __getattr__(self, name):
        return getattr(self._base, name)


class _Step(contextlib.nullcontext):
    """lockstep.step() for PyTorch: eager execution has no step boundary."""

    def __init__(self, fn=None, *, autocast=None):
        super().__init__()
        self._fn = fn

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)


def modules(base, overrides=None):
    """The sys.modules entries under which `import lockstep...` gives `base` (the torch or the
    lockstep module), each with the names in overrides[suffix] (e.g. {".nn": {"Dropout": D}})
    in front of the base module's: what the tests use to give both frameworks the same random
    draws."""
    overrides = overrides or {}
    out = {}
    for suffix in NAMES:
        target = base
        for part in suffix.split(".")[1:]:
            target = getattr(target, part)
        extra = dict(overrides.get(suffix, {}))
        if suffix == "" and "step" not in extra and not hasattr(base, "step"):
            extra["step"] = _Step
        out["lockstep" + suffix] = _Module("lockstep" + suffix, target, extra)
    for suffix in NAMES:  # lockstep.nn is an attribute of lockstep, and so on
        parent, _, child = ("lockstep" + suffix).rpartition(".")
        if parent:
            out[parent].__dict__[child] = out["lockstep" + suffix]
    return out


@contextlib.contextmanager
def framework(base, overrides=None):
    """While inside, `import lockstep...` gives these modules; on the way out, those it
    replaced."""
    names = ["lockstep" + suffix for suffix in NAMES]
    saved = {k: sys.modules.pop(k) for k in names if k in sys.modules}
    sys.modules.update(modules(base, overrides))
    try:
        yield
    finally:
        for k in names:
            sys.modules.pop(k, None)
        sys.modules.update(saved)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    import torch
    path = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    with framework(torch):
        runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":
    main()
