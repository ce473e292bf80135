"""Label-smoothed cross-entropy in Szegedy et al.'s (2016) form, PyTorch's: 1 - eps on the gold piece and eps / V
on every piece, the gold one too. tensor2tensor (the paper's code) and fairseq spread eps / (V - 1) over the
others only; the two differ less the larger the vocabulary."""
from __future__ import annotations

from typing import Optional

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


# Rows of one chunk of the output layer: their float32 logits hold at most this many numbers
# (128 MiB), whatever the vocabulary; a quickstart batch (2k tokens x 8k pieces) is one chunk.
CHUNK_ELEMENTS = 2 ** 25


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """Output layer and smoothed loss together, ``CHUNK_ELEMENTS`` logits at a time.

    The full [tokens, V] logits (and their float32 log-probabilities, kept for the backward
    pass) were the largest tensors of a training step. Here each chunk's logits live only
    inside the loop: since the loss is a sum and its gradient is linear in the incoming
    scalar gradient, the gradients w.r.t. the rows, the weight and the bias are computed in
    the forward pass for a unit incoming gradient, and the backward pass only scales them.
    No logits are recomputed, so the flops are the unchunked path's.
    """

    @staticmethod
    def forward(ctx, rows, weight, bias, target, smoothing: float, compute_dtype, with_grad: bool):
        with torch.autocast(rows.device.type, enabled=False):  # dtypes set by hand below
            totals, grads = _chunked_loss(rows, weight, bias, target, smoothing, compute_dtype, with_grad)
        ctx.dtypes = rows.dtype, weight.dtype, None if bias is None else bias.dtype
        ctx.save_for_backward(*grads)
        ctx.mark_non_differentiable(totals[1])
        return totals

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        # scaled in place: the saved gradients serve this one backward pass (no retain_graph in training)
        grads = [None if grad is None else grad.mul_(grad_loss).to(dtype)
                 for grad, dtype in zip(ctx.saved_tensors, ctx.dtypes)]
        return (*grads, None, None, None, None)


def _chunked_loss(rows, weight, bias, target, smoothing: float, compute_dtype, with_grad: bool):
    """(summed smoothed loss, summed NLL) of ``rows`` [N, D] through ``weight`` [V, D] (+ ``bias``),
    and with ``with_grad`` the float32 gradients of the loss w.r.t. (rows, weight, bias)."""
    vocab = weight.size(0)
    weight_c = weight.to(compute_dtype)
    bias_c = None if bias is None else bias.to(compute_dtype)
    rows_c = rows.to(compute_dtype)
    loss = rows.new_zeros((), dtype=torch.float32)
    nll = rows.new_zeros((), dtype=torch.float32)
    grad_rows = torch.empty(rows.shape, dtype=torch.float32, device=rows.device) if with_grad else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=rows.device) if with_grad else None
    grad_bias = torch.zeros(vocab, dtype=torch.float32, device=rows.device) if with_grad and bias is not None else None
    step = max(1, CHUNK_ELEMENTS // vocab)
    in_place = rows.device.type == "cpu"  # one [rows, V] float32 buffer, not two: see _log_softmax
    for start in range(0, rows.size(0), step):
        chunk, gold = rows_c[start:start + step], target[start:start + step]
        lprobs = _log_softmax(torch.nn.functional.linear(chunk, weight_c, bias_c).float(), in_place)
        nll_rows = -lprobs.gather(1, gold[:, None]).squeeze(1)
        chunk_nll = nll_rows.sum()
        nll += chunk_nll
        if smoothing:  # the uniform part's pass over the chunk only where it counts
            loss += ((1.0 - smoothing) * nll_rows - smoothing * lprobs.mean(dim=-1)).sum()
        else:
            loss += chunk_nll
        if not with_grad:
            continue
        # d loss / d logits = softmax - (1 - eps) onehot - eps / V, row by row
        grad = lprobs.exp_()
        if smoothing:
            grad.sub_(smoothing / vocab)
        grad[torch.arange(len(gold), device=grad.device), gold] -= 1.0 - smoothing
        if grad_bias is not None:
            grad_bias += grad.sum(0)
        grad_c = grad.to(compute_dtype)
        grad_rows[start:start + step] = grad_c @ weight_c
        if compute_dtype == torch.float32:
            grad_weight.addmm_(grad_c.t(), chunk)
        else:  # no mixed-dtype addmm: a [V, D] product per chunk, summed in float32
            grad_weight += grad_c.t() @ chunk
    return (loss, nll), (grad_rows, grad_weight, grad_bias)


def _log_softmax(logits: torch.Tensor, in_place: bool) -> torch.Tensor:
    """Log-softmax over the last dimension, written over ``logits`` where ``in_place`` (the CPU):
    the logits are not needed afterwards, and a second vocabulary-sized float32 buffer cost a
    chunk's worth of memory and of memory traffic. The same kernel, so the same numbers."""
    return torch.log_softmax(logits, dim=-1, out=logits) if in_place else torch.log_softmax(logits, dim=-1)


def projected_smoothed_loss(hidden: torch.Tensor, output_proj: torch.nn.Linear, target: torch.Tensor,
                            smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``label_smoothed_loss(output_proj(hidden), target, smoothing)`` without the [tokens, V]
    logits: hidden [B, T, D], target [B, T]. Padding positions are dropped before the output
    layer (they cost nothing); under autocast the output layer runs in the autocast dtype,
    the softmax and the loss in float32, as on the unchunked path."""
    device_type = hidden.device.type
    compute_dtype = (torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type)
                     else output_proj.weight.dtype)
    flat_target = target.reshape(-1)
    keep = flat_target.ne(PAD)
    rows = hidden.reshape(-1, hidden.size(-1))[keep]  # (N real targets, D)
    params = (output_proj.weight, output_proj.bias)
    with_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (rows, *params))
    return _ProjectedSmoothedCrossEntropy.apply(rows, *params, flat_target[keep], float(smoothing), compute_dtype,
                                                with_grad)


class TrainingLoss(torch.nn.Module):
    """A model and its smoothed loss as one module, the one that DDP wraps: ``features``
    (the model's own method, or a compiled one) then the chunked output layer and loss."""

    def __init__(self, model: torch.nn.Module, smoothing: float, features=None) -> None:
        super().__init__()
        self.model = model
        self.smoothing = smoothing
        self.features = model.features if features is None else features

    def forward(self, src, src_mask, tgt_in, tgt_out, router_stats: Optional[list] = None):
        """Summed smoothed loss and NLL of one batch; MoE layers append to ``router_stats`` if given."""
        routed = {} if router_stats is None else {"router_stats": router_stats}  # a dense model takes none
        hidden = self.features(src, src_mask, tgt_in, **routed)
        return projected_smoothed_loss(hidden, self.model.output_proj, tgt_out, self.smoothing)
