"""Host memory settings the CLI applies once at start, before torch loads.

Freed blocks are kept for reuse instead of being handed back to the kernel: glibc serves every
allocation above a threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps it on free. A
training step allocates and frees the same large tensors every time ([tokens, vocabulary] logits
and their gradient are ~130 MB at 4k-token batches), so each step paid for hundreds of thousands
of page faults: 12% of the CPU time of a quickstart run went to the kernel. Serving large blocks
from the heap and never trimming it made CPU training ~20% faster; peak memory grew 8% for the
Transformer quickstart and doubled for the LSTM one, whose varied tensor sizes fragment the heap
(benchmarks/RESULTS.md). The CLI calls this once at start (``NMTKIT_MALLOC=system`` opts out);
as a library, nmtkit leaves the allocator of its host program alone. Where it tuned malloc,
``nmtkit run`` hands the kept blocks back once training is over (``hand_back_freed_memory``).

The caches of compiled matmul kernels are bounded. bf16 matmuls run through oneDNN, which
JIT-compiles a kernel per matrix shape and keeps it twice over: in oneDNN's own primitive cache
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, 1,024 entries by default) and in the LRU cache of ideep,
PyTorch's oneDNN wrapper (``LRU_CACHE_CAPACITY``, 1,024 by default), whose entries keep their
primitives alive after oneDNN evicts them, so bounding one cache alone bounds little. Decoding
meets a new shape almost every step (the key length grows, the row count falls as hypotheses
finish) and training a few dozen per batch shape, each entry holding ~0.3-1 MiB of heap: with
PyTorch's defaults bf16 decoding grew from 517 to 1,065 MiB over 5 batches of 40 verses, and a
40-step bf16 training peaked at 1,438 MiB, against 341 MiB (flat) and 988 MiB with 32 entries
in each cache (docs/performance.md, "Memory in bf16"). Most kernels a training step needs are
new anyway (its batch shape is) and a step's repeats fit in 32 entries: 40 steps compiled 1,258 kernels with 32 entries, 1,253 with 64 and
1,312 with 16. Both libraries read their capacity from the environment once, when they first
build a kernel, so the CLI sets them before importing torch (its child processes inherit them);
a value the user set is kept (``LRU_CACHE_CAPACITY=0`` crashes PyTorch: the least is 1).
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_MAX = -4
KERNEL_CACHE_ENTRIES = 32
# each kernel cache's capacity variables: the first is the one nmtkit sets, any of them is the user's choice
KERNEL_CACHES = (("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY"),  # oneDNN's own
                 ("LRU_CACHE_CAPACITY",))  # ideep's, in PyTorch


def _glibc():
    """The C library if it is glibc (other C libraries have other knobs), else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018
    except (OSError, AttributeError, TypeError):
        return None
    return libc


_tuned = False  # True once keep_freed_memory tuned this process's malloc


def keep_freed_memory() -> bool:
    """Tune glibc malloc as above; True if it did. Does nothing where the user chose an
    allocator (LD_PRELOAD, MALLOC_* variables), where ``NMTKIT_MALLOC=system``, or off glibc."""
    if os.environ.get("NMTKIT_MALLOC") == "system" or os.environ.get("LD_PRELOAD") or \
            any(key.startswith("MALLOC_") for key in os.environ):
        return False
    libc = _glibc()
    if libc is None:
        return False
    global _tuned
    _tuned = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))
    return _tuned


def hand_back_freed_memory() -> bool:
    """Where ``keep_freed_memory`` tuned malloc: return the heap's free pages to the kernel
    (glibc's ``malloc_trim``) once a stage that freed much is over; True if any went back.
    ``nmtkit run`` translates after training in the same process, and its search threads
    allocate from glibc arenas of their own, which apparently cannot reuse the main arena's kept
    training blocks: the run's peak was training's heap plus the translation's
    (benchmarks/RESULTS.md, "The quickstart end to end"). Nothing otherwise: the user's own
    allocator settings, and nmtkit as a library, are left alone."""
    libc = _glibc() if _tuned else None
    return bool(libc.malloc_trim(0)) if libc is not None else False


def bound_kernel_caches() -> list[str]:
    """Give each cache of compiled matmul kernels ``KERNEL_CACHE_ENTRIES`` entries unless the
    user chose its capacity (under any of its names); the variables it set."""
    chosen = []
    for names in KERNEL_CACHES:
        if not any(name in os.environ for name in names):
            os.environ[names[0]] = str(KERNEL_CACHE_ENTRIES)
            chosen.append(names[0])
    return chosen


def resident_mib() -> Optional[float]:
    """This process's resident memory now, in MiB (None where /proc cannot tell): logged with
    training's progress, so memory that grows over a run shows where it grows."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            pages = int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2 ** 20, 1)
