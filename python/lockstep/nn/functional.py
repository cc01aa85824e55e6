"""lockstep.nn.functional, as torch.nn.functional. The extension's functions, and here those that
compose them."""
from .. import _lockstep as _C
from .._reexport import reexport as _reexport

_reexport(globals(), _C.nn.functional)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm: normalizes over the last len(normalized_shape) axes (biased
    variance, as PyTorch's), then scales by weight and shifts by bias when given."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(input.shape[input.dim() - len(shape):]) != shape or len(shape) > input.dim():
        raise _C.Error("layer_norm: normalized_shape %s is not the last axes of the input's shape "
                       "%s" % (list(shape), list(input.shape)))
    axes = list(range(input.dim() - len(shape), input.dim()))
    centered = input - input.mean(dim=axes, keepdim=True)
    y = centered * _C.rsqrt((centered * centered).mean(dim=axes, keepdim=True) + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
