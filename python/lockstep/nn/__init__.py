"""lockstep.nn: Module (subclass it, as torch.nn.Module), layers, losses, functional, init."""

from .. import _lockstep as _C
from .._reexport import reexport as _reexport

_nn = _C.nn
_reexport(globals(), _nn)
functional = _nn.functional
init = _nn.init
from . import utils  # noqa: E402,F401
_Base = _nn.Module


class Parameter(_C.Tensor):
    """A tensor that a Module registers as a parameter when assigned as its attribute."""

    def __init__(self, data, requires_grad=True):
        super().__init__(data.detach())
        self.requires_grad_(requires_grad)


class Module(_Base):
    """Subclass it and define ``forward``. Attributes that are Parameters or modules register
    themselves (by the attribute's name, as torch's), so parameters(), named_parameters(),
    state_dict(), load_state_dict(), train()/eval(), apply(), optimizers, checkpoints and
    lockstep.dist.DataParallel see them."""

    def __init__(self):
        super().__init__()

    def __setattr__(self, name, value):
        if isinstance(value, Parameter):
            self._register_parameter(name, value)
        elif isinstance(value, _Base):
            self._register_module(name, value)
        elif isinstance(value, _C.Tensor) and name in self.__dict__:
            # A tensor in place of a registered parameter or buffer (another layer's weight:
            # weight tying) takes its place in the registry too, as in PyTorch.
            old = self.__dict__[name]
            if isinstance(old, Parameter) or self._registered(name, old):
                self._replace_tensor(name, value)
        object.__setattr__(self, name, value)

    def _registered(self, name, tensor):
        return any(t.is_same(tensor) for n, t in self.state_dict().items() if n == name)

    def _replace_tensor(self, name, value):
        try:
            self.set_parameter(name, value)
        except _C.Error:
            self.set_buffer(name, value)

    def register_buffer(self, name, tensor):
        self._register_buffer(name, tensor)
        object.__setattr__(self, name, tensor)

    def register_parameter(self, name, param):
        self._register_parameter(name, param)
        object.__setattr__(self, name, param)

    def add_module(self, name, module):
        self._register_module(name, module)
        object.__setattr__(self, name, module)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(type(self).__name__ + " has no forward()")


class Sequential(_nn.Sequential):
    __doc__ = _nn.Sequential.__doc__

    def __init__(self, *layers):
        super().__init__(*layers)
        self._layers = list(layers)  # the Python objects live as long as the container

    def append(self, layer):
        self._layers.append(layer)
        return super().append(layer)


class ModuleList(_nn.ModuleList):
    __doc__ = _nn.ModuleList.__doc__

    def __init__(self, modules=None):
        modules = list(modules) if modules is not None else []
        super().__init__(modules)
        self._modules_kept = modules

    def append(self, module):
        self._modules_kept.append(module)
        return super().append(module)


class ModuleDict(_nn.ModuleDict):
    """Modules by name, in insertion order (torch.nn.ModuleDict); names are fixed once given."""

    def __init__(self, modules=None):
        super().__init__()
        self._modules_kept = {}  # the Python objects live as long as the container
        if modules is not None:
            self.update(modules)

    def __setitem__(self, name, module):
        self._insert(name, module)
        self._modules_kept[name] = module

    def __getitem__(self, name):
        if name not in self:
            raise KeyError(name)
        return self._modules_kept[name]

    def update(self, modules):
        for name, module in (modules.items() if hasattr(modules, "items") else modules):
            self[name] = module

    def __iter__(self):
        return iter(self.keys())

    def items(self):
        return [(name, self[name]) for name in self.keys()]

    def values(self):
        return [self[name] for name in self.keys()]


class CrossEntropyLoss(Module):
    def __init__(self, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return functional.cross_entropy(input, target, ignore_index=self.ignore_index,
                                        reduction=self.reduction,
                                        label_smoothing=self.label_smoothing)


class NLLLoss(Module):
    def __init__(self, ignore_index=-100, reduction="mean"):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, input, target):
        return functional.nll_loss(input, target, ignore_index=self.ignore_index,
                                   reduction=self.reduction)


class MSELoss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return functional.mse_loss(input, target, reduction=self.reduction)


class BCEWithLogitsLoss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return functional.binary_cross_entropy_with_logits(input, target,
                                                           reduction=self.reduction)


class BCELoss(Module):
    def __init__(self, weight=None, reduction="mean"):
        super().__init__()
        self.weight, self.reduction = weight, reduction

    def forward(self, input, target):
        return functional.binary_cross_entropy(input, target, weight=self.weight,
                                               reduction=self.reduction)


class UpsamplingNearest2d(_nn.Upsample):
    """torch.nn.UpsamplingNearest2d: Upsample with mode 'nearest'."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size=size, scale_factor=scale_factor, mode="nearest")


class UpsamplingBilinear2d(_nn.Upsample):
    """torch.nn.UpsamplingBilinear2d: Upsample with mode 'bilinear' and align_corners=True."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size=size, scale_factor=scale_factor, mode="bilinear",
                         align_corners=True)
