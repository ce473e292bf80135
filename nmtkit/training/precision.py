"""Dynamic loss scaling for fp16 training (GPUs without bf16: V100, T4).

fp16 keeps 5 exponent bits, so small gradients underflow to zero. The loss is multiplied
by a scale S before the backward pass and the gradients divided by S before clipping and
the optimizer step. When a gradient is inf/nan the update is skipped and S halved; after
``GROWTH_INTERVAL`` good updates in a row S doubles. bf16 and float32 have float32's
exponent range and need none of this: for them every method here does nothing.

The scaler's state (S and the count of good updates) is plain JSON in the trainer state,
so a resumed run scales exactly as an uninterrupted one.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from nmtkit.errors import CheckpointError

INITIAL_SCALE = 2.0 ** 16
GROWTH_INTERVAL = 2000


class LossScaler:
    """``torch.amp.GradScaler`` for fp16; a pass-through for every other dtype."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.scaler: Optional[torch.amp.GradScaler] = None
        if dtype == torch.float16:
            self.scaler = torch.amp.GradScaler(device.type, init_scale=INITIAL_SCALE,
                                               growth_interval=GROWTH_INTERVAL)

    @property
    def enabled(self) -> bool:
        return self.scaler is not None

    @property
    def scale(self) -> float:
        """The current loss scale (1.0 when not scaling)."""
        return float(self.scaler.get_scale()) if self.scaler is not None else 1.0

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by S (before clipping) and note whether any is inf/nan."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step for finite gradients, then the scale's growth bookkeeping."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def skip(self) -> None:
        """After non-finite gradients: no step; with fp16 the scale is halved."""
        if self.scaler is not None:
            self.scaler.update()

    def searching(self) -> bool:
        """True while an overflow is the scaler's normal search for a usable scale (S > 1);
        at S <= 1 the gradients are non-finite without any scaling, i.e. training diverged."""
        return self.scaler is not None and self.scale > 1.0

    def state(self) -> dict:
        """JSON-able state for the checkpoint (empty when not scaling)."""
        if self.scaler is None:
            return {}
        state = self.scaler.state_dict()
        return {"scale": float(state["scale"]), "growth_tracker": int(state["_growth_tracker"])}

    def load(self, state: Optional[dict]) -> None:
        """Continue from a checkpoint's state; a checkpoint without one starts at INITIAL_SCALE."""
        if self.scaler is None or not state:
            return
        scale, tracker = state.get("scale"), state.get("growth_tracker")
        if not (isinstance(scale, float) and math.isfinite(scale) and scale > 0 and isinstance(tracker, int)
                and 0 <= tracker < GROWTH_INTERVAL):
            raise CheckpointError(f"the checkpoint's fp16 loss scaler state is damaged: {state!r}")
        self.scaler.load_state_dict({"scale": scale, "growth_factor": 2.0, "backoff_factor": 0.5,
                                     "growth_interval": GROWTH_INTERVAL, "_growth_tracker": tracker})
