"""lockstep.debug (see help(lockstep._lockstep.debug))."""
from . import _lockstep as _C
from ._reexport import reexport as _reexport

_reexport(globals(), _C.debug)
