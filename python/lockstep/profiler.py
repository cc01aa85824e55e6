"""lockstep.profiler: step timelines as Chrome Trace Event JSON, one file per process
(<dir>/lockstep-<host>-<pid>[-rank<r>].trace.json), to open in https://ui.perfetto.dev or
chrome://tracing. Each step is a ``ProfilerStep#N`` span, as torch.profiler's::

    with lockstep.profiler.trace("traces"):
        for data, target in loader:
            with lockstep.step():
                ...

``level="fine"`` also shows each step of a program's plan (fused trees, matrix products with
their GFLOP/s, convolutions, copies). LOCKSTEP_TRACE=dir traces a whole process.
"""
import contextlib as _contextlib

from . import _lockstep as _C

Level = _C.profiler.Level
start = _C.profiler.start
stop = _C.profiler.stop
enabled = _C.profiler.enabled


class trace:
    """Traces while the ``with`` block runs (start on entry, stop on exit); ``path`` is the file
    written, once the block has ended."""

    def __init__(self, dir, level="coarse"):
        self.dir = dir
        self.level = level
        self.path = None

    def __enter__(self):
        start(self.dir, self.level)
        return self

    def __exit__(self, *exc):
        self.path = stop()
        return False


@_contextlib.contextmanager
def record_function(name):
    """A span of your own on this thread's timeline (as torch.profiler.record_function)."""
    span = _C.profiler._RecordFunction(str(name))
    try:
        yield
    finally:
        del span
