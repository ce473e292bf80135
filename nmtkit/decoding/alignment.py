"""Alignments from attention, written as Pharaoh ``i-j`` pairs (source i, target j, from 0),
the format fast_align produces and Moses reads.

The search gives each target piece its attention over the source pieces; a target piece is
aligned to the source piece it attends to most. Word alignments map both ends of every such
pair to the whitespace words the pieces belong to, so ``i`` indexes ``source.split()`` and
``j`` indexes ``translation.split()``; a pair of words appears once, pairs sorted by (i, j).
A piece that is only whitespace (SentencePiece's lone ``▁``) belongs to no word and aligns
nothing. Source words are those of the line as SentencePiece normalises it: the same as
the input's whitespace words unless normalisation adds or removes spaces (NFKC turns a few
symbols into a space and a combining mark).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:
    from torch import Tensor


def piece_pairs(attention: Optional[Tensor], src_pieces: int) -> list[tuple[int, int]]:
    """(i, j) for every target piece j, i its most attended source piece, in target order.
    ``attention`` is [target pieces, source positions] (None when the search kept none)."""
    if attention is None or src_pieces == 0 or attention.shape[0] == 0:
        return []
    best = attention[:, :src_pieces].argmax(1).tolist()
    return [(i, j) for j, i in enumerate(best)]


def word_indices(surfaces: Sequence[str]) -> list[tuple[int, ...]]:
    """For each piece, given as the text it adds (``Vocab.surfaces``), the indices of the
    whitespace words of the whole text that it overlaps: () for a piece of only whitespace,
    two or more for a piece spanning a space. Whitespace is what ``str.split`` splits on, so
    the indices are those of ``"".join(surfaces).split()``."""
    words, in_word, out = -1, False, []
    for surface in surfaces:
        touched: list[int] = []
        for char in surface:
            if char.isspace():
                in_word = False
                continue
            if not in_word:
                words, in_word = words + 1, True
            if not touched or touched[-1] != words:
                touched.append(words)
        out.append(tuple(touched))
    return out


def word_pairs(pairs: Sequence[tuple[int, int]], src_words: Sequence[tuple[int, ...]],
               tgt_words: Sequence[tuple[int, ...]]) -> list[tuple[int, int]]:
    """Piece pairs mapped to word pairs through each side's ``word_indices``: deduplicated, sorted."""
    return sorted({(i, j) for src, tgt in pairs for i in src_words[src] for j in tgt_words[tgt]})


def pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    """``"0-0 1-2 ..."``; the empty string when there are no pairs."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
