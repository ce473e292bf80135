"""Token-budgeted, length-bucketed batches, reproducible from (seed, epoch).

Sentences are sorted by length (with random tie-breaking) and cut into batches whose
padded size stays under ``max_tokens``, so padding is small; the order of batches is then
shuffled. Everything derives from ``seed`` and ``epoch``, so a resumed run rebuilds the
exact batch list and skips the batches it had already consumed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nmtkit.data.ids import ParallelIds
from nmtkit.specials import BOS, EOS, PAD, cut_source


@dataclass
class Batch:
    src: torch.Tensor  # [B, S] long, padded with PAD
    src_mask: torch.Tensor  # [B, S] bool
    tgt_in: torch.Tensor  # [B, T] BOS y1 .. yn
    tgt_out: torch.Tensor  # [B, T] y1 .. yn EOS
    ntokens: int  # real target tokens (EOS included)

    def to(self, device: torch.device) -> "Batch":
        nb = device.type == "cuda"
        return Batch(self.src.to(device, non_blocking=nb), self.src_mask.to(device, non_blocking=nb),
                     self.tgt_in.to(device, non_blocking=nb), self.tgt_out.to(device, non_blocking=nb), self.ntokens)


def make_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int, epoch: int,
                 shuffle: bool = True) -> list[np.ndarray]:
    """Index arrays of one epoch's batches; each batch's padded size <= max_tokens.

    The padded size counts max(source length, target length + 1) per sentence (the +1 is
    BOS/EOS); a single sentence longer than max_tokens becomes a batch of its own.
    """
    rng = np.random.default_rng([seed, epoch])
    sizes = np.maximum(src_lens, tgt_lens + 1)
    tie_break = rng.random(len(sizes)) if shuffle else np.arange(len(sizes))
    order = np.lexsort((tie_break, tgt_lens, sizes))
    batches, start, longest = [], 0, 0
    for i, idx in enumerate(order):
        longest_with = max(longest, int(sizes[idx]))
        if i > start and longest_with * (i - start + 1) > max_tokens:
            batches.append(order[start:i])
            start, longest_with = i, int(sizes[idx])
        longest = longest_with
    if start < len(order):
        batches.append(order[start:])
    if shuffle:
        rng.shuffle(batches)
    return batches


def collate(data: ParallelIds, indices: np.ndarray, max_len: int | None = None) -> Batch:
    """Pad sentences ``indices`` into a Batch, adding BOS/EOS to the target side."""
    pairs = [data.pair(int(i)) for i in indices]
    if max_len is not None:
        pairs = [(cut_source(s, max_len), t[:max_len - 1]) for s, t in pairs]
    src_len = max(1, max(len(s) for s, _ in pairs))
    tgt_len = max(len(t) for _, t in pairs) + 1
    src = np.full((len(pairs), src_len), PAD, dtype=np.int64)
    tgt_in = np.full((len(pairs), tgt_len), PAD, dtype=np.int64)
    tgt_out = np.full((len(pairs), tgt_len), PAD, dtype=np.int64)
    for row, (s, t) in enumerate(pairs):
        src[row, :len(s)] = s
        if len(s) == 0:
            src[row, 0] = EOS  # an empty source still needs one key to attend to
        tgt_in[row, 0] = BOS
        tgt_in[row, 1:len(t) + 1] = t
        tgt_out[row, :len(t)] = t
        tgt_out[row, len(t)] = EOS
    src_t = torch.from_numpy(src)
    return Batch(src_t, src_t.ne(PAD), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out),
                 int(sum(len(t) + 1 for _, t in pairs)))
