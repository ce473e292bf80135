"""Other data splits of the same corpus (``data.split_seed``): dev and test re-drawn at random
with a seed, everything else for training, so results can be checked on held-out sets one did
not tune on. Split 0 is the source's own split, untouched.

Sources that bring their own dev and test (files, hf) pool them with the training pairs and
draw sets of the same sizes again; the SWORD source re-draws its per-book quotas itself
(``sword.heldout_indices``) so that the verse references of the held-out verses stay known.
"""
from __future__ import annotations

import random

from nmtkit.data.sources.corpus import Corpus


def split_rng(split_seed: int) -> random.Random:
    """The generator of split ``split_seed``: Python's Mersenne Twister, whose ``sample`` and
    ``shuffle`` have given the same draws for a given int seed across Python versions."""
    return random.Random(f"nmtkit-split-{split_seed}")


def resplit(corpus: Corpus, split_seed: int) -> Corpus:
    """``corpus`` with dev and test re-drawn from all its pairs (dev + test + train, in that order)
    at random by ``split_seed``, at their own sizes; 0 returns ``corpus`` as it is. The training
    pairs are read into memory (a re-split is for corpora small enough to need one)."""
    if split_seed == 0:
        return corpus
    pool = list(corpus.dev) + list(corpus.test) + list(corpus.train)
    drawn = split_rng(split_seed).sample(range(len(pool)), len(corpus.dev) + len(corpus.test))
    dev_idx, test_idx = sorted(drawn[:len(corpus.dev)]), sorted(drawn[len(corpus.dev):])
    held = set(drawn)
    train = [pair for i, pair in enumerate(pool) if i not in held]
    provenance = {**corpus.provenance, "split_seed": split_seed,
                  "heldout": f"dev and test drawn at random (split seed {split_seed}) from the source's dev, test "
                             f"and training pairs, at the source's dev and test sizes"}
    return Corpus(train=train, dev=[pool[i] for i in dev_idx], test=[pool[i] for i in test_idx],
                  provenance=provenance, train_size=len(train))
