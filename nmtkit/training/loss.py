"""Label-smoothed cross-entropy (Szegedy et al. 2016), as used by Vaswani et al. 2017."""
from __future__ import annotations

import torch

from nmtkit.models.base import PAD


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and summed NLL over non-pad targets.

    logits [B, T, V], target [B, T]. The smoothed target puts 1-eps on the gold token and
    eps/V on every token (the gold one included), as ``F.cross_entropy`` defines it; no
    one-hot tensor is built. Computed in float32 even under bf16 autocast.
    """
    lprobs = torch.log_softmax(logits.reshape(-1, logits.size(-1)).float(), dim=-1)  # one pass, reused
    flat_target = target.reshape(-1)
    keep = flat_target.ne(PAD)
    nll = -lprobs.gather(1, flat_target[:, None]).squeeze(1)
    smooth = -lprobs.mean(dim=-1)  # uniform part: eps/V on every class
    loss = ((1.0 - smoothing) * nll + smoothing * smooth).masked_fill(~keep, 0.0).sum()
    return loss, nll.detach().masked_fill(~keep, 0.0).sum()
