"""Mixture-of-Experts feed-forward layers (``model.moe_experts``): many FFNs, few used per token.

A router (one linear map, no bias) scores the E experts for each token; the token goes to
its top k. With k = 1 (Switch Transformer, Fedus et al. 2022) the expert's output is scaled
by its router probability; with k > 1 (GShard, Lepikhin et al. 2021) the top-k
probabilities are renormalised to sum to 1. Parameters grow about E-fold, compute per
token k-fold.

Routing is dropless: every token reaches its k experts, so in evaluation and decoding a
token's output never depends on the other tokens of its batch. A capacity factor c > 0
bounds each expert to ceil(c * tokens * k / E) assignments per training batch; first
choices are served before second choices, and the dropped assignments are counted (the
token keeps its residual path). Evaluation and decoding are always dropless, so
``decode_step`` routes exactly as the teacher-forced forward does in eval mode.

Each layer reports ``RouterStats`` to an optional list passed down from ``forward``: the
load-balancing loss of the Switch Transformer, E * sum_e f_e * P_e with f_e the share of
assignments and P_e the mean router probability of expert e (1 under uniform routing, E
when every token goes to one expert), the router z-loss of ST-MoE (Zoph et al. 2022), the
assignments per expert and the dropped ones. Padding tokens are neither routed nor counted.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmtkit.config import ModelConfig
from nmtkit.models.layers import FeedForward


@dataclasses.dataclass
class RouterStats:
    layer: str  # "encoder.1", "decoder.0", ...
    aux_loss: Tensor  # scalar, differentiable: load balance, 1 when uniform
    z_loss: Tensor  # scalar, differentiable: mean squared log-sum-exp of the router logits
    load: Tensor  # [E] assignments per expert (before capacity), no gradient
    dropped: Tensor  # scalar: assignments dropped by the capacity (0 when dropless)


class MoEFeedForward(nn.Module):
    """E experts of the dense FFN's shape behind a top-k router (see the module docstring)."""

    def __init__(self, dim: int, hidden: int, kind: str, activation_dropout: float, experts: int, top_k: int,
                 capacity_factor: float, name: str) -> None:
        super().__init__()
        self.top_k, self.capacity_factor, self.name = top_k, capacity_factor, name
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(dim, hidden, kind, activation_dropout) for _ in range(experts))

    def route(self, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Router logits [N, E] (float32), chosen experts [N, k] and their gates [N, k]."""
        logits = self.router(tokens).float()
        top_p, chosen = logits.softmax(-1).topk(self.top_k, dim=-1)
        gates = top_p if self.top_k == 1 else top_p / top_p.sum(-1, keepdim=True)
        return logits, chosen, gates

    def _within_capacity(self, chosen: Tensor) -> Tensor:
        """[N, k] bool: the assignments an expert can take, first choices before second ones."""
        experts = len(self.experts)
        capacity = math.ceil(self.capacity_factor * chosen.numel() / experts)
        by_choice = F.one_hot(chosen.t().reshape(-1), experts)  # (k*N, E): all first choices, then second
        rank = (by_choice.cumsum(0) * by_choice).sum(-1) - 1  # place in its expert's queue
        return (rank < capacity).view(self.top_k, -1).t()

    def forward(self, x: Tensor, keep: Optional[Tensor] = None, stats: Optional[list] = None) -> Tensor:
        """x [B, T, D] -> [B, T, D]. ``keep`` [B, T] marks real tokens (None: all are);
        padding gets a zero output. Appends this layer's ``RouterStats`` to ``stats``."""
        flat = x.reshape(-1, x.size(-1))
        rows = None if keep is None else keep.reshape(-1).nonzero().squeeze(1)
        tokens = flat if rows is None else flat.index_select(0, rows)  # (N, D)
        logits, chosen, gates = self.route(tokens)
        served = torch.ones_like(chosen, dtype=torch.bool)
        if self.training and self.capacity_factor > 0:
            served = self._within_capacity(chosen)
        mixed = self._run_experts(tokens, chosen, gates, served)
        if stats is not None:
            stats.append(self._stats(logits, chosen, served))
        if rows is None:
            return mixed.view_as(x)
        return flat.new_zeros(flat.shape).index_copy_(0, rows, mixed).view_as(x)

    def _run_experts(self, tokens: Tensor, chosen: Tensor, gates: Tensor, served: Tensor) -> Tensor:
        """Sum over each token's served assignments of gate * expert(token). Every expert runs,
        on no rows if none chose it, so all parameters take part in the graph (DDP needs that)."""
        token_of = torch.arange(tokens.size(0), device=tokens.device)[:, None].expand_as(chosen)[served]
        expert_of, gate_of = chosen[served], gates[served]
        order = expert_of.argsort(stable=True)
        counts = torch.bincount(expert_of, minlength=len(self.experts)).tolist()
        out = torch.zeros_like(tokens)
        for expert, rows in zip(self.experts, order.split(counts)):
            who = token_of[rows]
            y = expert(tokens.index_select(0, who)) * gate_of[rows, None].to(tokens.dtype)
            out.index_add_(0, who, y.to(out.dtype))
        return out

    def _stats(self, logits: Tensor, chosen: Tensor, served: Tensor) -> RouterStats:
        experts = len(self.experts)
        load = torch.bincount(chosen.reshape(-1), minlength=experts)  # (E,)
        share = load.float() / max(chosen.numel(), 1)  # f_e
        mean_prob = logits.softmax(-1).mean(0) if logits.size(0) else share  # P_e
        aux = experts * (share * mean_prob).sum()
        z_loss = torch.logsumexp(logits, -1).pow(2).mean() if logits.size(0) else logits.sum()
        return RouterStats(self.name, aux, z_loss, load.detach(), (~served).sum().detach())


def is_moe_layer(index: int, every: int) -> bool:
    """Layer ``index`` (0-based) of a stack is MoE when it is every n-th: n-1, 2n-1, ..."""
    return index % every == every - 1


def make_ffn(cfg: ModelConfig, index: int, stack: str) -> nn.Module:
    """Layer ``index`` of ``stack``'s feed-forward block: dense, or MoE where ``cfg`` asks."""
    if cfg.moe_experts and is_moe_layer(index, cfg.moe_every):
        return MoEFeedForward(cfg.d_model, cfg.ffn_dim, cfg.ffn, cfg.activation_dropout, cfg.moe_experts,
                              cfg.moe_top_k, cfg.moe_capacity_factor, f"{stack}.{index}")
    return FeedForward(cfg.d_model, cfg.ffn_dim, cfg.ffn, cfg.activation_dropout)

