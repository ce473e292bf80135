"""Failures that stop training, each as one line that says what to change: ``TrainingStopped``
(too many non-finite updates in a row, out of memory on a batch)."""
from __future__ import annotations

import contextlib

import torch

from nmtkit.errors import NmtkitError


class TrainingStopped(NmtkitError):
    """Training cannot go on (e.g. too many consecutive non-finite steps)."""


@contextlib.contextmanager
def out_of_memory_names(batch, update: int, max_tokens: int):
    """Running out of memory on ``batch`` becomes a one-line error naming the batch; training
    never retries on a smaller batch, which would silently change what it computes."""
    try:
        yield
    except (RuntimeError, MemoryError) as err:
        text = str(err)
        if not (isinstance(err, (MemoryError, torch.cuda.OutOfMemoryError)) or "out of memory" in text
                or "can't allocate memory" in text):
            raise
        raise TrainingStopped(f"out of memory at update {update} on a batch of {batch.src.shape[0]} sentences "
                              f"({batch.src.numel()} source and {batch.tgt_in.numel()} target tokens with "
                              f"padding); lower train.max_tokens (now {max_tokens}) and raise train.update_freq "
                              f"to keep the effective batch") from err


def too_few_batches(batches: int, pairs: int, per_update: int, max_tokens: int, weighted: bool) -> str:
    """Why an epoch of ``batches`` batches (``pairs`` pairs) cannot fill one update of
    ``per_update`` batches, and the change that can help: smaller batches only while the epoch
    has a pair for each batch an update takes; fewer pairs than that need larger corpus
    weights (``weighted``: the recipe mixes corpora) or fewer batches per update."""
    head = f"an update takes {per_update} batches but an epoch has only {batches} ({pairs} pairs)"
    if pairs >= per_update:
        return f"{head}; lower train.max_tokens (now {max_tokens}) or the batches per update"
    weights = "raise the data.corpora weights (a corpus gives round(weight x its pairs) to an epoch) or " \
        if weighted else ""
    return f"{head}, fewer than the batches an update takes: {weights}lower the batches per update " \
           f"(train.update_freq, or the GPUs)"
