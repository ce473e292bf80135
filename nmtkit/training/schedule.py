"""Learning-rate schedules as pure functions of the step (so resume needs no state)."""
from __future__ import annotations

import math

from nmtkit.config import TrainConfig


def learning_rate(step: int, cfg: TrainConfig, d_model: int) -> float:
    """Learning rate for optimizer step ``step`` (1-based).

    noam: lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (Vaswani et al. 2017, eq. 3);
    inverse_sqrt: linear warm-up to ``lr`` then lr * sqrt(warmup / step); constant: lr;
    cosine / linear: linear warm-up to ``lr``, then a cosine / straight decay that reaches 0 at
    ``max_steps`` (a short, fixed budget ends at a low learning rate instead of mid-descent).
    """
    step = max(step, 1)
    warmup = max(cfg.warmup, 1)
    if cfg.schedule == "noam":
        return cfg.lr * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    if cfg.schedule == "inverse_sqrt":
        return cfg.lr * min(step / warmup, math.sqrt(warmup / step))
    if cfg.schedule in ("cosine", "linear"):
        if step < warmup:
            return cfg.lr * step / warmup
        progress = min((step - warmup) / max(cfg.max_steps - warmup, 1), 1.0)
        if cfg.schedule == "cosine":
            return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
        return cfg.lr * (1.0 - progress)
    return cfg.lr
