"""lockstep.nn.functional, as torch.nn.functional."""
from .. import _lockstep as _C
from .._reexport import reexport as _reexport

_reexport(globals(), _C.nn.functional)
