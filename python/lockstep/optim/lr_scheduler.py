"""lockstep.optim.lr_scheduler, as torch.optim.lr_scheduler."""
from .. import _lockstep as _C
from .._reexport import reexport as _reexport

_reexport(globals(), _C.optim.lr_scheduler)
