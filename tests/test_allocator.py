"""The CLI's malloc tuning: large freed blocks are reused, not returned and faulted in again."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nmtkit.allocator import keep_freed_memory

PROBE = """
import resource, sys, torch
from nmtkit.allocator import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
def step():  # what a training step does: large tensors of a few sizes, allocated and freed
    a = torch.ones(15_000_000); b = torch.ones(9_000_000); c = a * 2; del a, b, c
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "NMTKIT_MALLOC")}
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, check=True)
    return int(done.stdout.strip())


def test_large_blocks_are_reused_without_page_faults():
    try:
        import ctypes

        ctypes.CDLL(None).gnu_get_libc_version
    except (OSError, AttributeError):
        pytest.skip("glibc only")
    untuned, tuned = page_faults("untuned"), page_faults("tuned")
    assert untuned > 150_000  # 5 steps of 156 MB = 190k pages of 4 KiB, each faulted in again
    assert tuned * 4 < untuned  # freed blocks reused (15-30k measured: a few still come fresh)


@pytest.mark.parametrize("variable", [("MALLOC_ARENA_MAX", "2"), ("LD_PRELOAD", "libjemalloc.so.2"),
                                      ("NMTKIT_MALLOC", "system")])
def test_a_users_own_allocator_choice_is_left_alone(monkeypatch, variable):
    monkeypatch.setenv(*variable)
    assert keep_freed_memory() is False
