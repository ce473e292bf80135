"""The contract every architecture implements, so that one search serves them all.

Batch-first everywhere. Token id tensors are ``long``; masks are ``bool`` with True on
real (non-pad) tokens.

    encode(src [B, S], src_mask [B, S]) -> EncoderOut          (once per sentence)
    forward(src, src_mask, tgt_in [B, T]) -> logits [B, T, V]  (teacher forcing)
    features(src, src_mask, tgt_in) -> [B, T, D]               (forward before output_proj, training)
    init_state(enc, beam) -> State                              (rows = B * beam)
    decode_step(prev [B*beam], enc, state, need_attn) -> (logits [B*beam, V], state)

Beam layout: the decoder batch is ``B * beam`` rows; rows ``b*beam .. b*beam+beam-1``
are the hypotheses of sentence ``b``. The encoder output stays at ``B`` rows (never copied
per beam): architectures group the ``beam`` queries of a sentence against its memory.
Search reorders hypotheses with ``state.select(rows)`` and drops finished sentences with
``enc.select(sentences)`` plus ``state.select`` of their rows. Models return logits;
search owns log-softmax, EOS handling and length penalties.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from torch import Tensor, nn


def _select(value: Any, index: Tensor) -> Any:
    if isinstance(value, Tensor):
        return value.index_select(0, index)
    if isinstance(value, (list, tuple)):
        return type(value)(_select(v, index) for v in value)
    if dataclasses.is_dataclass(value):
        return value.select(index)
    return value  # ints, None: not batched


class Selectable:
    """Dataclass mixin: ``select(index)`` reorders every tensor field along dim 0, except the
    fields a subclass names in ``deferred`` (it reorders those itself, later)."""

    deferred: tuple = ()

    def select(self, index: Tensor):
        changes = {f.name: _select(getattr(self, f.name), index) for f in dataclasses.fields(self)
                   if f.name not in self.deferred}
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass
class EncoderOut(Selectable):
    memory: Tensor  # [B, S, D]
    src_mask: Tensor  # [B, S] bool


class Seq2Seq(nn.Module):
    """Base class of encoder-decoder models; see the module docstring for the contract."""

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOut:
        raise NotImplementedError

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        raise NotImplementedError

    def features(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """What ``forward`` feeds its ``output_proj`` (an ``nn.Linear``): training computes the
        output layer and the loss together, a chunk of positions at a time (training/loss.py)."""
        raise NotImplementedError

    def init_state(self, enc: EncoderOut, beam: int = 1) -> Any:
        raise NotImplementedError

    def decode_step(self, prev: Tensor, enc: EncoderOut, state: Any, need_attn: bool = False) -> tuple[Tensor, Any]:
        """One decoder step. ``state.attn`` holds the [rows, S] attention when ``need_attn``."""
        raise NotImplementedError

    @property
    def max_positions(self) -> Optional[int]:
        """Longest sequence the model accepts (None: unbounded)."""
        return None

    def num_parameters(self) -> int:
        """Trainable parameters, tied weights counted once."""
        return sum(p.numel() for p in self.parameters())

    def active_parameters(self) -> int:
        """Parameters each token uses (fewer than all with Mixture-of-Experts layers)."""
        return self.num_parameters()


def group_beams(rows: Tensor, batch: int) -> Tensor:
    """[B*beam, ...] -> [B, beam, ...]: the hypotheses of each sentence side by side."""
    return rows.view(batch, rows.size(0) // batch, *rows.shape[1:])
