"""Crash-exact resume through the real command line.

A tiny run is killed with SIGKILL at seeded random moments (during a step, a validation, a
checkpoint or ``best/`` write, a metrics append, or while starting up) and resumed each time;
it must end with the same weights, optimizer moments, EMA, ``best/`` and metrics, bit for bit,
as one uninterrupted run, and after every kill each ``step_N`` directory on disk must load.
SIGINT / SIGTERM must save a checkpoint, exit 130 / 143 and say how to resume. Resume rules
that need no kill or signal (a finished run, a changed dev set) train in this process.

``benchmarks/crash_resume.py`` runs the same check as a longer soak with more kills.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
import yaml

from conftest import reversal_pairs
from support.cli import cli_in_process
from support.resume import (MAX_STEPS, assert_same_final_state, final_state, make_task, newest_step, reference_run,
                            start_and_wait, train_to_end, train_with_kills)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reference")
    state, step_seconds = reference_run(workdir)
    return workdir, state, step_seconds


def test_killed_and_resumed_run_matches_uninterrupted_run_bit_for_bit(reference, tmp_path):
    ref_dir, ref_state, step_seconds = reference
    recipe = make_task(tmp_path, prepared_from=ref_dir)
    report = train_with_kills(recipe, kills=6, seed=11, step_seconds=step_seconds)
    print(f"\ncrash resume: {report}")
    assert report.kills >= 5
    assert_same_final_state(ref_state, final_state(tmp_path / "train"))
    assert not [p for p in (tmp_path / "train" / "checkpoints").iterdir() if p.name.startswith(".")]


def test_signals_save_exit_and_resume_exactly(reference, tmp_path):
    """SIGINT stops a fresh run, then SIGTERM the resumed one (one run for both signals: each
    process start costs seconds); each saves a checkpoint, exits 130 / 143 and says how to resume,
    and the run then ends as the uninterrupted one did."""
    ref_dir, ref_state, _ = reference
    recipe = make_task(tmp_path, prepared_from=ref_dir)
    run_dir = tmp_path / "train"
    stopped = 0
    for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        proc = start_and_wait(recipe, run_dir, min_step=stopped + 4)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == code, (signum, err)
        text = " ".join(err.split())  # the console wraps long lines
        stopped = int(text.split("stopped by signal at step ")[1].split(";")[0])
        assert "checkpoint saved. Resume with the same `nmtkit train` command." in text
        assert "Traceback" not in err and newest_step(run_dir) == stopped < MAX_STEPS
    train_to_end(recipe)
    assert_same_final_state(ref_state, final_state(run_dir))


def test_resume_survives_a_torn_metrics_line_and_leftover_temp_files(reference, tmp_path):
    """What a kill can leave: half a metrics line, a half-written checkpoint dir, a temp file,
    a pruned checkpoint half deleted, and ``best/`` cut between its two renames."""
    ref_dir, ref_state, _ = reference
    recipe = make_task(tmp_path, prepared_from=ref_dir, max_steps=12)
    train_to_end(recipe)
    run_dir = tmp_path / "train"
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"type": "train", "step": 13, "lo')
    (run_dir / "checkpoints" / ".step_00000013.x1y2z3ab").mkdir()
    (run_dir / "checkpoints" / ".step_00000013.x1y2z3ab" / "model.safetensors").write_bytes(b"half")
    (run_dir / ".metrics.jsonl.abc.tmp").write_text("partial")
    shutil.copytree(run_dir / "checkpoints" / "step_00000012", run_dir / "checkpoints" / ".step_00000009.deleting")
    os.replace(run_dir / "best", run_dir / ".best.old")
    recipe.write_text(recipe.read_text().replace("max_steps: 12", f"max_steps: {MAX_STEPS}"))
    train_to_end(recipe)
    assert_same_final_state(ref_state, final_state(run_dir))
    leftovers = [p.name for p in [*run_dir.iterdir(), *(run_dir / "checkpoints").iterdir()] if p.name.startswith(".")]
    assert leftovers == []


@pytest.mark.parametrize("before, after", [(0.0, 0.01), (0.01, 0.0)])
def test_resume_applies_the_recipes_optimizer_settings(before, after):
    """Loading a checkpoint's optimizer state must not bring back its weight decay, betas or
    eps: the recipe's new values are what the resume message says apply."""
    from types import SimpleNamespace

    from nmtkit.config import from_dict
    from nmtkit.training.optim import make_optimizer
    from nmtkit.training.startup import restore

    model = torch.nn.Linear(3, 2)
    old = from_dict({"data": {"source": "files"}, "train": {"weight_decay": before, "betas": [0.9, 0.98], "eps": 1e-9}})
    optimizer = make_optimizer(model, old, torch.device("cpu"))
    model(torch.ones(4, 3)).sum().backward()
    optimizer.param_groups[0]["lr"] = 0.1
    optimizer.step()
    ck = SimpleNamespace(weights=model.state_dict(), optimizer=optimizer.state_dict(),
                         rng={"torch": torch.get_rng_state()}, path=Path("step_1"))
    new = from_dict({"data": {"source": "files"}, "train": {"weight_decay": after, "betas": [0.8, 0.9], "eps": 1e-6}})
    resumed = make_optimizer(model, new, torch.device("cpu"))
    restore(ck, model, resumed, torch.device("cpu"))
    group = resumed.param_groups[0]
    assert (group["weight_decay"], group["betas"], group["eps"]) == (after, (0.8, 0.9), 1e-6)
    assert group.get("decoupled_weight_decay", isinstance(resumed, torch.optim.AdamW)) == (after > 0)
    state = resumed.state[model.weight]  # the moments still come from the checkpoint
    torch.testing.assert_close(state["exp_avg"], optimizer.state[model.weight]["exp_avg"])


def train_in_process(monkeypatch, capsys, recipe: Path) -> str:
    """``nmtkit -q train RECIPE`` in this process (no kill involved), one thread as ``ENV``; its stderr."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    code, _, err = cli_in_process(monkeypatch, capsys, "-q", "train", str(recipe))
    assert code == 0, err
    return err


def test_a_run_finished_by_max_epochs_stays_finished_and_a_raised_limit_goes_on(tmp_path, monkeypatch, capsys):
    """A run ended by train.max_epochs once looked unfinished: each re-run validated again,
    appended a duplicate record and rewrote its last checkpoint. (Each run in this process.)"""
    recipe = make_task(tmp_path, max_steps=100000)
    settings = yaml.safe_load(recipe.read_text())
    settings["train"].update(max_epochs=2, save_every=1000, validate_every=1000)
    recipe.write_text(yaml.safe_dump(settings))
    train_in_process(monkeypatch, capsys, recipe)
    metrics = (tmp_path / "train" / "metrics.jsonl").read_text()
    first = newest_step(tmp_path / "train")
    saved = {p: p.stat().st_mtime_ns for p in (tmp_path / "train" / "checkpoints").rglob("*")}
    train_in_process(monkeypatch, capsys, recipe)
    assert (tmp_path / "train" / "metrics.jsonl").read_text() == metrics  # no second validation record
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "train" / "checkpoints").rglob("*")} == saved
    settings["train"]["max_epochs"] = 3
    recipe.write_text(yaml.safe_dump(settings))
    train_in_process(monkeypatch, capsys, recipe)
    assert newest_step(tmp_path / "train") == first + first // 2  # one more epoch of as many updates


def test_resume_on_a_changed_dev_set_starts_the_best_score_afresh(tmp_path, monkeypatch, capsys):
    """Scores on another dev set do not compare: the best score and the early-stopping count
    earned on the old one once carried over silently. (Each run in this process.)"""
    from nmtkit.data.ids import save_split
    from nmtkit.data.vocab import Vocab

    recipe = make_task(tmp_path, max_steps=4)
    train_in_process(monkeypatch, capsys, recipe)
    prepared = tmp_path / "prepared"
    vocab = Vocab(prepared / "spm.model")
    dev = reversal_pairs(20, 7, length=5)
    save_split(prepared / "dev.npz", vocab.encode_batch([s for s, _ in dev]), vocab.encode_batch([t for _, t in dev]))
    settings = yaml.safe_load(recipe.read_text())
    settings["train"]["max_steps"] = 8
    recipe.write_text(yaml.safe_dump(settings))
    resumed = train_in_process(monkeypatch, capsys, recipe)
    assert "the dev set changed since step 4 scored the best" in " ".join(resumed.split())
    state = json.loads((tmp_path / "train" / "checkpoints" / "step_00000008" / "trainer.json").read_text())
    assert state["trainer"]["best_step"] == 8 and len(state["trainer"]["dev_sha256"]) == 64
