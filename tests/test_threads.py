"""train.threads: explicit counts are applied; auto uses only the cores other processes leave free."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from nmtkit.runtime import threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Notes:
    def __init__(self):
        self.lines = []

    def info(self, text):
        self.lines.append(text)


def test_an_explicit_count_is_applied(restore_threads):
    notes = Notes()
    assert threads.configure_threads(2, notes) == 2 and torch.get_num_threads() == 2
    assert threads.configure_threads(1, notes) == 1 and torch.get_num_threads() == 1
    assert notes.lines == []


@pytest.mark.parametrize("busy, expected", [(0.0, 4), (0.4, 4), (0.6, 3), (1.0, 3), (2.7, 1), (7.5, 1)])
def test_auto_leaves_the_busy_cores_to_their_owners(monkeypatch, restore_threads, busy, expected):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(threads, "busy_cores_of_others", lambda cpus: busy)
    torch.set_num_threads(4)
    notes = Notes()
    assert threads.configure_threads(0, notes) == expected == torch.get_num_threads()
    assert len(notes.lines) == (expected != 4)
    if expected != 4:
        assert notes.lines[0] == (f"other processes keep {busy:.1f} of 4 cores busy: training with {expected} "
                                  f"thread(s) instead of 4 (train.threads sets the number)")


def test_auto_respects_omp_num_threads(monkeypatch, restore_threads):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setattr(threads, "busy_cores_of_others", lambda cpus: pytest.fail("measured despite OMP_NUM_THREADS"))
    torch.set_num_threads(3)
    assert threads.configure_threads(0, Notes()) == 3


def test_a_spinning_process_counts_as_a_busy_core():
    cpus = os.sched_getaffinity(0)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = threads.busy_cores_of_others(cpus, seconds=1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy is not None and 0.5 <= busy <= len(cpus) + 0.1


def test_niced_time_is_busy_only_where_nice_does_not_take_effect(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    # fields: user nice system idle iowait irq softirq steal (then guest fields, ignored)
    stat.write_text("cpu  900 900 90 900 0 0 0 0 0 0\n"
                    "cpu0 100 500 50 300 0 0 0 0 0 0\n"
                    "cpu1 200 400 40 600 10 1 2 3 0 0\n"
                    "intr 12345\n", encoding="ascii")
    assert threads._cpu_ticks({0}, str(stat), count_niced=False) == (150, 950)
    assert threads._cpu_ticks({0}, str(stat)) == (650, 950)
    assert threads._cpu_ticks({0, 1}, str(stat), count_niced=False) == (150 + 246, 950 + 1256)
    assert threads._cpu_ticks({0}, str(tmp_path / "missing")) is None
    autogroup = tmp_path / "sched_autogroup_enabled"
    monkeypatch.setattr(os, "nice", lambda increment: 0)
    autogroup.write_text("1\n")
    assert threads.niced_work_yields(str(autogroup)) is False  # sessions share fairly whatever their nice
    autogroup.write_text("0\n")
    assert threads.niced_work_yields(str(autogroup)) is True
    assert threads.niced_work_yields(str(tmp_path / "none")) is True  # no autogroup scheduling at all
    monkeypatch.setattr(os, "nice", lambda increment: 10)
    assert threads.niced_work_yields(str(autogroup)) is False  # niced ourselves: niced peers are equals



class Console(Notes):
    def __init__(self):
        super().__init__()
        self.warnings = []

    def warn(self, text):
        self.warnings.append(text)


@pytest.mark.parametrize("busy, expected", [
    (1.0, "other processes keep 1.0 of 4 cores busy: this run goes on with the 4 thread(s) it started with, so "
          "that it resumes exactly (train.threads sets another count, at the cost of that)"),
    (None, "auto would train with 2 thread(s) now: this run goes on with the 4 thread(s) it started with, so that "
           "it resumes exactly (train.threads sets another count, at the cost of that)")], ids=["busy", "unmeasured"])
def test_a_resumed_run_keeps_its_count_and_says_the_load_it_measured(monkeypatch, restore_threads, busy, expected):
    """The load is the reading's, as data (not cut out of another message's text)."""
    from nmtkit.training.startup import training_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(threads, "busy_cores_of_others", lambda cpus: busy)
    monkeypatch.setattr(threads, "_pool", threads._Pool())
    torch.set_num_threads(4 if busy is not None else 2)  # unmeasured: PyTorch's default (2) is auto's count
    console = Console()
    assert training_threads(0, 4, console) == 4 == torch.get_num_threads()
    assert console.lines == [expected] and console.warnings == []


def test_a_resumed_run_trains_with_no_more_threads_than_cpus_it_has_now(monkeypatch, restore_threads):
    """A run recorded 16 threads on a bigger machine: 16 threads on 2 CPUs would crawl, so it
    trains with 2 and warns that it is no longer exact."""
    from nmtkit.training.startup import training_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(threads, "busy_cores_of_others", lambda cpus: pytest.fail("measured for a capped count"))
    console = Console()
    assert training_threads(0, 16, console) == 2 == torch.get_num_threads()
    assert console.warnings == ["this run trained with 16 thread(s) but 2 CPU(s) are available now: training with 2; "
                                "the weights depend on the count, so the run no longer resumes exactly (bit for bit)"]
    assert console.lines == []
