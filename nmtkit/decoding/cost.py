"""What a search will cost, known before it runs, so a request that cannot fit is refused
in one line instead of failing inside an allocation.

Counts (lines, phrases, characters) do not bound memory: a constrained beam search's step
compares every candidate with every constraint piece. ``LexicalConstraints.expand`` holds,
per sentence, ``beam * (3 + T)`` candidates against the ``T`` constraint pieces of the
widest sentence of its batch, in about a dozen [candidates, T] tensors (long and bool):
measured at 55-60 bytes per cell on CPU, counted here as ``CELL_BYTES``. Its time per
step grows with the same product, so the bound on bytes bounds the time per step too.
Plain beam search costs ``beam`` rows of logits per sentence, which ``batch_tokens``
already bounds. ``translate`` and ``serve`` both ask ``estimate_search_bytes``, through
``Translator``, which splits a batch whose constrained search would pass the bound and
refuses a line that passes it alone.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from nmtkit.errors import ConfigError

CELL_BYTES = 64  # bytes per (candidate, constraint piece) pair in one step of the constrained search
LOGIT_BYTES = 4 * 3  # float32 logits, log-probabilities and a masked copy per vocabulary entry and row
MAX_SEARCH_BYTES = 4 << 30  # one batch's search: a request past it is refused, not tried


def estimate_search_bytes(sentences: int, beam: int, constraint_pieces: int, vocab_size: int = 0) -> int:
    """Bytes one step of beam search over ``sentences`` sentences needs at its peak, the
    widest of them holding ``constraint_pieces`` constraint pieces (0: plain beam search),
    with a target vocabulary of ``vocab_size`` entries."""
    rows = sentences * beam
    constrained = sentences * beam * (3 + constraint_pieces) * constraint_pieces * CELL_BYTES
    return constrained + rows * vocab_size * LOGIT_BYTES


def check_search_cost(beam: int, constraint_pieces: int, vocab_size: int = 0, what: str = "a line",
                      limit: Optional[int] = None) -> None:
    """A one-line ConfigError, naming the limit, when one sentence with ``constraint_pieces``
    constraint pieces under ``beam`` would need more than ``limit`` bytes on its own
    (default ``MAX_SEARCH_BYTES``)."""
    limit = MAX_SEARCH_BYTES if limit is None else limit
    need = estimate_search_bytes(1, beam, constraint_pieces, vocab_size)
    if need > limit:
        raise ConfigError(f"{what} has constraints of {constraint_pieces:,} pieces: with beam {beam} their search "
                          f"would need about {_size(need)}, past the limit of {_size(limit)} per search; "
                          f"use fewer or shorter phrases, or a smaller beam")


def split_by_cost(positions: Sequence[int], pieces: Mapping[int, int] | Sequence[int], beam: int,
                  vocab_size: int = 0, limit: Optional[int] = None) -> list[list[int]]:
    """``positions`` (a batch, ``pieces[i]`` the constraint pieces of position i) cut into
    batches whose constrained search stays within ``limit`` (default ``MAX_SEARCH_BYTES``),
    widest first (a batch's width is its widest sentence's); a line past it alone keeps a
    batch of its own (``check_search_cost`` refuses it first)."""
    limit = MAX_SEARCH_BYTES if limit is None else limit
    order = sorted(positions, key=lambda i: -pieces[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and estimate_search_bytes(len(batches[-1]) + 1, beam, pieces[batches[-1][0]], vocab_size) <= limit:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def _size(count: int) -> str:
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,} bytes"
