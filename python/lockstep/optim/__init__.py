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


def _signature(cls):
    """The signature of an optimizer's constructor, read from its binding's docstring
    (``inspect.signature(torch.optim.AdamW).parameters``, as nanoGPT asks for ``fused``)."""
    import ast
    import inspect
    line = (cls.__init__.__doc__ or "").strip().split("\n")[0]
    if not line.startswith("__init__(") or ") -> None" not in line:
        return None
    args, depth, cur = [], 0, ""
    for ch in line[len("__init__("):line.rindex(") -> None")]:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    args.append(cur.strip())
    params = []
    for a in args[1:]:  # past self
        name, _, default = a.partition(" = ")
        name = name.split(":")[0].strip()
        if not default:
            params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD))
            continue
        try:
            value = ast.literal_eval(default)
        except (ValueError, SyntaxError):
            value = default
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        default=value))
    return inspect.Signature(params)


for _cls in [c for c in list(globals().values()) if isinstance(c, type)]:
    if issubclass(_cls, Optimizer) and _cls is not Optimizer:  # noqa: F821
        _sig = _signature(_cls)
        if _sig is not None:
            _cls.__signature__ = _sig
