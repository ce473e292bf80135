"""Training under torchrun on CPU (gloo, 127.0.0.1 only): ranks end with identical weights,
two processes equal one process accumulating twice as much, and a two-process run stopped
by a signal resumes to the weights of an uninterrupted one."""
from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import reversal_pairs, tiny_recipe, write_prepared

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with gloo is not available")

STEPS = 40  # updates of 2 batches (one per process), five epochs; a checkpoint every 5 updates
TESTS = Path(__file__).parent


def _recipe(workdir: Path, **train) -> dict:
    # eps 1e-4: Adam's 1e-9 would blow the rounding noise in the attention keys' bias gradient (zero in
    # exact arithmetic) up to lr-sized steps, so a different summation order would show as a difference
    return tiny_recipe(workdir, model={"dropout": 0.1},  # dropout on: its random masks must agree too
                       train={"max_steps": STEPS, "batches_per_update": 2, "max_tokens": 200, "log_every": 5,
                              "validate_every": 10, "save_every": 5, "eps": 1e-4, **train})


def _write_recipe(path: Path, recipe: dict) -> Path:
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def _torchrun(*args: str) -> list[str]:
    with socket.socket() as sock:  # a free loopback port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(port), *args]


def _env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS.parent), os.environ.get("PYTHONPATH")) if p)}
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's own connections stay on loopback too
    return env


def _stop(proc: subprocess.Popen) -> None:
    """End a torchrun we started: SIGTERM lets it stop its workers (they run in their own sessions)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run(cmd: list[str], log: Path, timeout: float = 120) -> str:
    """Run ``cmd`` to the end (bounded by ``timeout``); returns its output, asserts success."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env())
        try:
            proc.wait(timeout=timeout)
        finally:
            _stop(proc)
    text = log.read_text(encoding="utf-8", errors="replace")
    assert proc.returncode == 0, text
    return text


def _checkpoint_weights(workdir: Path) -> tuple[int, dict]:
    from nmtkit.training.checkpoint import latest_checkpoint

    ck = latest_checkpoint(workdir / "train")
    return ck.trainer.step, ck.weights


def _train_records(workdir: Path) -> list[dict]:
    import json

    lines = (workdir / "train" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [record for record in map(json.loads, lines) if record["type"] == "train"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("ddp_task")
    write_prepared(workdir, reversal_pairs(240, 0, length=6), reversal_pairs(20, 1, length=6))
    return workdir / "prepared"


def _workdir(prepared: Path, path: Path) -> Path:
    import shutil

    shutil.copytree(prepared, path / "prepared")
    return path


@pytest.fixture(scope="module")
def two_processes(prepared, tmp_path_factory) -> tuple[Path, dict, dict]:
    """An uninterrupted two-process run: (workdir, rank 0's final weights, rank 1's)."""
    workdir = _workdir(prepared, tmp_path_factory.mktemp("ddp_two"))
    recipe = _write_recipe(workdir / "recipe.yaml", _recipe(workdir))
    _run(_torchrun(str(TESTS / "ddp_launch.py"), str(recipe), str(workdir)), workdir / "torchrun.log")
    return workdir, load_file(workdir / "rank0.safetensors"), load_file(workdir / "rank1.safetensors")


def test_ranks_end_identical_and_rank0_checkpoints_them(two_processes):
    workdir, rank0, rank1 = two_processes
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    step, saved = _checkpoint_weights(workdir)
    assert step == STEPS and saved.keys() == rank0.keys()
    assert all(torch.equal(saved[name], rank0[name]) for name in saved)


def test_two_processes_equal_one_process_accumulating_twice(two_processes, prepared, tmp_path):
    from nmtkit.config import from_dict
    from nmtkit.runtime.console import get_console
    from nmtkit.training.trainer import train

    _, rank0, _ = two_processes
    workdir = _workdir(prepared, tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the torchrun workers (OMP_NUM_THREADS=1)
    try:
        train(from_dict(_recipe(workdir, batches_per_update=0, update_freq=2)), get_console(-1))
    finally:
        torch.set_num_threads(threads)
    step, single = _checkpoint_weights(workdir)
    assert step == STEPS
    for name in rank0:
        torch.testing.assert_close(single[name], rank0[name], rtol=0, atol=1e-6, msg=name)
    logged = [_train_records(w) for w in (workdir, two_processes[0])]
    assert [r["step"] for r in logged[0]] == [r["step"] for r in logged[1]]
    for one, two in zip(*logged):  # the loss of all ranks' tokens, however many processes
        assert one["loss"] == pytest.approx(two["loss"], abs=2e-4), (one, two)


def test_stopped_two_process_run_resumes_to_the_same_weights(two_processes, prepared, tmp_path):
    _, rank0, _ = two_processes
    workdir = _workdir(prepared, tmp_path)
    recipe = _write_recipe(workdir / "recipe.yaml", _recipe(workdir))
    command = _torchrun("-m", "nmtkit", "train", str(recipe))
    with open(tmp_path / "first.log", "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=_env())
        try:
            deadline = time.monotonic() + 120
            while not (workdir / "train" / "checkpoints" / "step_00000005").is_dir():
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)  # as `kill` or a scheduler would; torchrun forwards it
            proc.wait(timeout=60)
        finally:
            _stop(proc)
    first = (tmp_path / "first.log").read_text()
    assert first.count("stopped by signal") == 1, first  # one log, from rank 0
    stopped_at, _ = _checkpoint_weights(workdir)
    assert 5 <= stopped_at < STEPS, first

    second = _run(command, tmp_path / "second.log")  # the same command resumes
    assert second.count(f"resumed from step_{stopped_at:08d}") == 1, second
    assert second.count("400 = 200 x 1 x 2 process(es)") == 1, second  # effective batch, printed once
    step, resumed = _checkpoint_weights(workdir)
    assert step == STEPS
    for name in rank0:
        assert torch.equal(resumed[name], rank0[name]), name
    steps = [record["step"] for record in _train_records(workdir)]
    assert steps == sorted(set(steps)) and steps[-1] == STEPS


def test_batches_per_update_fixes_the_global_batch(monkeypatch, prepared, tmp_path):
    from nmtkit.config import TrainConfig, from_dict
    from nmtkit.errors import ConfigError
    from nmtkit.runtime.console import NmtConsole
    from nmtkit.training import distributed as dist
    from nmtkit.training.trainer import train

    assert dist.local_update_freq(TrainConfig(update_freq=3)) == 3
    assert dist.local_update_freq(TrainConfig(batches_per_update=8)) == 8
    monkeypatch.setattr(dist, "world_size", lambda: 4)
    assert dist.local_update_freq(TrainConfig(update_freq=3)) == 3  # per process
    assert dist.local_update_freq(TrainConfig(batches_per_update=8)) == 2  # over all 4
    for bad, message in ((TrainConfig(batches_per_update=6), "not divisible by the 4"),
                         (TrainConfig(batches_per_update=8, update_freq=2), "not both"),
                         (TrainConfig(batches_per_update=-1), r"0 \(off\) or positive")):
        with pytest.raises(ConfigError, match=message):
            dist.local_update_freq(bad)
    monkeypatch.undo()
    shown = io.StringIO()
    train(from_dict(_recipe(_workdir(prepared, tmp_path), batches_per_update=4)), NmtConsole(0, file=shown, width=200),
          dry_run=True)
    assert "800 = 200 x 4 x 1 process(es)" in shown.getvalue()


def test_a_repeated_signal_within_two_seconds_is_one_stop_request():
    from nmtkit.training.signals import StopFlag

    with StopFlag() as stop:  # torchrun forwards a signal that its workers may have received already
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
    assert stop.signal == signal.SIGTERM


def test_compiled_two_process_run_matches_an_uncompiled_single_process(prepared, tmp_path):
    """train.compile under DDP: the compiled module sits inside DDP, so its gradient hooks and
    no_sync work as uncompiled (same model dims as tests/test_compile.py: inductor's cache serves both)."""
    from nmtkit.config import from_dict
    from nmtkit.runtime.compiler import missing_compiler
    from nmtkit.runtime.console import get_console
    from nmtkit.training.trainer import train

    if missing_compiler(torch.device("cpu")):
        pytest.skip("no C++ compiler for inductor")
    model = {"d_model": 16, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 1, "dropout": 0.0}

    def recipe(workdir: Path, **train) -> dict:
        return tiny_recipe(workdir, model=model, train={"max_steps": 6, "max_tokens": 200, "log_every": 3,
                                                        "validate_every": 6, "save_every": 6, "eps": 1e-4, **train})

    two = _workdir(prepared, tmp_path / "two")
    path = _write_recipe(two / "recipe.yaml", recipe(two, batches_per_update=2, compile=True))
    _run(_torchrun(str(TESTS / "ddp_launch.py"), str(path), str(two)), two / "torchrun.log", timeout=600)
    one = _workdir(prepared, tmp_path / "one")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the torchrun workers (OMP_NUM_THREADS=1)
    try:
        train(from_dict(recipe(one, update_freq=2)), get_console(-1))
    finally:
        torch.set_num_threads(threads)
    rank0, rank1 = load_file(two / "rank0.safetensors"), load_file(two / "rank1.safetensors")
    (step, saved), (_, single) = _checkpoint_weights(two), _checkpoint_weights(one)
    assert step == 6 and saved.keys() == single.keys() == rank0.keys()  # no "_orig_mod." names
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]) and torch.equal(saved[name], rank0[name]), name
        torch.testing.assert_close(rank0[name], single[name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_process_group_of_one_joined_by_the_caller_trains_under_ddp(monkeypatch, prepared, tmp_path):
    """torchrun with one process sets WORLD_SIZE=1; a caller that joined a group anyway (the GPU
    check does, to exercise NCCL on one GPU) gets DDP over that group, not a bare model."""
    from torch.nn.parallel import DistributedDataParallel

    from nmtkit.config import from_dict
    from nmtkit.runtime.console import get_console
    from nmtkit.training import distributed as dist
    from nmtkit.training import trainer

    workdir = _workdir(prepared, tmp_path)
    wrapped = []
    wrap = dist.wrap
    monkeypatch.setattr(dist, "wrap", lambda model, device: wrapped.append(wrap(model, device)) or wrapped[-1])
    monkeypatch.setenv("WORLD_SIZE", "1")
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0,
                                         world_size=1)
    try:
        trainer.train(from_dict(tiny_recipe(workdir, train={"max_steps": 4, "save_every": 2, "validate_every": 4})),
                      get_console(-1))
        assert torch.distributed.is_initialized()  # joined by the caller: left to the caller
    finally:
        torch.distributed.destroy_process_group()
    assert len(wrapped) == 1 and isinstance(wrapped[0], DistributedDataParallel)
    assert _checkpoint_weights(workdir)[0] == 4


def test_a_joined_group_of_one_on_cuda_gets_the_local_rank_device(monkeypatch, tmp_path):
    """DDP needs a CUDA device with an index: a caller's group of one process gets cuda:LOCAL_RANK,
    as a torchrun group of many does (``train.device=cuda`` names none)."""
    from nmtkit.training import distributed as dist

    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0,
                                         world_size=1)
    try:
        with dist.process_group(torch.device("cuda")) as device:
            assert device == torch.device("cuda", 0) and chosen == [device]
    finally:
        torch.distributed.destroy_process_group()
    with dist.process_group(torch.device("cuda")) as device:  # no group joined: nothing changes
        assert device == torch.device("cuda") and len(chosen) == 1


def test_a_resume_on_another_process_count_says_the_update_changed(monkeypatch, prepared, tmp_path):
    """train.update_freq counts per process: a run resumed on fewer processes would take smaller
    updates without a word. The count is recorded; a checkpoint that lacks it (0) warns of nothing."""
    from nmtkit.config import TrainConfig, from_dict
    from nmtkit.runtime.console import NmtConsole
    from nmtkit.training import checkpoint
    from nmtkit.training import distributed as dist
    from nmtkit.training.trainer import train

    recipe = tiny_recipe(_workdir(prepared, tmp_path), train={"max_steps": 2, "save_every": 2, "validate_every": 2,
                                                              "update_freq": 2, "max_tokens": 100, "threads": 1})
    train(from_dict(recipe), NmtConsole(0, file=io.StringIO(), width=400))
    assert checkpoint.latest_checkpoint(tmp_path / "train").trainer.processes == 1
    read = checkpoint.trainer_state
    for recorded, warned in ((2, True), (0, False)):
        monkeypatch.setattr(checkpoint, "trainer_state", lambda raw: dataclasses_replace(read(raw), recorded))
        recipe["train"]["max_steps"] += 2
        shown = io.StringIO()
        train(from_dict(recipe), NmtConsole(0, file=shown, width=400))
        message = ("resumed on 1 process(es) where this run trained on 2: train.update_freq=2 counts per process, so "
                   "an update is now 2 batch(es) of up to 100 tokens instead of 4 (train.batches_per_update fixes "
                   "the count over all processes)")
        assert (message in shown.getvalue()) is warned
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    assert dist.update_change(TrainConfig(update_freq=2), 2) == ""
    assert dist.update_change(TrainConfig(batches_per_update=4), 1) == ""  # fixed over all processes


def dataclasses_replace(state, processes):
    import dataclasses

    return dataclasses.replace(state, processes=processes)
