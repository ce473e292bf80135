"""An exponential moving average of the weights (train.ema_decay): kept in float32 beside the
model, saved in checkpoints and as the weights of ``best/``, swapped in for validation."""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from nmtkit.modeldir import unique_state


def fresh_ema(model) -> dict[str, torch.Tensor]:
    """The average at its start: a float32 copy of the weights, tied ones once (the EMA is saved
    as a model directory, whose loader wants each tensor once)."""
    return {k: v.detach().clone().float() for k, v in unique_state(model).items() if v.is_floating_point()}


def restored_ema(saved: Optional[dict[str, torch.Tensor]], model, decay: float,
                 device: torch.device) -> Optional[dict[str, torch.Tensor]]:
    """A checkpoint's average on ``device``; a fresh one when the run now asks for an average its
    checkpoint lacks; None when ``decay`` is 0 and the checkpoint has none."""
    if saved is not None:
        return {k: v.to(device).float() for k, v in saved.items()}
    return fresh_ema(model) if decay > 0 else None


@torch.no_grad()
def update_ema(ema: dict[str, torch.Tensor], model, decay: float) -> None:
    """ema <- decay * ema + (1 - decay) * weights, for every averaged tensor at once."""
    current = model.state_dict()
    keys = list(ema)
    torch._foreach_lerp_([ema[k] for k in keys], [current[k].float() for k in keys], 1.0 - decay)


@contextlib.contextmanager
def ema_weights(model, ema: Optional[dict[str, torch.Tensor]]) -> Iterator[None]:
    """Inside, ``model`` holds the averaged weights (when there is an average); the raw ones are
    back afterwards, whatever happened inside."""
    if ema is None:
        yield
        return
    raw = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict({k: v.to(raw[k].dtype) for k, v in ema.items()}, strict=False)
    try:
        yield
    finally:
        model.load_state_dict(raw)
