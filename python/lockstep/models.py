"""lockstep.models (see help(lockstep._lockstep.models))."""
from . import _lockstep as _C
from ._reexport import reexport as _reexport

_reexport(globals(), _C.models)
