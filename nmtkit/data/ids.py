"""Compact storage of encoded splits: one ``.npz`` per split with flat token arrays.

A split holds ``src``/``tgt`` token ids concatenated into one int32 array each, plus
``*_offsets`` (N+1 entries) so sentence i is ``ids[offsets[i]:offsets[i+1]]``. No BOS/EOS
are stored; the batcher adds them. Loading is one ``np.load``; no pickles.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from nmtkit.errors import DataError
from nmtkit.files import atomic_open


@dataclass
class ParallelIds:
    src: np.ndarray  # int32 [total src tokens]
    src_offsets: np.ndarray  # int64 [N + 1]
    tgt: np.ndarray
    tgt_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.src[self.src_offsets[i]:self.src_offsets[i + 1]],
                self.tgt[self.tgt_offsets[i]:self.tgt_offsets[i + 1]])


def flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Sentences of ids -> (flat int32 ids, int64 offsets with N+1 entries)."""
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    if not len(seqs):
        return np.zeros(0, dtype=np.int32), offsets
    flat = np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs])  # ~10x faster than a Python loop
    return flat, offsets


def save_split(path: str | Path, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> None:
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} source vs {len(tgt)} target sentences")
    src_flat, src_off = flatten(src)
    tgt_flat, tgt_off = flatten(tgt)
    with atomic_open(path, "wb") as handle:
        np.savez(handle, src=src_flat, src_offsets=src_off, tgt=tgt_flat, tgt_offsets=tgt_off)


def load_split(path: str | Path) -> ParallelIds:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"prepared data not found: {path} (run `nmtkit prepare` first)")
    try:
        with np.load(path, allow_pickle=False) as data:
            return ParallelIds(data["src"], data["src_offsets"], data["tgt"], data["tgt_offsets"])
    except (OSError, ValueError, KeyError) as err:
        raise DataError(f"{path}: corrupt prepared data ({err}); delete it and rerun `nmtkit prepare`") from None
