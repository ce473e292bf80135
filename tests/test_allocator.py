"""The CLI's malloc tuning: large freed blocks are reused, not returned and faulted in again."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nmtkit.runtime.allocator import bound_onednn_cache, keep_freed_memory

PROBE = """
import resource, sys, torch
from nmtkit.runtime.allocator import keep_freed_memory
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


CLI_PROBE = """
import atexit, os, sys
atexit.register(lambda: print(os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"), "torch" in sys.modules))
sys.argv = ["nmtkit", "prepare", "--help"]
from nmtkit.cli import main
main()
"""


@pytest.mark.parametrize("users_value, expected", [(None, "64"), ("1024", "1024")])
def test_the_cli_bounds_onednns_cache_before_torch_loads_unless_the_user_chose(users_value, expected):
    """The CLI process (whose environment its children inherit) has the bound, set before any
    command imported torch; a capacity the user set is kept."""
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY",
                                                            "DNNL_PRIMITIVE_CACHE_CAPACITY")}
    if users_value is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = users_value
    done = subprocess.run([sys.executable, "-c", CLI_PROBE], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.splitlines()[-1] == f"{expected} False"


def test_onednns_older_variable_name_counts_as_the_users_choice(monkeypatch):
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "placeholder")  # restored after the test
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    monkeypatch.setenv("DNNL_PRIMITIVE_CACHE_CAPACITY", "8")
    assert bound_onednn_cache() is False
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ
