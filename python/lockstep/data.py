"""lockstep.data: datasets and loaders (the C++ library's), and batches from Python iterables.

``lockstep.data.DataLoader(lockstep.data.dataset("fake", ...), batch_size=...)`` yields
``(images, labels)`` prepared by worker threads and uploaded ahead of the step that uses them.
``lockstep.data.DeviceLoader(iterable)`` does the same for any Python iterable of NumPy arrays
(an array, or a tuple, list or dict of them, e.g. a torch DataLoader's NumPy batches).
"""
import queue as _queue
import threading as _threading

from . import _lockstep as _C
from ._reexport import reexport as _reexport

_reexport(globals(), _C.data)


def _to_lockstep(item):
    if isinstance(item, _C.Tensor):
        return item
    if isinstance(item, tuple):
        return tuple(_to_lockstep(x) for x in item)
    if isinstance(item, list):
        return [_to_lockstep(x) for x in item]
    if isinstance(item, dict):
        return {k: _to_lockstep(v) for k, v in item.items()}
    if hasattr(item, "__dlpack__") and not hasattr(item, "__array_interface__"):
        return _C.from_dlpack(item)  # a torch tensor, say
    return _C.from_numpy(item)


class _Failure:
    def __init__(self, error):
        self.error = error


_DONE = object()


class DeviceLoader:
    """Batches of a Python iterable as lockstep tensors, converted (copied into lockstep's
    memory) on a background thread up to ``prefetch`` batches ahead, while the training thread
    records and runs its steps. An error raised by the iterable is raised by the loop that reads
    the batch it failed on. Each ``iter()`` starts a fresh pass over ``iterable``."""

    def __init__(self, iterable, prefetch=2):
        if prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        self._iterable = iterable
        self._prefetch = prefetch

    def __len__(self):
        return len(self._iterable)

    def __iter__(self):
        batches = _queue.Queue(maxsize=self._prefetch)
        stop = _threading.Event()

        def put(item):
            while not stop.is_set():
                try:
                    batches.put(item, timeout=0.1)
                    return True
                except _queue.Full:
                    continue
            return False

        def produce():
            try:
                for item in self._iterable:
                    if not put(_to_lockstep(item)):
                        return
                put(_DONE)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                put(_Failure(e))

        worker = _threading.Thread(target=produce, name="lockstep-device-loader", daemon=True)
        worker.start()
        try:
            while True:
                item = batches.get()
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            stop.set()
            worker.join()
