"""Training killed with SIGKILL at seeded random moments through the real command line and
resumed, and the final state (weights, optimizer moments, EMA, ``best/``, metrics) compared
with an uninterrupted run's, bit for bit. Used by the crash-resume tests and benchmark."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from conftest import reversal_pairs, tiny_recipe, write_prepared


MAX_STEPS = 40


TRAIN = dict(max_steps=MAX_STEPS, max_tokens=200, save_every=1, validate_every=4, log_every=1, keep_last=2,
             ema_decay=0.9, warmup=10)


MODEL = dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1, dropout=0.1)


TIMING_FIELDS = ("tgt_tok_s", "train_seconds", "rss_mib")  # the only metrics a crash may change (time, memory)


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
    hidden = [int(n) for name in names if name.startswith(".step_") and (n := name[6:].split(".")[0]).isdigit()]
    if any(step <= newest_step(run_dir) for step in hidden):  # an old checkpoint, renamed to be deleted
        return "checkpoint prune"
    if hidden:
        return "checkpoint write"
    if run_dir.is_dir() and any(p.name.startswith((".best.", "..best.")) and p.name != ".best.nmtkit-staged"
                                for p in run_dir.iterdir()):  # a validation's best/ being written or promoted
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
