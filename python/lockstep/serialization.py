"""lockstep.save and lockstep.load, as torch.save and torch.load for what a training script saves:
tensors and the containers around them (a state_dict, a checkpoint dict with the optimizer's
state, numbers, strings). A whole Module is refused: save its state_dict. Not lockstep's own
checkpoint format (save_checkpoint/load_checkpoint, atomic and checksummed)."""
import io
import pickle

from . import _lockstep as _C


def _rebuild_tensor(array, requires_grad):
    t = _C.from_numpy(array)
    if requires_grad:
        t.requires_grad_(True)
    return t


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, _C.Tensor):
            return _rebuild_tensor, (obj.numpy(), obj.requires_grad)
        if isinstance(obj, (_C.nn.Module, _C.optim.Optimizer)):
            raise _C.Error("lockstep.save: a %s cannot be saved whole; save its state_dict() and "
                           "load it with load_state_dict()" % type(obj).__name__)
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == __name__ and name == "_rebuild_tensor":
            return _rebuild_tensor
        return super().find_class(module, name)


def save(obj, f, pickle_module=None, pickle_protocol=2):
    """Writes obj to f (a path or a binary file): tensors by value, as NumPy arrays."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=max(pickle_protocol, 2)).dump(obj)
    if hasattr(f, "write"):
        f.write(buf.getvalue())
    else:
        with open(f, "wb") as out:
            out.write(buf.getvalue())


def load(f, map_location=None, pickle_module=None, weights_only=False, **pickle_load_args):
    """Reads what save wrote (tensors come back as lockstep tensors on the default device)."""
    if hasattr(f, "read"):
        return _Unpickler(f).load()
    with open(f, "rb") as src:
        return _Unpickler(src).load()
