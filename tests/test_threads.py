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

