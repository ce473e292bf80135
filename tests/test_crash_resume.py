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
import subprocess
import sys
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
    from nmtkit.storage.files import _HOST, sibling_name

    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # the killed trainer: its pid names its leftovers
    gone.wait()

    def left(path: Path, kind: str = "") -> Path:
        return path.with_name(f"{sibling_name(path, kind + _HOST)}-{gone.pid}-0a1b2c3d4e5f" + ("" if kind else ".tmp"))

    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"type": "train", "step": 13, "lo')
    half = left(run_dir / "checkpoints" / "step_00000013")
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"half")
    left(run_dir / "metrics.jsonl").write_text("partial")
    shutil.copytree(run_dir / "checkpoints" / "step_00000012", left(run_dir / "checkpoints" / "step_00000009"))
    os.replace(run_dir / "best", left(run_dir / "best", "old-"))
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


# --- resume rules that need no kill: each session in this process ----------------------------

def session(recipe: Path, **train) -> tuple[str, int]:
    """One ``train`` session of ``recipe`` with ``train`` overrides, in this process: (what its
    console printed, the exit code: 0, or that of the one-line error it stopped with)."""
    from nmtkit.config import from_dict
    from nmtkit.errors import NmtkitError
    from nmtkit.training.trainer import train as run_train
    from support.text_io import recording_console

    settings = yaml.safe_load(recipe.read_text())
    settings["train"].update(train)
    console, text = recording_console()
    try:
        run_train(from_dict(settings), console)
    except NmtkitError as err:
        return f"{text.getvalue()}error: {err}\n", err.exit_code
    return text.getvalue(), 0


def records(run_dir: Path, timing: tuple[str, ...] = ()) -> list[dict]:
    """The run's metrics records without the fields a crash may change, but for those in ``timing``."""
    from support.resume import TIMING_FIELDS

    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_FIELDS or k in timing}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def saved_step(model_dir: Path) -> int:
    return json.loads((model_dir / "config.json").read_text())["step"]


@pytest.mark.parametrize("model", [{}, {"moe_experts": 2, "moe_top_k": 1, "moe_z_weight": 0.001}], ids=["dense", "moe"])
def test_the_first_record_after_a_resume_averages_what_an_uninterrupted_runs_does(tmp_path, monkeypatch, model):
    """log_every 10 with save_every 5: a run resumed from step 15 logs step 20 over updates
    11-20 (loss, nll, ppl, router statistics), as the uninterrupted run did, not over 16-20.
    A newest checkpoint removed (as a kill just before it was written leaves things) makes
    step 15 the one resumed from; the best/ of step 20 goes with it, and comes back. Every update
    takes one second of a fake clock, so the throughput is exact too: over the window's ten
    updates, not over the five of this session (which showed twice the uninterrupted run's)."""
    import time
    from types import SimpleNamespace

    from nmtkit.modeldir import WEIGHTS, read_weights
    from nmtkit.training import trainer

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    clock = [0.0]
    monkeypatch.setattr(trainer, "time", SimpleNamespace(perf_counter=lambda: clock[0], strftime=time.strftime))
    real_step = trainer.Trainer._step

    def one_second(self, *args):
        clock[0] += 1.0
        return real_step(self, *args)

    monkeypatch.setattr(trainer.Trainer, "_step", one_second)
    recipe = make_task(tmp_path, max_steps=20)
    settings = yaml.safe_load(recipe.read_text())
    settings["model"].update(model)
    settings["train"].update(save_every=5, log_every=10, validate_every=10, keep_last=3, ema_decay=0.0)
    recipe.write_text(yaml.safe_dump(settings))
    run_dir = tmp_path / "train"
    assert session(recipe)[1] == 0
    timing = ("tgt_tok_s", "train_seconds")
    uninterrupted, best = records(run_dir, timing), read_weights(run_dir / "best" / WEIGHTS)
    assert [r["step"] for r in uninterrupted if r["type"] == "train"] == [10, 20]
    assert [r["train_seconds"] for r in uninterrupted if r["type"] == "train"] == [10.0, 20.0]
    assert ("moe_load" in uninterrupted[-2]) == bool(model)
    shutil.rmtree(run_dir / "checkpoints" / "step_00000020")
    printed, code = session(recipe)
    assert code == 0 and "resumed from step_00000015" in printed
    assert f"removed {run_dir / 'best'} (step 20): it is past the checkpoint the run resumes from (step 15)" in printed
    assert records(run_dir, timing) == uninterrupted
    again = read_weights(run_dir / "best" / WEIGHTS)
    assert again.keys() == best.keys() and all(torch.equal(again[k], best[k]) for k in best)


def test_a_window_saved_by_several_processes_is_merged_as_one_process_would_have_summed_it():
    """Each process sums its own micro-batches' losses and router statistics, but counts every
    process's tokens and the updates (Trainer._step): summing those too halved the first loss
    per token logged after a resume from 2 processes to 1."""
    from nmtkit.training.trainer import _merged_windows

    router = {"layers": ["encoder.1"], "sums": [[0.5, 0.0, 1.0, 3.0, 10.0, 20.0]]}
    windows = [{"loss": 6.0, "nll": 5.0, "tokens": 300, "steps": 3, "seconds": 1.5, "router": router},
               {"loss": 4.0, "nll": 3.0, "tokens": 300, "steps": 3, "seconds": 1.75,
                "router": {**router, "sums": [[0.25, 0.0, 2.0, 3.0, 5.0, 25.0]]}}]
    assert _merged_windows(windows) == {"loss": 10.0, "nll": 8.0, "tokens": 300, "steps": 3, "seconds": 1.75,
                                        "router": {"layers": ["encoder.1"],
                                                   "sums": [[0.75, 0.0, 3.0, 6.0, 15.0, 45.0]]}}
    older = [{k: w[k] for k in ("loss", "nll", "tokens", "steps")} for w in windows]  # kept no seconds
    assert _merged_windows(older) == {"loss": 10.0, "nll": 8.0, "tokens": 300, "steps": 3, "seconds": 0.0}


def test_best_is_staged_until_the_checkpoint_of_its_step_is_saved(tmp_path, monkeypatch):
    """A validation at step 15 and a kill before the checkpoint of step 20: best/ is still the
    best of the checkpoint the run resumes from (step 10), and the staged step-15 model goes
    when the run resumes from step 10 with other settings, so best/ never tells of an update
    the finished run never made."""
    from nmtkit.training import trainer

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    recipe = make_task(tmp_path, max_steps=20)
    settings = yaml.safe_load(recipe.read_text())
    settings["train"].update(save_every=10, validate_every=5, log_every=5, keep_last=3)
    recipe.write_text(yaml.safe_dump(settings))
    run_dir = tmp_path / "train"
    real_step = trainer.Trainer._step

    def killed_at_16(self, *args):
        if self.state.step == 16:
            raise KeyboardInterrupt  # no checkpoint saved, as after kill -9
        return real_step(self, *args)

    monkeypatch.setattr(trainer.Trainer, "_step", killed_at_16)
    with pytest.raises(KeyboardInterrupt):
        session(recipe)
    monkeypatch.undo()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    state = json.loads((run_dir / "checkpoints" / "step_00000010" / "trainer.json").read_text())["trainer"]
    assert newest_step(run_dir) == 10 and state["best_step"] == 10
    assert saved_step(run_dir / "best") == 10
    assert saved_step(run_dir / ".best.nmtkit-staged") == 15  # validated, not yet checkpointed
    printed, code = session(recipe, max_steps=12)
    assert code == 0, printed
    assert not (run_dir / ".best.nmtkit-staged").exists()
    # the session's last validation (step 12) scored better than step 10: best/ is its model, once saved
    assert [(r["step"], r["best"]) for r in records(run_dir) if r["type"] == "valid"] == [(5, True), (10, True),
                                                                                         (12, True)]
    assert saved_step(run_dir / "best") == 12 == newest_step(run_dir)


def test_a_best_that_cannot_be_written_is_a_one_line_error(tmp_path, monkeypatch):
    """best/ goes in place after the checkpoint is saved, outside the save's own error handling:
    a read-only or full run directory is said in one line there too, not as a traceback."""
    import errno

    from nmtkit.training import trainer

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    best = tmp_path / "train" / "best"

    def read_only(staged, out):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(out))

    monkeypatch.setattr(trainer, "replace_directory", read_only)
    printed, code = session(make_task(tmp_path, max_steps=2), save_every=2, validate_every=2)
    assert code == 1 and printed.splitlines()[-1] == f"error: cannot write {best}: Read-only file system"
    assert newest_step(tmp_path / "train") == 2 and (tmp_path / "train" / ".best.nmtkit-staged").is_dir()


def test_a_no_op_session_leaves_the_run_config_alone(tmp_path, monkeypatch):
    """A finished run trains nothing more: the settings it was given were never used, so
    RUN_DIR/config.yaml (which `info` shows and resume compares) keeps those it trained with."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    recipe = make_task(tmp_path, max_steps=4)
    assert session(recipe)[1] == 0
    config = (tmp_path / "train" / "config.yaml").read_bytes()
    metrics = (tmp_path / "train" / "metrics.jsonl").read_bytes()
    printed, code = session(recipe, lr=50)
    assert code == 0 and "training already finished at step 4" in printed
    assert (tmp_path / "train" / "config.yaml").read_bytes() == config
    assert (tmp_path / "train" / "metrics.jsonl").read_bytes() == metrics


def test_init_from_is_refused_on_a_run_that_resumes(tmp_path, monkeypatch):
    """train.init_from picks a new run's first weights: added to (or changed on) a run that
    resumes from its own checkpoints it would be accepted and ignored. The same init_from
    again, or none, resumes; with or without RUN_DIR/config.yaml."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    recipe = make_task(tmp_path, max_steps=2)
    assert session(recipe)[1] == 0
    model = tmp_path / "train" / "checkpoints" / "step_00000002"
    for config in (True, False):
        if not config:
            (tmp_path / "train" / "config.yaml").unlink()
        printed, code = session(recipe, max_steps=4, init_from=str(model))
        assert code == 2 and printed.splitlines()[-1] == (
            f"error: train.init_from={model}: init_from applies only to a new run; this one resumes from its own "
            f"checkpoints in {tmp_path / 'train'} (started from scratch); use --restart to start a new run from it "
            f"(`nmtkit train RECIPE --restart`)"), printed
        assert newest_step(tmp_path / "train") == 2
    fine = tmp_path / "fine"
    fine.mkdir()
    tuned = make_task(fine, prepared_from=tmp_path, max_steps=2)
    assert session(tuned, init_from=str(model))[1] == 0  # a new run from those weights
    for config in (True, False):
        if not config:
            (fine / "train" / "config.yaml").unlink()
        printed, code = session(tuned, init_from=str(model), max_steps=4 if config else 6)
        assert code == 0 and "resumed from" in printed, printed


def test_a_model_that_differs_from_the_checkpoints_is_refused_without_the_run_config(tmp_path, monkeypatch):
    """RUN_DIR/config.yaml gone, the checkpoint's own config.json says which model it holds:
    model.ffn gelu on a relu model keeps every shape, and was trained on as if it were one."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    recipe = make_task(tmp_path, max_steps=2)
    assert session(recipe)[1] == 0
    (tmp_path / "train" / "config.yaml").unlink()
    settings = yaml.safe_load(recipe.read_text())
    settings["model"]["ffn"] = "gelu"
    recipe.write_text(yaml.safe_dump(settings))
    printed, code = session(recipe, max_steps=4)
    assert code == 2 and printed.splitlines()[-1] == (
        f"error: the recipe's model differs from the one {tmp_path / 'train' / 'checkpoints' / 'step_00000002'} "
        f"holds (model.ffn ('relu' there, 'gelu' here)); use --restart to train a new model "
        f"(`nmtkit train RECIPE --restart`)"), printed
    assert newest_step(tmp_path / "train") == 2


def test_auto_threads_stay_those_the_run_started_with(tmp_path, monkeypatch):
    """The weights depend on the thread count: with train.threads 0 a resumed run goes on with
    the count its first session chose for the load then, saying so when the load now would
    choose another; an explicit other count is used, with a warning that the run is no longer
    exact."""
    from nmtkit.runtime import threads
    from nmtkit.training import trainer

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    load = {"busy": 0.0}
    monkeypatch.setattr(threads, "busy_cores_of_others", lambda cpus: load["busy"])
    monkeypatch.setattr(threads, "_pool", threads._Pool())
    used = []
    real_step = trainer.Trainer._step
    monkeypatch.setattr(trainer.Trainer, "_step", lambda self, *a: used.append(torch.get_num_threads()) or
                        real_step(self, *a))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        recipe = make_task(tmp_path, max_steps=2)
        assert session(recipe)[1] == 0
        load["busy"] = 1.0  # another process keeps one of the two cores busy now
        printed, code = session(recipe, max_steps=4)
        assert code == 0 and ("other processes keep 1.0 of 2 cores busy: this run goes on with the 2 thread(s) it "
                              "started with, so that it resumes exactly") in printed, printed
        assert threads_of(tmp_path / "train", 4) == 2
        printed, code = session(recipe, max_steps=6, threads=1)
        assert code == 0 and ("train.threads=1: training with 1 thread(s) where this run trained with 2; the weights "
                              "depend on the count, so the run no longer resumes exactly") in " ".join(printed.split())
    finally:
        torch.set_num_threads(before)
    assert used == [2, 2, 2, 2, 1, 1]
    assert threads_of(tmp_path / "train", 6) == 1  # the count used from now on


def threads_of(run_dir: Path, step: int) -> int:
    return json.loads((run_dir / "checkpoints" / f"step_{step:08d}" / "trainer.json").read_text())["trainer"]["threads"]
