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

import itertools
import unicodedata
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import numpy as np

Pair = tuple[str, str]

RULES = ("empty", "duplicate", "heldout", "too_long", "ratio")
BATCH_PAIRS = 4096  # pairs the text rules look at together
_SEPARATOR = "\x00"  # joins texts: not whitespace, and a starter that NFC composes with nothing
_BLOCK = 256  # texts checked together: a rare odd space sends only its block the slow way
# every character str.split() splits on but the space (tests/test_clean.py checks the list), and two spaces
_ODD_SPACES = (*"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
               "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000", "  ")


def normalize(text: str) -> str:
    """Unicode NFC with every run of whitespace (tabs, NBSP, line separators) one space."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def normalize_batch(texts: Sequence[str]) -> list[str]:
    """``[normalize(t) for t in texts]``, about three times faster: a block of texts is joined by a
    NUL and normalised as one string (NFC never composes across the NUL), and when the block holds
    no whitespace but single spaces (C-speed substring searches tell), only a space at either end of
    a text is left to strip; other blocks split and join each text's words. Blocks with a text that
    holds a NUL itself go one by one."""
    out: list[str] = []
    for start in range(0, len(texts), _BLOCK):
        block = texts[start:start + _BLOCK]
        joined = _SEPARATOR.join(block)
        if joined.count(_SEPARATOR) != len(block) - 1:
            out += [normalize(text) for text in block]
            continue
        composed = unicodedata.normalize("NFC", joined)
        if any(space in composed for space in _ODD_SPACES):
            out += [" ".join(text.split()) for text in composed.split(_SEPARATOR)]
        else:
            out += [text.strip(" ") for text in composed.split(_SEPARATOR)]
    return out


class SeenHashes:
    """A set of 64-bit hashes kept as sorted numpy runs: 8 bytes a member where a Python set of
    ints takes about 70, so the pairs of a WMT-sized corpus fit in a few hundred megabytes.
    A new run is merged into the one before it while it is at least as long (a binary
    counter), so there are O(log N) runs to look a batch up in and merging costs O(N log N)."""

    def __init__(self, members: Iterable[int] = ()) -> None:
        self.runs: list[np.ndarray] = []
        self.first_seen(np.fromiter(members, np.int64))

    def __len__(self) -> int:
        return sum(len(run) for run in self.runs)

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """Bool mask over ``keys`` [N]: which are members."""
        found = np.zeros(len(keys), dtype=bool)
        for run in self.runs:
            at = np.minimum(np.searchsorted(run, keys), len(run) - 1)
            found |= run[at] == keys
        return found

    def first_seen(self, keys: np.ndarray) -> np.ndarray:
        """Bool mask over ``keys`` [N]: which are new (not members, and first of their value in
        ``keys``); those become members."""
        new = np.zeros(len(keys), dtype=bool)
        new[np.unique(keys, return_index=True)[1]] = True
        new &= ~self.contains(keys)
        if new.any():
            self.runs.append(np.sort(keys[new]))
            while len(self.runs) > 1 and len(self.runs[-2]) <= len(self.runs[-1]):
                last = self.runs.pop()
                self.runs[-1] = np.sort(np.concatenate([self.runs[-1], last]), kind="stable")  # two sorted runs: O(n)
        return new


@dataclass
class TextFilter:
    """Normalise pairs and drop empty, duplicate and held-out ones, counting each rule.

    Pairs stream through in batches of ``BATCH_PAIRS`` (to look their hashes up at numpy speed);
    memory grows by 8 bytes per distinct kept pair (``SeenHashes``), nothing else."""

    dedup: bool = True
    heldout: Iterable[Pair] = ()
    counts: dict = field(default_factory=lambda: {"read": 0, "empty": 0, "duplicate": 0, "heldout": 0})

    def __post_init__(self) -> None:
        pairs = ((normalize(s), normalize(t)) for s, t in self.heldout) if self.dedup else ()
        self._heldout = SeenHashes(map(hash, pairs))
        self._seen = SeenHashes()

    def __call__(self, pairs: Iterable[Pair]) -> Iterator[Pair]:
        pairs = iter(pairs)
        while batch := list(itertools.islice(pairs, BATCH_PAIRS)):
            yield from self._filter(batch)

    def _filter(self, batch: list[Pair]) -> list[Pair]:
        self.counts["read"] += len(batch)
        normalized = list(zip(*map(normalize_batch, zip(*batch))))
        full = [pair for pair in normalized if pair[0] and pair[1]]
        self.counts["empty"] += len(normalized) - len(full)
        if not self.dedup:
            return full
        # 64-bit hashes instead of the strings: a false "duplicate" needs a hash collision
        # (odds ~N^2 / 2^64). A held-out pair is remembered too: its copies count as duplicates.
        keys = np.fromiter(map(hash, full), dtype=np.int64, count=len(full))
        new = self._seen.first_seen(keys)
        heldout = new & self._heldout.contains(keys)
        self.counts["duplicate"] += len(full) - int(new.sum())
        self.counts["heldout"] += int(heldout.sum())
        return list(itertools.compress(full, new & ~heldout))


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
