"""Host memory settings the CLI applies once at start, before torch loads.

Freed blocks are kept for reuse instead of being handed back to the kernel: glibc serves every
allocation above a threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps it on free. A
training step allocates and frees the same large tensors every time ([tokens, vocabulary] logits
and their gradient are ~130 MB at 4k-token batches), so each step paid for hundreds of thousands
of page faults: 12% of the CPU time of a quickstart run went to the kernel. Serving large blocks
from the heap and never trimming it made CPU training ~20% faster; peak memory grew 8% for the
Transformer quickstart and doubled for the LSTM one, whose varied tensor sizes fragment the heap
(benchmarks/RESULTS.md). The CLI calls this once at start (``NMTKIT_MALLOC=system`` opts out);
as a library, nmtkit leaves the allocator of its host program alone.

oneDNN's primitive cache is bounded: bf16 matmuls run through oneDNN, which keeps one compiled
primitive per matrix shape, up to 1,024. Decoding sees a new row count almost every step, so
the cache only grows: bf16 decoding of 400 verses reached ~1.2 GiB of RSS, and ~860 MiB at the
same speed with 16 entries (benchmarks/RESULTS.md), so an entry costs ~0.3 MiB. The bound is
64, not 16: one training step uses a few dozen shapes (each linear layer's forward and two
backward products, the attention products, for encoder and decoder rows), the layers repeat them
in turn, and a least-recently-used cache smaller than such a cycle misses on every access. 64
holds a whole step for ~15 MiB more than 16 (not measured in training: the measuring machine
lacked bf16 units). oneDNN reads the capacity from the environment once, when it first builds a
primitive, so the CLI sets it before importing torch (and its child processes inherit it); a
value the user set is kept.
"""
from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_MAX = -4
ONEDNN_CACHE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_ENTRIES = 64


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


def bound_onednn_cache() -> bool:
    """Give oneDNN's primitive cache ``ONEDNN_CACHE_ENTRIES`` entries unless the user chose a
    capacity (either of oneDNN's two names for it); True if it set one."""
    if ONEDNN_CACHE in os.environ or "DNNL_PRIMITIVE_CACHE_CAPACITY" in os.environ:
        return False
    os.environ[ONEDNN_CACHE] = str(ONEDNN_CACHE_ENTRIES)
    return True
