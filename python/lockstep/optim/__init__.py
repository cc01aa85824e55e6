"""lockstep.optim: optimizers with parameter groups, and lr_scheduler."""
from .. import _lockstep as _C
from .._reexport import reexport as _reexport

_reexport(globals(), _C.optim)
from . import lr_scheduler  # noqa: E402,F401


class _ParamGroup:
    """One of optimizer.param_groups: 'lr' and 'weight_decay' can be read and set."""

    def __init__(self, optimizer, index):
        self._opt, self._i = optimizer, index

    def __getitem__(self, key):
        if key == "lr":
            return self._opt.group_lr(self._i)
        if key == "weight_decay":
            return self._opt.group_weight_decay(self._i)
        raise KeyError(key)

    def __setitem__(self, key, value):
        if key == "lr":
            self._opt.set_group_lr(self._i, float(value))
        elif key == "weight_decay":
            self._opt.set_group_weight_decay(self._i, float(value))
        else:
            raise KeyError(key + " cannot be changed per group in lockstep (lr and weight_decay can)")

    def __repr__(self):
        return "{'lr': %r, 'weight_decay': %r}" % (self["lr"], self["weight_decay"])


Optimizer.param_groups = property(  # noqa: F821 (from the extension)
    lambda self: [_ParamGroup(self, i) for i in range(self.num_param_groups())])
