"""Crash-exact resume through the real command line.

A tiny run is killed with SIGKILL at seeded random moments (during a step, a validation, a
checkpoint or ``best/`` write, a metrics append, or while starting up) and resumed each time;
it must end with the same weights, optimizer moments, EMA, ``best/`` and metrics, bit for bit,
as one uninterrupted run, and after every kill each ``step_N`` directory on disk must load.
SIGINT / SIGTERM must save a checkpoint, exit 130 / 143 and say how to resume.

``benchmarks/crash_resume.py`` runs the same check as a longer soak with more kills.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml

from conftest import reversal_pairs, tiny_recipe, write_prepared

MAX_STEPS = 40
TRAIN = dict(max_steps=MAX_STEPS, max_tokens=200, save_every=1, validate_every=4, log_every=1, keep_last=2,
             ema_decay=0.9, warmup=10)
MODEL = dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1, dropout=0.1)
TIMING_FIELDS = ("tgt_tok_s", "train_seconds")  # the only metrics a crash may change
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one thread: fast and deterministic


def make_task(workdir: Path, prepared_from: Path | None = None, max_steps: int = MAX_STEPS) -> Path:
    """A prepared reversal task and its recipe; returns the recipe path."""
    if prepared_from is not None:
        shutil.copytree(prepared_from / "prepared", workdir / "prepared")
    else:
        write_prepared(workdir, reversal_pairs(200, 0, length=6), reversal_pairs(20, 1, length=6))
    recipe = tiny_recipe(workdir, model=MODEL, train={**TRAIN, "max_steps": max_steps})
    path = workdir / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def train_command(recipe: Path) -> list[str]:
    return [sys.executable, "-m", "nmtkit", "-q", "train", str(recipe)]


def train_to_end(recipe: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(train_command(recipe), capture_output=True, text=True, env=ENV, timeout=600)
    assert result.returncode == 0, result.stderr
    return result


def newest_step(run_dir: Path) -> int:
    steps = [int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step_*") if p.name[5:].isdigit()]
    return max(steps, default=0)


def start_and_wait(recipe: Path, run_dir: Path, min_step: int, timeout: float = 300) -> subprocess.Popen:
    """Start training and return once checkpoint ``min_step`` exists (or the process ended)."""
    proc = subprocess.Popen(train_command(recipe), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and newest_step(run_dir) < min_step:
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no checkpoint {min_step} within {timeout} s")
        time.sleep(0.002)
    return proc


def kill_phase(run_dir: Path) -> str:
    """What a SIGKILL interrupted, judged from what it left behind."""
    ckpts = run_dir / "checkpoints"
    names = [p.name for p in ckpts.iterdir()] if ckpts.is_dir() else []
    if any(name.startswith(".step_") and name.endswith(".deleting") for name in names):
        return "checkpoint prune"
    if any(name.startswith(".step_") for name in names):
        return "checkpoint write"
    if run_dir.is_dir() and any(p.name.startswith(".best.") for p in run_dir.iterdir()):
        return "best/ write"
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size and not metrics.read_bytes().endswith(b"\n"):
        return "metrics append"
    return "step, validation or start-up"


def assert_checkpoints_readable(run_dir: Path) -> int:
    """Every ``step_N`` (and ``best/``) loads; hidden leftovers are the only other entries."""
    from nmtkit.modeldir import load_model_dir
    from nmtkit.training.checkpoint import checkpoint_dirs, load_checkpoint

    dirs = checkpoint_dirs(run_dir)
    for path in dirs:
        assert load_checkpoint(path).trainer.step == int(path.name[5:])
    for path in (run_dir / "checkpoints").iterdir() if (run_dir / "checkpoints").is_dir() else []:
        assert path in dirs or path.name.startswith("."), path
    if (run_dir / "best").exists():
        load_model_dir(run_dir / "best")
    return len(dirs)


@dataclass
class CrashReport:
    kills: int = 0
    phases: dict = field(default_factory=dict)
    checkpoints_checked: int = 0
    processes: int = 0


def train_with_kills(recipe: Path, kills: int, seed: int, step_seconds: float,
                     max_steps: int = MAX_STEPS) -> CrashReport:
    """Train to the end, SIGKILLing the process ``kills`` times at seeded random moments:
    each kill waits for a chosen checkpoint, then a random delay of up to ~2 steps."""
    run_dir = recipe.parent / "train"
    rng = random.Random(seed)
    report = CrashReport()
    while report.kills < kills:
        done = newest_step(run_dir)
        startup = rng.random() < 0.15 and done < max_steps // 2  # now and then a kill while starting up or resuming
        target = done if startup else min(done + rng.randint(1, 3), max_steps - 3)
        proc = start_and_wait(recipe, run_dir, target)
        report.processes += 1
        time.sleep(rng.uniform(0, 4.0 if startup else 2 * step_seconds))
        if proc.poll() is not None:  # it finished first: the run is complete, start a new kill cycle
            assert proc.returncode == 0, proc.stderr.read()
            break
        proc.kill()
        proc.wait()
        proc.stderr.close()
        report.kills += 1
        phase = kill_phase(run_dir)
        report.phases[phase] = report.phases.get(phase, 0) + 1
        report.checkpoints_checked += assert_checkpoints_readable(run_dir)
    train_to_end(recipe)
    report.processes += 1
    return report


def final_state(run_dir: Path) -> dict:
    """Everything that must not depend on crashes: weights, EMA, optimizer, best/, metrics."""
    from nmtkit.modeldir import WEIGHTS, read_weights
    from nmtkit.training.checkpoint import latest_checkpoint

    ck = latest_checkpoint(run_dir)
    tensors = {f"weights.{k}": v for k, v in ck.weights.items()}
    tensors.update({f"ema.{k}": v for k, v in (ck.ema or {}).items()})
    for idx, state in ck.optimizer["state"].items():
        tensors.update({f"opt.{idx}.{k}": v for k, v in state.items() if isinstance(v, torch.Tensor)})
    tensors.update({f"best.{k}": v for k, v in read_weights(run_dir / "best" / WEIGHTS).items()})
    metrics = [{k: v for k, v in json.loads(line).items() if k not in TIMING_FIELDS}
               for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return {"step": ck.trainer.step, "tensors": tensors, "metrics": metrics}


def assert_same_final_state(a: dict, b: dict, max_steps: int = MAX_STEPS) -> None:
    assert a["step"] == b["step"] == max_steps
    assert a["tensors"].keys() == b["tensors"].keys()
    different = [k for k in a["tensors"] if not torch.equal(a["tensors"][k], b["tensors"][k])]
    assert not different, different[:5]
    assert a["metrics"] == b["metrics"]


def reference_run(workdir: Path, max_steps: int = MAX_STEPS) -> tuple[dict, float]:
    """One uninterrupted run: its final state and its seconds per step (for kill delays)."""
    recipe = make_task(workdir, max_steps=max_steps)
    train_to_end(recipe)
    records = [json.loads(line) for line in (workdir / "train" / "metrics.jsonl").read_text().splitlines()]
    seconds = [r["train_seconds"] for r in records if r["type"] == "train"][-1]
    return final_state(workdir / "train"), max(seconds / max_steps, 0.02)


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


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_saves_exits_and_resumes_exactly(reference, tmp_path, signum, code):
    ref_dir, ref_state, _ = reference
    recipe = make_task(tmp_path, prepared_from=ref_dir)
    run_dir = tmp_path / "train"
    proc = start_and_wait(recipe, run_dir, min_step=4)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
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


def test_a_run_finished_by_max_epochs_stays_finished_and_a_raised_limit_goes_on(tmp_path):
    """A run ended by train.max_epochs once looked unfinished: each re-run validated again,
    appended a duplicate record and rewrote its last checkpoint."""
    recipe = make_task(tmp_path, max_steps=100000)
    settings = yaml.safe_load(recipe.read_text())
    settings["train"].update(max_epochs=2, save_every=1000, validate_every=1000)
    recipe.write_text(yaml.safe_dump(settings))
    train_to_end(recipe)
    metrics = (tmp_path / "train" / "metrics.jsonl").read_text()
    first = newest_step(tmp_path / "train")
    saved = {p: p.stat().st_mtime_ns for p in (tmp_path / "train" / "checkpoints").rglob("*")}
    train_to_end(recipe)
    assert (tmp_path / "train" / "metrics.jsonl").read_text() == metrics  # no second validation record
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "train" / "checkpoints").rglob("*")} == saved
    settings["train"]["max_epochs"] = 3
    recipe.write_text(yaml.safe_dump(settings))
    train_to_end(recipe)
    assert newest_step(tmp_path / "train") == first + first // 2  # one more epoch of as many updates


def test_resume_on_a_changed_dev_set_starts_the_best_score_afresh(tmp_path):
    """Scores on another dev set do not compare: the best score and the early-stopping count
    earned on the old one once carried over silently."""
    from nmtkit.data.ids import save_split
    from nmtkit.data.vocab import Vocab

    recipe = make_task(tmp_path, max_steps=4)
    train_to_end(recipe)
    prepared = tmp_path / "prepared"
    vocab = Vocab(prepared / "spm.model")
    dev = reversal_pairs(20, 7, length=5)
    save_split(prepared / "dev.npz", vocab.encode_batch([s for s, _ in dev]), vocab.encode_batch([t for _, t in dev]))
    settings = yaml.safe_load(recipe.read_text())
    settings["train"]["max_steps"] = 8
    recipe.write_text(yaml.safe_dump(settings))
    resumed = train_to_end(recipe)
    assert "the dev set changed since step 4 scored the best" in " ".join(resumed.stderr.split())
    state = json.loads((tmp_path / "train" / "checkpoints" / "step_00000008" / "trainer.json").read_text())
    assert state["trainer"]["best_step"] == 8 and len(state["trainer"]["dev_sha256"]) == 64
