"""What one search call will cost, estimated from its shape before it runs.

A request inside every count limit (lines, characters, phrases, beam) can still ask for an
allocation no machine has: lexically constrained beam search builds, every step, tables of
[sentences x candidates, constraint pieces] where the candidates of a sentence are
``beam * (3 + constraint pieces)`` (``constraints.LexicalConstraints.expand``), so its memory
grows with beam x pieces squared. This module turns the shape of one ``engine.search`` call
into an upper estimate of its peak bytes, so callers refuse what would not fit instead of
failing inside the allocator. Pure arithmetic on Python integers (no torch, no overflow);
the per-element byte counts are upper bounds of what ``search.py`` and ``constraints.py``
allocate, checked against measured peaks in ``tests/test_search_cost_measured.py``.
"""
from __future__ import annotations

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

