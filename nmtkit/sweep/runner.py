"""``nmtkit sweep``: every variant of a sweep file through ``nmtkit run``, one at a time.

    SWEEP_DIR/                        the sweep file's ``workdir`` (default data/sweeps/<stem>)
      sweep.json                      the variants in order, their settings and parameter counts
      prepared/<data key>/            one ``prepare`` per distinct data + vocab settings
      variants/<name>/                a work directory as ``nmtkit run`` fills it, whose
        prepared -> ../../prepared/<data key>   prepared/ is the shared one (a relative link)
        run.log                       the variant's own output, appended by every session
        sweep-run.json                status, config digest, peak RSS of its sessions
      results.json, results.md        every variant side by side (rewritten after each one)

Each variant runs as a child ``nmtkit run`` process, so its peak RSS is its own and a crash
stays inside it. Every step of ``nmtkit run`` is cached or resumable, so a killed sweep
started again skips finished variants and resumes the interrupted one from its last
checkpoint. The child is told to stop (SIGTERM: checkpoint, then exit) if the sweep dies.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from nmtkit.errors import ConfigError, NmtkitError
from nmtkit.storage.files import atomic_write_text, exclusive
from nmtkit.sweep.plan import refuse_foreign_files, write_plan
from nmtkit.sweep.record import RECORD, read_record, variant_status
from nmtkit.sweep.spec import Sweep, Variant, run_command
from nmtkit.workdir import WorkDir

STOPPED_CODES = (130, 143)  # the child was interrupted (SIGINT / SIGTERM) and saved a checkpoint

try:  # loaded here, not in the forked child: the child only calls prctl, it imports nothing
    import ctypes

    _LIBC = ctypes.CDLL(None, use_errno=True)
except (ImportError, OSError):
    _LIBC = None


class SweepFailed(NmtkitError):
    """Some variants failed; the others ran and are in the results."""


def run_sweep(sweep: Sweep, console, only: Optional[list[str]] = None, dry_run: bool = False,
              debug: bool = False) -> dict:
    """Run the selected variants (all unless ``only``), then write and print the results."""
    from nmtkit.sweep.results import print_results, write_results

    selected = sweep.select(only)
    for warning in sweep.warnings:
        console.warn(warning)
    if dry_run:
        list_variants(sweep, {v.name: _counts(v) for v in selected}, console, selected)
        return {}
    counts = {v.name: _counts(v) for v in sweep.variants}
    sweep.workdir.mkdir(parents=True, exist_ok=True)
    with exclusive(sweep.workdir, "another `nmtkit sweep`"):
        refuse_foreign_files(sweep)
        write_plan(sweep, counts)
        failed = []
        for number, variant in enumerate(selected, 1):
            console.rule(f"[bold]{number}/{len(selected)} {variant.name}")
            status, code = _run_variant(sweep, variant, console, debug)
            if status == "failed":
                failed.append(variant.name)
            results = write_results(sweep, counts)
            if status == "stopped":
                console.print(f"[yellow]sweep stopped during {variant.name}; run the same command to resume[/yellow]")
                raise SystemExit(code)
    print_results(console, results)
    if failed:
        raise SweepFailed(f"{len(failed)} of {len(selected)} variants failed ({', '.join(failed)}); "
                          f"see variants/<name>/run.log under {sweep.workdir}")
    return results


def _counts(variant: Variant) -> dict[str, int]:
    from nmtkit.models.build import parameter_counts

    cfg = variant.config
    return parameter_counts(cfg.model, cfg.vocab.size, cfg.vocab.size)  # SentencePiece fills vocab.size exactly


def _run_variant(sweep: Sweep, variant: Variant, console, debug: bool) -> tuple[str, int]:
    """Run one variant unless it finished with these settings; (its status, the child's exit code)."""
    directory = sweep.variant_dir(variant.name)
    if variant_status(sweep, variant) == "done":
        console.info(f"{variant.name}: finished earlier with these settings, skipped")
        return "done", 0
    old = begin_run(sweep, variant, console)
    arguments = run_command(sweep, variant)
    log = directory / "run.log"
    console.info(f"nmtkit {shlex.join(arguments)}")
    console.info(f"log: {log}")
    session_start = log.stat().st_size if log.is_file() else 0
    code, peak_kib = _run_child([sys.executable, "-m", "nmtkit", *(["--debug"] if debug else []), *arguments], log)
    status, record = finish_run(sweep, variant, old, code, peak_kib, session_start)
    if status == "failed":
        console.print(f"[red]{variant.name} failed[/red] (exit {code}): {record['error']}")
    elif status == "done":
        console.info(f"{variant.name}: done")
    return status, code


def begin_run(sweep: Sweep, variant: Variant, console) -> dict:
    """Before a variant's child starts: its prepared/ link, an old run trained with other
    settings set aside, and a record saying it started (a sweep killed outright leaves the
    settings its run belongs to). Returns the old record when it is of these settings."""
    directory = sweep.variant_dir(variant.name)
    link_prepared(sweep, variant, console)
    changed = _trained_otherwise(WorkDir(directory).run.path, variant.config,
                                 read_record(directory).get("status") == "done")
    if changed:
        _set_aside_old_run(directory, console, variant.name, changed)
    old = read_record(directory)
    if old.get("config") != variant.config_key:  # other settings: its sessions and memory start afresh
        old = {}
    started = {"config": variant.config_key, "status": "started", "sessions": old.get("sessions", 0),
               "peak_rss_mib": old.get("peak_rss_mib", 0)}
    atomic_write_text(directory / RECORD, json.dumps(started, indent=1) + "\n")
    return old


def finish_run(sweep: Sweep, variant: Variant, old: dict, code: int, peak_kib: int, session_start: int,
               stopped: bool = False) -> tuple[str, dict]:
    """After a variant's child ended with exit ``code``: its record (status, sessions, peak RSS,
    the error from the part of run.log this session wrote). ``stopped``: the caller stopped it
    (a killed run resumes like one that saved). Returns (status, record)."""
    directory = sweep.variant_dir(variant.name)
    status = "done" if code == 0 else "stopped" if stopped or code in STOPPED_CODES else "failed"
    record = {"config": variant.config_key, "status": status, "exit_code": code,
              "sessions": old.get("sessions", 0) + 1,
              "peak_rss_mib": round(max(peak_kib / 1024, old.get("peak_rss_mib", 0)), 1)}
    if status == "failed":
        record["error"] = _last_error(directory / "run.log", session_start)
    atomic_write_text(directory / RECORD, json.dumps(record, indent=1) + "\n")
    return status, record


# train settings that say how often, where or how fast: a run resumed with new values is the run the
# new settings describe
_RESUMABLE = {"threads", "log_every", "validate_every", "save_every", "keep_last", "tensorboard", "average_last",
              "device", "dtype", "compile"}
# how long, with what a run has spent of each (from its last checkpoint's trainer state): raised, or lowered
# to no less than the run has spent, the resumed run is the one they describe; lowered below that, the
# run trained past the new limit and its model is not that of the new settings (max_steps is a
# settings change whenever the schedule decays towards it)
_LIMITS = {"max_steps": lambda state: state.step, "max_epochs": lambda state: state.epoch + 1 if state.step else 0,
           "max_minutes": lambda state: state.train_seconds / 60, "max_flops": lambda state: state.train_flops}
# which checkpoint is best and when to stop early: an unfinished run goes on under the new values, a
# finished one chose its best checkpoint (and its stop) by the old ones (no dev BLEU was ever computed
# for best_metric=bleu)
_UNTIL_FINISHED = {"best_metric", "patience", "dev_bleu_beam", "dev_bleu_max_sentences"}


def _trained_otherwise(run_dir: Path, cfg, done_before: bool = False) -> list[str]:
    """The model, train or data settings the run in ``run_dir`` was trained with that differ from
    ``cfg``'s, apart from those a resumed run may change (decode settings only re-translate).
    ``done_before``: the variant's last session finished (so did its training)."""
    from nmtkit.errors import DataError
    from nmtkit.runlog import read_run_config, saved_section

    try:
        saved = read_run_config(run_dir)
    except DataError:
        return ["its saved config.yaml is damaged"]
    if saved is None:
        return []
    now = json.loads(json.dumps(cfg.to_dict()))
    decays = now["train"].get("schedule") in ("cosine", "linear")
    state = _last_state(run_dir)
    changed = []
    for section in ("model", "train", "data"):
        old = saved_section(saved, section, cfg)
        for key, value in now[section].items():
            if old.get(key) == value or (section == "train" and key in _RESUMABLE):
                continue
            if section == "train" and key in _LIMITS and not (key == "max_steps" and decays):
                spent = _LIMITS[key](state) if state is not None else None
                if spent is not None and (not value or spent <= value):  # 0: no limit (max_steps is never 0)
                    continue
                shown = value if isinstance(value, int) else f"{value:g}"  # max_steps=1000000, not 1e+06
                changed.append(f"train.{key}={shown}, which the run has passed" if spent is not None
                               else f"train.{key}")
            elif section == "train" and key in _UNTIL_FINISHED:
                metrics = (old.get("best_metric"), now["train"]["best_metric"])
                unread = key.startswith("dev_bleu_") and "bleu" not in metrics  # inert under best_metric=loss
                if not unread and (state is None or done_before or _finished(state, old)):
                    changed.append(f"train.{key}, after the run finished")
            else:
                changed.append(f"{section}.{key}")
    return changed


def _last_state(run_dir: Path):
    """The trainer state of the run's last readable checkpoint (the one a resume starts from; a
    fresh state when there is none: nothing is trained yet), or None when none can be read
    (then every limit or best-checkpoint setting that changed counts as a change)."""
    from nmtkit.errors import NmtkitError
    from nmtkit.training.checkpoint import TrainerState, checkpoint_dirs, read_trainer_state

    dirs = checkpoint_dirs(run_dir)
    if not dirs:
        return TrainerState()
    for path in reversed(dirs):
        with contextlib.suppress(NmtkitError):
            return read_trainer_state(path)
    return None


def _finished(state, train: dict) -> bool:
    """Whether a run at ``state`` had stopped under the train settings it was trained with, as
    the trainer decides (epochs: once it has used the last epoch's batches)."""
    def limit(key: str) -> float:
        value = train.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0

    epochs = limit("max_epochs")
    return bool(0 < limit("max_steps") <= state.step
                or 0 < limit("max_minutes") * 60 <= state.train_seconds
                or 0 < limit("max_flops") <= state.train_flops
                or 0 < limit("patience") <= state.bad_validations
                or (epochs and (state.epoch >= epochs or (state.epoch == epochs - 1 and
                                                          0 < state.epoch_batches <= state.batch_in_epoch))))


def _set_aside_old_run(directory: Path, console, name: str, changed: list[str]) -> None:
    """A variant whose settings changed trains from scratch: resuming its old run would train on
    with the new settings from the old weights (or find it finished and report the old model
    under the new settings). Its training run and results are moved aside, not deleted."""
    work = WorkDir(directory)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for path in (work.run.path, work.results):
        if not os.path.lexists(path):
            continue
        backup, n = path.with_name(f"{path.name}.old-{stamp}"), 1
        while os.path.lexists(backup):
            n += 1
            backup = path.with_name(f"{path.name}.old-{stamp}-{n}")
        os.replace(path, backup)
        console.warn(f"{name}: trained with other settings ({', '.join(changed[:3])}"
                     f"{', ...' if len(changed) > 3 else ''}); moved its old {path.name}/ to {backup}")


def link_prepared(sweep: Sweep, variant: Variant, console) -> None:
    """Point the variant's prepared/ at the shared one of its data key (relative link); a variant
    whose data or vocab settings changed since it ran gets the new one and trains afresh."""
    directory = sweep.variant_dir(variant.name)
    directory.mkdir(parents=True, exist_ok=True)
    link, target = WorkDir(directory).prepared, Path("..", "..", "prepared", variant.data_key)
    if link.is_symlink():
        current = Path(os.readlink(link))
        if current in (target, Path("..", "..", "prepared", variant.legacy_data_key)):
            return
        _set_aside_old_run(directory, console, variant.name, [f"data or vocab settings: prepared/ -> {current}"])
        link.unlink()  # our own link; the prepared directory it named stays
    elif link.exists():
        raise ConfigError(f"{link} exists and was not made by `nmtkit sweep`; move it away")
    (sweep.workdir / "prepared" / variant.data_key).mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)


def _run_child(arguments: list[str], log: Path) -> tuple[int, int]:
    """Run ``nmtkit ...`` with output appended to ``log``; (exit code, its peak RSS in KiB).
    SIGINT/SIGTERM sent to the sweep are passed on, so the child saves and stops."""
    with open(log, "a", encoding="utf-8") as handle:
        process = subprocess.Popen(arguments, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                                   preexec_fn=stop_with_parent if _LIBC is not None else None)
        def forward(signum, frame) -> None:  # the child decides: save and stop, or stop now on a repeat
            with contextlib.suppress(ProcessLookupError):  # os.kill, not send_signal: that polls,
                os.kill(process.pid, signum)               # and may reap the child before wait4 does

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            _, wait_status, usage = os.wait4(process.pid, 0)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    process.returncode = code = os.waitstatus_to_exitcode(wait_status)
    if code < 0:  # killed by a signal: report it as a shell would
        code = 128 - code
    return code, usage.ru_maxrss  # KiB on Linux


def stop_with_parent() -> None:
    """In the child before exec: SIGTERM when the sweep process dies (Linux prctl PR_SET_PDEATHSIG),
    so a killed sweep never leaves a training running that a resumed sweep would collide with."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)


def _last_error(log: Path, start: int = 0) -> str:
    """The child's one-line error (``nmtkit: error: ...``), else its last line, from the part of
    the log its session wrote (from byte ``start``: the log is appended to by every session)."""
    try:
        with open(log, "rb") as handle:
            handle.seek(start)
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return "no log"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("nmtkit: error:")]
    return (errors or lines or ["no output"])[-1]


def list_variants(sweep: Sweep, counts: dict[str, dict], console, selected: list) -> None:
    """The --dry-run listing of the ``selected`` variants: each one's shared prepare (numbered
    over the whole sweep), parameter counts, status and settings, one unwrapped line each
    (settings last, so long ones never break the columns)."""
    groups: dict[str, int] = {}
    for variant in sweep.variants:
        groups.setdefault(variant.data_key, len(groups) + 1)
    shared = " ".join(sweep.shared_overrides) or "none"
    counted = (f"{len(sweep.groups)} variants x {len(sweep.seeds) or 1} seed(s) x {sweep.splits} split(s) = "
               f"{len(sweep.variants)} runs" if sweep.replicated else f"{len(sweep.variants)} variants")
    console.print(f"sweep {sweep.name}: {counted} of {sweep.recipe} (shared overrides: {shared}), "
                  f"{len(groups)} prepare(s), work directory {sweep.workdir}", soft_wrap=True)
    width = max(len("variant"), *(len(v.name) for v in selected))
    console.print(f"  {'variant':<{width}}  prepare  {'parameters':>12}  {'active':>12}  status   settings",
                  soft_wrap=True)
    for variant in selected:
        count = counts[variant.name]
        console.print(f"  {variant.name:<{width}}  #{groups[variant.data_key]:<6}  {count['total']:>12,}  "
                      f"{count['active']:>12,}  {variant_status(sweep, variant):<7}  "
                      f"{' '.join(variant.settings(sweep.recipe)) or '(the recipe)'}", soft_wrap=True, markup=False)
