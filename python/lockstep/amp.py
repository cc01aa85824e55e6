"""lockstep.amp: GradScaler as torch.amp.GradScaler, for scripts that construct one disabled
(float32 or bfloat16 training, where it passes everything through). Loss scaling is for float16, which
lockstep does not have: bfloat16 autocast (lockstep.autocast) needs none."""
from . import _lockstep as _C


class GradScaler:
    def __init__(self, device="cpu", init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        if enabled:
            raise _C.Error("GradScaler(enabled=True): loss scaling is for float16, which lockstep "
                           "does not have; train in float32 or under lockstep.autocast (bfloat16) "
                           "with GradScaler(enabled=False)")
        self._enabled = False

    def is_enabled(self):
        return self._enabled

    def scale(self, outputs):
        return outputs

    def unscale_(self, optimizer):
        pass

    def step(self, optimizer, *args, **kwargs):
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        pass

    def get_scale(self):
        return 1.0

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        pass
