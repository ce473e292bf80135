"""Label-smoothed cross-entropy (Szegedy et al. 2016), as used by Vaswani et al. 2017."""
from __future__ import annotations

import torch

from nmtkit.specials import PAD


class _SmoothedCrossEntropy(torch.autograd.Function):
    """The loss and its gradient by hand, because the vocabulary-sized tensors dominate.

    Autograd through log-softmax, gather and mean builds about six [tokens, V] tensors in
    the backward pass (a zero-filled one for the gather, an expanded one for the mean, their
    sum, the log-softmax backward); on the quickstart model that was a fifth of a CPU training
    step. The gradient w.r.t. the logits is simply w * (softmax - (1 - eps) onehot - eps / V),
    w the incoming gradient times the non-pad mask: one [tokens, V] tensor, no one-hot.
    """

    @staticmethod
    def forward(ctx, logits, target, keep, smoothing: float):
        lprobs = torch.log_softmax(logits.float(), dim=-1)
        nll = -lprobs.gather(1, target[:, None]).squeeze(1)
        smooth = -lprobs.mean(dim=-1)  # uniform part: eps/V on every class
        loss = ((1.0 - smoothing) * nll + smoothing * smooth).masked_fill(~keep, 0.0).sum()
        ctx.save_for_backward(lprobs, target, keep)
        ctx.smoothing, ctx.logits_dtype = smoothing, logits.dtype
        nll_sum = nll.masked_fill(~keep, 0.0).sum()
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        lprobs, target, keep = ctx.saved_tensors
        eps = ctx.smoothing
        w = (keep.to(lprobs.dtype) * grad_loss)[:, None]  # [N, 1]
        grad = lprobs.exp().mul_(w).sub_(w * (eps / lprobs.size(1)))
        grad.scatter_add_(1, target[:, None], w * -(1.0 - eps))
        return grad.to(ctx.logits_dtype), None, None, None


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and summed NLL (no gradient) over non-pad targets.

    logits [B, T, V], target [B, T]. The smoothed target puts 1-eps on the gold token and
    eps/V on every token (the gold one included), as ``F.cross_entropy`` defines it; no
    one-hot tensor is built. Computed in float32 even under bf16 autocast.
    """
    flat_target = target.reshape(-1)
    return _SmoothedCrossEntropy.apply(logits.reshape(-1, logits.size(-1)), flat_target, flat_target.ne(PAD),
                                       float(smoothing))
