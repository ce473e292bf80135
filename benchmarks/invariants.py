"""The model-contract invariants, as numbers: incremental decoding = the teacher-forced forward,
a batch = its sentences one by one, extra padding = none. tests/test_variants.py asserts them on
CPU; gpu_check.py measures the same differences on a GPU, with the same sentences.
"""
from __future__ import annotations

import torch

from nmtkit.specials import BOS, PAD


def sentences(seed: int, lengths: list[int], vocab: int) -> list[torch.Tensor]:
    """Random id rows of ``lengths`` (ids from 4: no specials)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (n,), generator=g) for n in lengths]


def targets(seed: int, lengths: list[int], vocab: int) -> list[torch.Tensor]:
    """Decoder inputs: BOS, then random ids, ``lengths`` in all."""
    return [torch.cat([torch.tensor([BOS]), t]) for t in sentences(seed, [n - 1 for n in lengths], vocab)]


def pad(rows: list[torch.Tensor], width: int = 0) -> torch.Tensor:
    """Rows padded with PAD to the longest (or ``width``): [B, max(width, longest)]."""
    out = torch.full((len(rows), max(width, max(len(r) for r in rows))), PAD)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


@torch.no_grad()
def incremental(model, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of decode_step fed ``tgt`` one token at a time."""
    enc = model.encode(src, src.ne(PAD))
    state = model.init_state(enc)
    steps = []
    for t in range(tgt.size(1)):
        logits, state = model.decode_step(tgt[:, t], enc, state)
        steps.append(logits)
    return torch.stack(steps, 1)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


@torch.no_grad()
def invariant_differences(model, vocab: int, device: torch.device, dtype: torch.dtype = torch.float32) -> dict:
    """The largest absolute logit difference of each invariant for ``model`` (in eval mode) on
    ``device`` under autocast ``dtype``: incremental vs full forward, batched vs one by one,
    padded to a larger width vs unpadded. Three sentences of different lengths."""
    from nmtkit.runtime.device import autocast

    srcs, tgts = sentences(3, [7, 3, 5], vocab), targets(4, [5, 2, 6], vocab)
    src, tgt = pad(srcs).to(device), pad(tgts).to(device)
    wide_src, wide_tgt = pad(srcs, 11).to(device), pad(tgts, 9).to(device)
    with autocast(device, dtype):
        batched = model(src, src.ne(PAD), tgt)
        padded = model(wide_src, wide_src.ne(PAD), wide_tgt)
        stepped = incremental(model, src, tgt)
        diffs = {"incremental_vs_full": 0.0, "batched_vs_one": 0.0, "padded_vs_unpadded": 0.0}
        for i, (s, t) in enumerate(zip(srcs, tgts)):
            s, t = s[None].to(device), t[None].to(device)
            alone = model(s, s.ne(PAD), t)[0]
            n = t.size(1)
            diffs["batched_vs_one"] = max(diffs["batched_vs_one"], _max_diff(batched[i, :n], alone))
            diffs["padded_vs_unpadded"] = max(diffs["padded_vs_unpadded"], _max_diff(padded[i, :n], alone))
            diffs["incremental_vs_full"] = max(diffs["incremental_vs_full"], _max_diff(stepped[i, :n], batched[i, :n]))
    return diffs
