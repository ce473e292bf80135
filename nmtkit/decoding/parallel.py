"""Several search batches at once on a CPU, each on its own share of the threads.

One decoder step is many small operations (a few hundred rows through 256-wide layers, attention
over a short cache, a top-k): PyTorch's intra-op threads split each one and wait for the slowest
part, so a second thread on the same batch adds little. Two batches searched side by side, one
thread each, keep both cores busy instead. On 2 cores (Zen 4, bf16, the quickstart model, 1,000
test verses) beam 4 went from 50-56 to 73-77 sentences/s and greedy from 150-161 to 162-190
(benchmarks/RESULTS.md, "Batches side by side"), with the same translations: every row of a batch
is computed alone, whatever the batch and the thread count (``models/prepack.py``).

CTranslate2 offers the same as ``inter_threads``; its ``intra_threads`` is PyTorch's thread count.
Each batch holds its own search state, so memory grows with the number searched at once. A stop
(Ctrl-C, SIGTERM) reaches the calling thread; the batches already running finish first (seconds),
those not started are dropped.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence, TypeVar

Task = TypeVar("Task")
Result = TypeVar("Result")


def split_threads(threads: int, workers: int, tasks: int) -> tuple[int, int]:
    """(batches at once, threads each) for ``tasks`` batches on ``threads`` threads when up to
    ``workers`` may run at once: never more at once than batches or threads, and the threads
    shared evenly (a remainder stays idle rather than make one batch the slowest)."""
    at_once = max(1, min(workers, tasks, threads))
    return at_once, max(1, threads // at_once)


def run_side_by_side(tasks: Sequence[Task], run: Callable[[Task], Result], workers: int) -> Iterator[tuple[Task, Result]]:
    """(task, run(task)) for every task, in order, running up to ``workers`` at once on the CPU
    threads PyTorch has now (``split_threads``); one at a time on the calling thread when that
    is all there is to do. An error in any task is raised here, and tasks not started then are
    dropped."""
    if workers > 1 and len(tasks) > 1:  # torch only then: the CTranslate2 engine translates without it
        import torch

        threads = torch.get_num_threads()
        at_once, each = split_threads(threads, workers, len(tasks))
    else:
        at_once = 1
    if at_once == 1:
        for task in tasks:
            yield task, run(task)
        return
    # PyTorch's thread count is per thread: each worker sets its own; setting it also changes the
    # count new threads start with, which the caller's own count, set again at the end, restores
    pool = ThreadPoolExecutor(at_once, thread_name_prefix="nmtkit-search", initializer=torch.set_num_threads,
                              initargs=(each,))
    try:
        for task, result in zip(tasks, pool.map(run, tasks)):
            yield task, result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(threads)
