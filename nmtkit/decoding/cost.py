"""What one search call will cost, estimated from its shape before it runs.

A request inside every count limit (lines, characters, phrases, beam) can still ask for an
allocation no machine has: lexically constrained beam search builds, every step, tables of
[sentences x candidates, constraint pieces] where the candidates of a sentence are
``beam * (3 + constraint pieces)`` (``constraints.LexicalConstraints.expand``), so its memory
grows with beam x pieces squared. This module turns the shape of one ``engine.search`` call
into an upper estimate of its peak bytes, so callers refuse what would not fit instead of
failing inside the allocator. ``translate`` (through ``Translator``) refuses a line past
``MAX_SEARCH_BYTES`` and cuts a batch of constrained lines into calls under it; ``serve``
applies its own bound per request. Pure arithmetic on Python integers (no torch, no overflow);
the per-element byte counts are upper bounds of what ``search.py`` and ``constraints.py``
allocate, checked against measured peaks in ``tests/test_search_cost_measured.py``.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from nmtkit.errors import ConfigError

# per decoder row and vocabulary entry, each step: logits, log-softmax, the restricted copy and
# beam_step's [n, beam * V] candidate scores (4-byte floats), plus topk's and masks' temporaries
DISTRIBUTION_BYTES = 40
# per candidate and constraint piece, each step: the candidates' phrase table rows (four long
# fields and a bool), their met flags, and advance()'s long and bool temporaries
CONSTRAINT_STATE_BYTES = 96
TOKEN_BYTES = 8  # a long piece id: live prefixes, their per-step copy, finished hypotheses
ATTENTION_BYTES = 48  # per (row, output, source) piece with alignments: history, its copy, finished, new


def estimate_search_bytes(sentences: int, source_pieces: int, output_pieces: int, beam: int, vocab: int,
                          constraint_pieces: int = 0, alignments: bool = False,
                          state_bytes_per_position: int = 0) -> int:
    """Upper estimate of the peak bytes of one search of ``sentences`` sources padded to
    ``source_pieces``, up to ``output_pieces`` output pieces each, ``beam`` rows per sentence
    (the number of samples when sampling), a ``vocab``-sized output layer, and at most
    ``constraint_pieces`` constraint pieces in one sentence (0: no constraints).
    ``state_bytes_per_position``: the model's decoder state per row and position (keys and
    values of every layer), 0 when unknown."""
    rows = sentences * beam
    positions = output_pieces + 1  # BOS .. the last piece
    total = rows * vocab * DISTRIBUTION_BYTES
    total += rows * positions * TOKEN_BYTES * 3
    total += rows * (positions + source_pieces) * state_bytes_per_position
    if alignments:
        total += rows * positions * source_pieces * ATTENTION_BYTES
    if constraint_pieces > 0:
        candidates = beam * (3 + constraint_pieces)  # 2 * beam plain, beam best, beam x every piece
        total += sentences * candidates * constraint_pieces * CONSTRAINT_STATE_BYTES
        total += rows * vocab * 4  # restrict(): the [rows, V] mask of pieces that still fit
    return total



MAX_SEARCH_BYTES = 4 << 30  # translate's bound on one search call (serve sets its own: --max-search-bytes)


def check_search_cost(need: int, what: str, pieces: int, beam: int, limit: Optional[int] = None) -> None:
    """A one-line ConfigError, naming the limit, when a line whose search alone would need
    ``need`` bytes (``estimate_search_bytes`` of that line, ``pieces`` constraint pieces under
    ``beam``) is past ``limit`` (default ``MAX_SEARCH_BYTES``): refused before any search runs."""
    limit = MAX_SEARCH_BYTES if limit is None else limit
    if need > limit:
        raise ConfigError(f"{what} has constraints of {pieces:,} pieces: with beam {beam} their search would need "
                          f"about {_size(need)}, past the limit of {_size(limit)} per search; use fewer or "
                          f"shorter phrases, or a smaller beam")


def split_by_cost(positions: Sequence[int], cost: Callable[[list[int]], int], widest: Callable[[int], int],
                  limit: Optional[int] = None) -> list[list[int]]:
    """``positions`` (one batch) cut into search calls whose ``cost`` (bytes of a group of
    positions, growing with each one added) stays within ``limit`` (default
    ``MAX_SEARCH_BYTES``), the ``widest`` first, as many to a call as fit; a position past the
    limit alone keeps a call of its own (``check_search_cost`` refuses it first)."""
    limit = MAX_SEARCH_BYTES if limit is None else limit
    calls: list[list[int]] = []
    for position in sorted(positions, key=lambda i: -widest(i)):
        if calls and cost(calls[-1] + [position]) <= limit:
            calls[-1].append(position)
        else:
            calls.append([position])
    return calls


def _size(count: int) -> str:
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,} bytes"
