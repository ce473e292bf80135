"""CPU threads for training on a machine that other processes share.

PyTorch's intra-op pool splits each parallel region evenly over its threads and waits for
the last one. When another process keeps one of two cores busy, every region waits for the
thread that shares that core, and a quickstart training fell from ~5,500 to 470-850 target
tokens/s (issue 20), far below what one thread on the free core gives. So with
``train.threads=0`` (auto) training first measures, for half a second, how many of its cores
other processes keep busy and uses only the free ones (at least one); on an idle machine it
keeps PyTorch's default. ``train.threads=N`` or ``OMP_NUM_THREADS`` are used as given.

The OpenMP wait policy (``OMP_WAIT_POLICY=passive``: idle threads sleep instead of spinning)
cannot be chosen here: libgomp reads it once, when torch loads, so it belongs in the
environment of the command (benchmarks/busy_machine.py measures both knobs).
"""
from __future__ import annotations

import os
import time
from typing import Optional

import torch

SAMPLE_SECONDS = 0.5


def _cpu_ticks(cpus: set[int]) -> Optional[tuple[int, int]]:
    """(busy, total) clock ticks of ``cpus`` since boot, from /proc/stat (None off Linux)."""
    busy = total = 0
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            for line in handle:
                name, *fields = line.split()
                if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
                    continue
                user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
                busy += user + nice + system + irq + softirq + steal
                total += user + nice + system + idle + iowait + irq + softirq + steal
    except (OSError, ValueError):
        return None
    return (busy, total) if total else None


def busy_cores_of_others(cpus: set[int], seconds: float = SAMPLE_SECONDS) -> Optional[float]:
    """How many of ``cpus`` other processes kept busy over ``seconds`` (this process's own
    CPU time subtracted); None where /proc/stat cannot tell."""
    start, own_start = _cpu_ticks(cpus), os.times()
    time.sleep(seconds)
    end, own_end = _cpu_ticks(cpus), os.times()
    if start is None or end is None or end[1] <= start[1]:
        return None
    wall = (end[1] - start[1]) / len(cpus)  # ticks per CPU over the interval
    own = (own_end.user + own_end.system - own_start.user - own_start.system) * os.sysconf("SC_CLK_TCK")
    return max(0.0, (end[0] - start[0] - own) / wall)


def choose_threads(setting: int) -> tuple[int, Optional[str]]:
    """(threads to use, a note saying why when auto chose fewer than PyTorch's default)."""
    default = torch.get_num_threads()
    if setting > 0:
        return setting, None
    if os.environ.get("OMP_NUM_THREADS") or default <= 1 or not hasattr(os, "sched_getaffinity"):
        return default, None
    cpus = os.sched_getaffinity(0)
    busy = busy_cores_of_others(cpus)
    if busy is None:
        return default, None
    threads = max(1, min(default, len(cpus) - round(busy)))
    if threads == default:
        return default, None
    return threads, (f"other processes keep {busy:.1f} of {len(cpus)} cores busy: training with {threads} "
                     f"thread(s) instead of {default} (train.threads sets the number)")


def configure_threads(setting: int, console) -> int:
    """Apply ``train.threads`` (0: auto, see above) to PyTorch's CPU pool; returns the count."""
    threads, note = choose_threads(setting)
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    if note:
        console.info(note)
    return threads
