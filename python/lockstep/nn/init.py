"""lockstep.nn.init, as torch.nn.init."""
from .. import _lockstep as _C
from .._reexport import reexport as _reexport

_reexport(globals(), _C.nn.init)
