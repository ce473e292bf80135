"""Weighted training corpora (``data.corpora``): which pairs one epoch trains on.

A weight up- or down-samples its corpus within every epoch: a corpus of N cleaned pairs with
weight w gives round(w * N) pairs to each epoch — int(w) full copies of the corpus plus a
sample of the remainder without replacement, drawn anew each epoch. Weight 1 is every pair
once, 3 is every pair three times, 0.25 a quarter of the pairs (another quarter next epoch).
So an epoch has the same size every time, the mix is exact in every epoch (not only on
average), and the choice derives from (seed, epoch) alone: a resumed run rebuilds it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from nmtkit.errors import DataError

_STREAM = 0x6D6978  # "mix": keeps this choice's random numbers apart from the batch order's (seed, epoch)


def epoch_pairs(corpus_ids: np.ndarray, weights: Sequence[float], seed: int, epoch: int) -> np.ndarray:
    """Indices of the pairs epoch ``epoch`` trains on (a pair may repeat), corpus by corpus."""
    rng = np.random.default_rng([seed, epoch, _STREAM])
    chosen = []
    for corpus, weight in enumerate(weights):
        members = np.flatnonzero(corpus_ids == corpus)
        if not len(members):
            continue
        copies, rest = divmod(int(np.floor(weight * len(members) + 0.5)), len(members))
        chosen.append(np.tile(members, copies))
        chosen.append(np.sort(rng.choice(members, rest, replace=False)))
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)


def corpus_weights(corpus_ids, corpora: Sequence, where) -> list[float] | None:
    """The weight of each corpus a prepared split holds (None: one corpus, no mixing); a
    DataError when the split and the recipe's ``data.corpora`` disagree."""
    if corpus_ids is None and not corpora:
        return None
    held = int(corpus_ids.max()) + 1 if corpus_ids is not None and len(corpus_ids) else 0
    if corpus_ids is None or held > len(corpora):
        raise DataError(f"{where} was prepared from {held or 'one'} corpora but the recipe lists "
                        f"{len(corpora) or 'no'} data.corpora: run `nmtkit prepare` on this recipe")
    return [corpus.weight for corpus in corpora]
