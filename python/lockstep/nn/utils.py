"""lockstep.nn.utils, as torch.nn.utils: gradient clipping by norm or by value."""
from .. import _lockstep as _C


def _params(parameters):
    return [parameters] if isinstance(parameters, _C.Tensor) else list(parameters)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scales the gradients so that their global L2 norm is at most max_norm; returns the norm
    before clipping (a 0-d tensor, recorded: no sync). As torch.nn.utils.clip_grad_norm_, with the
    L2 norm only; a non-finite norm is left to the optimizer's skip_nonfinite."""
    if float(norm_type) != 2.0:
        raise _C.Error("clip_grad_norm_: only norm_type=2 is supported; got %r" % (norm_type,))
    if error_if_nonfinite:
        raise _C.Error("clip_grad_norm_: error_if_nonfinite=True would need a sync each step; "
                       "construct the optimizer with skip_nonfinite=True instead")
    return _C.optim.clip_grad_norm_(_params(parameters), float(max_norm))


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamps every gradient to [-clip_value, clip_value] (torch.nn.utils.clip_grad_value_)."""
    v = float(clip_value)
    for p in _params(parameters):
        if p.grad is not None:
            p.grad = p.grad.clamp(-v, v)
