"""Label-smoothed cross-entropy (Szegedy et al. 2016), as used by Vaswani et al. 2017."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from nmtkit.models.base import PAD


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and summed NLL over non-pad targets.

    logits [B, T, V], target [B, T]. The smoothed target puts 1-eps on the gold token and
    eps/V on every token (the gold one included), as ``F.cross_entropy`` defines it; no
    one-hot tensor is built. Computed in float32 even under bf16 autocast.
    """
    flat_logits = logits.reshape(-1, logits.size(-1)).float()
    flat_target = target.reshape(-1)
    loss = F.cross_entropy(flat_logits, flat_target, ignore_index=PAD, reduction="sum", label_smoothing=smoothing)
    with torch.no_grad():
        nll = F.cross_entropy(flat_logits, flat_target, ignore_index=PAD, reduction="sum")
    return loss, nll
