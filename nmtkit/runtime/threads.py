"""CPU threads for training and decoding on a machine that other processes share.

PyTorch's intra-op pool splits each parallel region evenly over its threads and waits for
the last one. When another process keeps one of two cores busy, every region waits for the
thread that shares that core: a quickstart training fell from ~5,500 to 470-850 target
tokens/s (issue 20), and beam-4 decoding from 36 to 5 sentences/s, far below what one thread
on the free core gives. So with 0 threads (auto: ``train.threads=0``, ``translate``/``serve
--threads 0``) nmtkit first measures, for a quarter of a second, how many of its cores other
processes keep busy (niced ones only where nice takes effect: ``niced_work_yields``) and uses
only the free ones (at least one); on an idle machine it keeps PyTorch's default. A count N, or
``OMP_NUM_THREADS``, is used as given.

The quarter second need not delay a command: ``start_reading`` takes it in a background thread
while the command imports torch and loads its model, and the next ``configure_threads`` uses
that reading. torch is imported only inside the functions that need it, so the CLI can start
the reading before torch loads. A CTranslate2 export needs no torch: its engine reads its
vocabularies meanwhile and waits for what is left of the quarter second only when it creates its
translator (``configure_threads(..., pytorch=False)``).

The OpenMP wait policy (``OMP_WAIT_POLICY=passive``: idle threads sleep instead of spinning)
cannot be chosen here: libgomp reads it once, when torch loads, so it belongs in the
environment of the command (benchmarks/busy_machine.py measures both knobs).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple, Optional

# 25 clock ticks per CPU: a core another process keeps busy read 1.00-1.02 (1.00-1.03 over 0.5 s),
# an idle machine 0.00-0.04 (0.00-0.02), each rounding to the same count
# (benchmarks/results/busy_zen4_quarter/readings.txt); an export waits for the reading
SAMPLE_SECONDS = 0.25
READING_MAX_AGE_S = 30.0  # an early reading older than this says little about the load now: measured again


def niced_work_yields(autogroup: str = "/proc/sys/kernel/sched_autogroup_enabled") -> bool:
    """Whether other processes' niced time leaves us the core: the scheduler gives a process at
    nice 0 almost all of a core it shares with one at nice 19 (weights 1024:15), but only where
    nice compares across the machine: with autogroup scheduling on (many desktop kernels) each
    terminal session gets an equal share whatever its nice, and a niced process of our own
    competes with the niced ones as an equal."""
    if os.nice(0) > 0:
        return False
    try:
        with open(autogroup, encoding="ascii") as handle:
            return handle.read().strip() == "0"
    except OSError:
        return True  # a kernel without autogroup scheduling


def _cpu_ticks(cpus: set[int], stat: str = "/proc/stat", count_niced: bool = True) -> Optional[tuple[int, int]]:
    """(busy, total) clock ticks of ``cpus`` since boot, from /proc/stat (None off Linux); niced
    time is busy only if ``count_niced``."""
    busy = total = 0
    try:
        with open(stat, encoding="ascii") as handle:
            for line in handle:
                name, *fields = line.split()
                if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
                    continue
                user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
                busy += user + system + irq + softirq + steal + (nice if count_niced else 0)
                total += user + nice + system + idle + iowait + irq + softirq + steal
    except (OSError, ValueError):
        return None
    return (busy, total) if total else None


def busy_cores_of_others(cpus: set[int], seconds: float = SAMPLE_SECONDS) -> Optional[float]:
    """How many of ``cpus`` other processes kept busy over ``seconds`` (this process's own
    CPU time, every thread of it, subtracted); None where /proc/stat cannot tell."""
    count_niced = not niced_work_yields()
    start, own_start = _cpu_ticks(cpus, count_niced=count_niced), os.times()
    time.sleep(seconds)
    end, own_end = _cpu_ticks(cpus, count_niced=count_niced), os.times()
    if start is None or end is None or end[1] <= start[1]:
        return None
    wall = (end[1] - start[1]) / len(cpus)  # ticks per CPU over the interval
    own = (own_end.user + own_end.system - own_start.user - own_start.system) * os.sysconf("SC_CLK_TCK")
    return max(0.0, (end[0] - start[0] - own) / wall)


def _auto_possible() -> bool:
    """Whether auto measures at all: not with OMP_NUM_THREADS, one core, or off Linux."""
    return (not os.environ.get("OMP_NUM_THREADS") and hasattr(os, "sched_getaffinity")
            and len(os.sched_getaffinity(0)) > 1)


class LoadReading:
    """``busy_cores_of_others`` taken in a daemon thread from now on, so the command's imports
    and model load overlap the quarter second instead of waiting for it."""

    def __init__(self, cpus: set[int]):
        self.cpus, self.started = set(cpus), time.monotonic()
        self._busy: Optional[float] = None
        self._thread = threading.Thread(target=self._measure, name="nmtkit-load-reading", daemon=True)
        self._thread.start()

    def _measure(self) -> None:
        try:
            self._busy = busy_cores_of_others(self.cpus)
        except Exception:  # a reading that fails leaves PyTorch's default, as a None one does
            self._busy = None

    def busy(self) -> Optional[float]:
        """The reading, waiting for the rest of its quarter second if it is not done."""
        self._thread.join()
        return self._busy


_early: list[LoadReading] = []  # the reading start_reading began, until configure_threads uses it


def start_reading(setting: int) -> None:
    """Begin the load reading of an auto (0) ``setting`` now, in the background (nothing for N)."""
    _early.clear()
    if setting <= 0 and _auto_possible():
        _early.append(LoadReading(os.sched_getaffinity(0)))


def _take_reading(cpus: set[int]) -> Optional[float]:
    """The early reading of ``cpus`` when one is pending and recent, else one taken now."""
    early = _early.pop() if _early else None
    if early is not None and early.cpus == cpus and time.monotonic() - early.started < READING_MAX_AGE_S:
        return early.busy()
    return busy_cores_of_others(cpus)


@dataclass
class _Pool:
    default: Optional[int] = None  # PyTorch's count before nmtkit changed it
    ours: Optional[int] = None  # the count nmtkit last set


_pool = _Pool()


def pytorch_default() -> int:
    """PyTorch's own thread count: the current one, unless it is the one nmtkit chose (a run
    that trained on one thread of a busy machine still decodes with all on an idle one)."""
    import torch

    now = torch.get_num_threads()
    if _pool.default is None or now != _pool.ours:
        _pool.default = now
    return _pool.default


def physical_cores(cpus: Iterable[int], sysfs: str = "/sys/devices/system/cpu") -> int:
    """How many physical cores ``cpus`` (logical CPU numbers) span: two hyperthreads of one core
    count once (a CPU whose topology cannot be read counts as a core of its own)."""
    cores = set()
    for cpu in cpus:
        topology = Path(sysfs) / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def machine_threads() -> int:
    """PyTorch's default thread count, found without importing torch (for an engine with a pool
    of its own, CTranslate2): the pool's count where torch is loaded already, else a positive
    ``OMP_NUM_THREADS``, else one thread per physical core this process may run on."""
    if "torch" in sys.modules:
        return sys.modules["torch"].get_num_threads()
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp)
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return physical_cores(cpus)


class ThreadChoice(NamedTuple):
    """What ``choose_threads`` chose and the load reading it chose by, as data: a resumed
    training that keeps its recorded count says the reading in its own words."""

    threads: int
    note: Optional[str]  # why auto chose fewer than the default (None: it did not)
    busy: Optional[float] = None  # cores other processes kept busy (None: not measured)
    cpus: int = 0  # cores this process may run on, where measured


def choose_threads(setting: int, what: str = "training", option: str = "train.threads",
                   default: Optional[int] = None) -> ThreadChoice:
    """The threads to use, with a note saying why when auto chose fewer than the default (PyTorch's,
    unless ``default`` is given); ``what`` and ``option`` name the work and the setting in the note."""
    default = pytorch_default() if default is None else default
    if setting > 0:
        return ThreadChoice(setting, None)
    if default <= 1 or not _auto_possible():
        _early.clear()
        return ThreadChoice(default, None)
    cpus = os.sched_getaffinity(0)
    busy = _take_reading(cpus)
    if busy is None:
        return ThreadChoice(default, None)
    threads = max(1, min(default, len(cpus) - round(busy)))
    if threads == default:
        return ThreadChoice(default, None, busy, len(cpus))
    return ThreadChoice(threads, f"other processes keep {busy:.1f} of {len(cpus)} cores busy: {what} with {threads} "
                                 f"thread(s) instead of {default} ({option} sets the number)", busy, len(cpus))


def configure_threads(setting: int, console, what: str = "training", option: str = "train.threads",
                      pytorch: bool = True) -> int:
    """Apply ``setting`` (0: auto, see above) to PyTorch's CPU pool; returns the count. With
    ``pytorch`` False only the count is chosen (``machine_threads`` standing for PyTorch's default),
    for an engine with a pool of its own (CTranslate2), and torch is not imported."""
    if not pytorch:
        choice = choose_threads(setting, what, option, default=machine_threads())
        if choice.note:
            console.info(choice.note)
        return choice.threads
    import torch

    choice = choose_threads(setting, what, option)
    if choice.threads != torch.get_num_threads():
        torch.set_num_threads(choice.threads)
    _pool.ours = choice.threads
    if choice.note:
        console.info(choice.note)
    return choice.threads
