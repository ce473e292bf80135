"""An ensemble of models behind the same contract, so every search decodes it unchanged.

Each step averages the members' probabilities: log(mean_i p_i), computed as
logsumexp_i(log p_i) - log n. That is already a normalised log-distribution, so the
log-softmax search applies to it is the identity (up to rounding). (Averaging the
log-probabilities instead, a geometric mean, does not sum to one and would be
renormalised by that log-softmax.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn

from nmtkit.models.base import Seq2Seq


@dataclass
class EnsembleEncoderOut:
    members: list  # one EncoderOut per model

    def select(self, index: Tensor) -> "EnsembleEncoderOut":
        return EnsembleEncoderOut([enc.select(index) for enc in self.members])


@dataclass
class EnsembleState:
    members: list  # one decoder state per model
    attn: Optional[Tensor] = None  # [rows, S] the members' attention, averaged

    def select(self, index: Tensor) -> "EnsembleState":
        attn = None if self.attn is None else self.attn.index_select(0, index)
        return EnsembleState([state.select(index) for state in self.members], attn)


def mean_probability_logits(logits: list[Tensor]) -> Tensor:
    """[rows, V] log of the mean of the members' probabilities (float32)."""
    lprobs = torch.stack([torch.log_softmax(x.float(), dim=-1) for x in logits])  # (M, rows, V)
    return torch.logsumexp(lprobs, dim=0) - math.log(len(logits))


class EnsembleModel(Seq2Seq):
    """Decodes several models that share source and target vocabularies as one."""

    def __init__(self, models: list[Seq2Seq]) -> None:
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.members = nn.ModuleList(models)

    @property
    def max_positions(self) -> Optional[int]:
        limits = [m.max_positions for m in self.members if m.max_positions is not None]
        return min(limits) if limits else None

    def encode(self, src: Tensor, src_mask: Tensor) -> EnsembleEncoderOut:
        return EnsembleEncoderOut([m.encode(src, src_mask) for m in self.members])

    def init_state(self, enc: EnsembleEncoderOut, beam: int = 1) -> EnsembleState:
        return EnsembleState([m.init_state(e, beam) for m, e in zip(self.members, enc.members)])

    def decode_step(self, prev: Tensor, enc: EnsembleEncoderOut, state: EnsembleState,
                    need_attn: bool = False) -> tuple[Tensor, Any]:
        steps = [m.decode_step(prev, e, s, need_attn) for m, e, s in zip(self.members, enc.members, state.members)]
        attn = None
        if need_attn:
            attn = torch.stack([s.attn.float() for _, s in steps]).mean(0)
        return mean_probability_logits([logits for logits, _ in steps]), EnsembleState([s for _, s in steps], attn)
