"""Host memory: keep freed blocks for reuse instead of handing them back to the kernel.

glibc serves every allocation above a threshold (at most 32 MiB) with a fresh ``mmap`` and
unmaps it on free. A training step allocates and frees the same large tensors every time
([tokens, vocabulary] logits and their gradient are ~130 MB at 4k-token batches), so each
step paid for hundreds of thousands of page faults: 12% of the CPU time of a quickstart run
went to the kernel. Serving large blocks from the heap and never trimming it made CPU
training ~20% faster; peak memory grew 8% for the Transformer quickstart and doubled for the
LSTM one, whose varied tensor sizes fragment the heap (benchmarks/RESULTS.md). The CLI calls
this once at start (``NMTKIT_MALLOC=system`` opts out); as a library, nmtkit leaves the
allocator of its host program alone.
"""
from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Tune glibc malloc as above; True if it did. Does nothing where the user chose an
    allocator (LD_PRELOAD, MALLOC_* variables), where ``NMTKIT_MALLOC=system``, or off glibc."""
    if os.environ.get("NMTKIT_MALLOC") == "system" or os.environ.get("LD_PRELOAD") or \
            any(key.startswith("MALLOC_") for key in os.environ):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: other C libraries have other knobs # noqa: B018
    except (OSError, AttributeError):
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))
