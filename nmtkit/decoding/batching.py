"""Inference batches: sentences sorted by length and cut under a token budget.

Training batches (``nmtkit.data.batching``) carry targets and are shuffled; these carry
only sources, keep their input positions so translations can be put back in order, and
count decoder rows: a sentence of n pieces under a beam of k costs n * k tokens.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from nmtkit.specials import PAD

if TYPE_CHECKING:  # torch is imported by pad_sources only: the CTranslate2 engine translates without it
    import torch
    from torch import Tensor


def token_batches(lengths: Sequence[int], budget: int, rows_per_sentence: int = 1) -> list[list[int]]:
    """Positions of ``lengths`` grouped longest first (the largest batch runs first, so an
    out-of-memory error shows at once); padded size * rows_per_sentence <= budget, and a
    sentence over the budget alone still gets a batch of its own."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]  # sorted: the first is longest
        if current and max(longest, 1) * (len(current) + 1) * rows_per_sentence > budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def pad_sources(seqs: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Right-padded [B, S] long ids and their [B, S] bool mask (True on real pieces)."""
    import torch

    width = max(1, max(len(s) for s in seqs))
    src = torch.full((len(seqs), width), PAD, dtype=torch.long)
    for row, seq in enumerate(seqs):
        src[row, :len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
    src = src.to(device)
    return src, src.ne(PAD)
