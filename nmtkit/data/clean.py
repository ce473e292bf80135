"""Training-data filters, each counted: dev and test are never filtered.

Rules, in the order they apply (a pair is counted under the first rule that drops it):

1. ``empty``: either side is empty after Unicode NFC and whitespace normalisation;
2. ``duplicate``: the same (source, target) pair was already kept (``clean.dedup``);
3. ``heldout``: the pair also appears in dev or test (``clean.dedup``), which would leak
   test data into training;
4. ``too_long``: more than ``clean.max_len`` SentencePiece tokens on either side;
5. ``ratio``: one side has more than ``clean.max_ratio`` times the tokens of the other.

Rules 1-3 need only text and run while the corpus streams in (``TextFilter``); rules 4-5
need token counts, so they run on the encoded lengths (``length_filter``).
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

Pair = tuple[str, str]

RULES = ("empty", "duplicate", "heldout", "too_long", "ratio")


def normalize(text: str) -> str:
    """Unicode NFC with every run of whitespace (tabs, NBSP, line separators) one space."""
    return " ".join(unicodedata.normalize("NFC", text).split())


@dataclass
class TextFilter:
    """Normalise pairs and drop empty, duplicate and held-out ones, counting each rule."""

    dedup: bool = True
    heldout: Iterable[Pair] = ()
    counts: dict = field(default_factory=lambda: {"read": 0, "empty": 0, "duplicate": 0, "heldout": 0})

    def __post_init__(self) -> None:
        self._heldout = {hash((normalize(s), normalize(t))) for s, t in self.heldout} if self.dedup else set()
        self._seen: set[int] = set()

    def __call__(self, pairs: Iterable[Pair]) -> Iterator[Pair]:
        for src, tgt in pairs:
            self.counts["read"] += 1
            src, tgt = normalize(src), normalize(tgt)
            if not src or not tgt:
                self.counts["empty"] += 1
                continue
            if self.dedup:
                # 64-bit hashes instead of the strings: millions of pairs fit in memory, and a
                # false "duplicate" needs a hash collision (odds ~N^2 / 2^64)
                key = hash((src, tgt))
                if key in self._seen:
                    self.counts["duplicate"] += 1
                    continue
                self._seen.add(key)
                if key in self._heldout:
                    self.counts["heldout"] += 1
                    continue
            yield src, tgt


def length_filter(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_len: int,
                  max_ratio: float) -> tuple[np.ndarray, dict]:
    """Keep-mask over pairs by token counts, and how many each rule dropped.

    ``max_len`` 0 and ``max_ratio`` 0 disable their rule. Lengths are token counts without
    BOS/EOS. The ratio test multiplies instead of dividing, so a zero length needs no care.
    """
    src_lengths, tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
    too_long = np.zeros(len(src_lengths), dtype=bool)
    if max_len > 0:
        too_long = (src_lengths > max_len) | (tgt_lengths > max_len)
    bad_ratio = np.zeros(len(src_lengths), dtype=bool)
    if max_ratio > 0:
        longer = np.maximum(src_lengths, tgt_lengths)
        shorter = np.minimum(src_lengths, tgt_lengths)
        bad_ratio = longer > max_ratio * shorter
        bad_ratio &= ~too_long  # counted once, under the first rule
    keep = ~(too_long | bad_ratio)
    return keep, {"too_long": int(too_long.sum()), "ratio": int(bad_ratio.sum())}
