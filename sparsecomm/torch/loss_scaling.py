"""Mixed precision for the torch compressors (``loss_scaler=``): each parameter's residual and
momentum follow the GradScaler's scale, by the rule of sparsecomm.core.loss_scale."""

from typing import Optional

import torch

from ..core import loss_scale
from .state import ParameterState


class LossScaling:
    """The GradScaler a compressor follows, and its scale as last read."""

    def __init__(self, owner: str, scaler: torch.amp.GradScaler):
        self.owner, self.scaler = owner, scaler
        self._seen = None  # (the scale tensor, its version, its value) when last read

    @classmethod
    def of(cls, owner, scaler) -> Optional["LossScaling"]:
        """loss_scaler=: None or an enabled torch.amp.GradScaler with backoff_factor < 1 < growth_factor
        (a disabled scaler scales nothing: as None)."""
        if scaler is None:
            return None
        loss_scale.check_type(owner, scaler, torch.amp.GradScaler, "torch.amp.GradScaler")
        if not scaler.is_enabled():
            return None
        loss_scale.check_factors(owner, scaler.get_backoff_factor(), scaler.get_growth_factor())
        return cls(owner, scaler)

    def scale(self) -> float:
        """The scaler's current scale, its factors checked again (set_backoff_factor /
        set_growth_factor may have changed them). The scale tensor is read on the host (one sync
        on CUDA) only when it is another tensor or its version counter has moved: every write to
        it (update(), load_state_dict) is in place. So a step reads it once, not once per tensor."""
        scaler = self.scaler
        loss_scale.check_factors(self.owner, scaler.get_backoff_factor(), scaler.get_growth_factor())
        tensor = scaler._get_scale_async()  # (None until the first scale(): the initial scale, no read)
        if tensor is None:
            return scaler.get_scale()
        seen = self._seen
        if seen is None or seen[0] is not tensor or seen[1] != tensor._version:
            self._seen = seen = (tensor, tensor._version, scaler.get_scale())
        return seen[2]

    @staticmethod
    def follow(state: ParameterState, scale: float):
        """The core rule: a lowered scale rolls back the last update (its step overflowed); a
        changed one rescales residual and momentum; the state is then in `scale`."""
        decision = loss_scale.decide(state.loss_scale, scale, state.backed_up)
        if decision.rollback:
            state.roll_back()
        if decision.factor != 1.0:
            state.rescale(decision.factor)
        state.loss_scale = scale

    def settle(self, states):
        """Before a checkpoint: every state in the current scale, no rollback pending."""
        scale = self.scale()
        for state in states:
            self.follow(state, scale)

    @staticmethod
    def back_up_and_pack(compressor, tensor, state, route, density):
        """The payload under a loss scaler: the state is backed up first (an overflowed step is
        rolled back at the next compress), and a sparse payload whose gradient held an inf or
        NaN starts with a NaN (quantized: NaN scales), so that every rank's scaler sees the
        overflow whatever coordinates were picked. A dense payload is the gradient itself (DGC:
        its momentum, which the inf reaches): it carries the overflow already."""
        state.back_up(tensors=route != "dense" or compressor.method.keeps_momentum)
        if route == "dense":
            return compressor.dense_payload(tensor, state)
        overflow = non_finite(tensor)
        payload = compressor.pack(tensor, state, density)
        if overflow is not None:
            if payload.bits is not None:
                payload.scales.masked_fill_(overflow, float("nan"))  # every decoded value is NaN
            else:
                payload.values.view(-1)[:1].masked_fill_(overflow, float("nan"))
        return payload


def non_finite(tensor):
    """A 0-d bool tensor on the tensor's device: whether it holds an inf or NaN (one read
    pass, no host read); None for an empty tensor."""
    if tensor.numel() == 0:
        return None
    low, high = torch.aminmax(tensor)
    return ~(torch.isfinite(low) & torch.isfinite(high))
