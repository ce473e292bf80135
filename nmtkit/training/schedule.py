"""Learning-rate schedules as pure functions of the step (so resume needs no state)."""
from __future__ import annotations

import math

from nmtkit.config import TrainConfig


def learning_rate(step: int, cfg: TrainConfig, d_model: int) -> float:
    """Learning rate for optimizer step ``step`` (1-based).

    noam: lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (Vaswani et al. 2017, eq. 3);
    inverse_sqrt: linear warm-up to ``lr`` then lr * sqrt(warmup / step); constant: lr.
    """
    step = max(step, 1)
    warmup = max(cfg.warmup, 1)
    if cfg.schedule == "noam":
        return cfg.lr * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    if cfg.schedule == "inverse_sqrt":
        return cfg.lr * min(step / warmup, math.sqrt(warmup / step))
    return cfg.lr
