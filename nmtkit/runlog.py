"""A training run's metrics log, RUN_DIR/metrics.jsonl: one JSON record per line, ``train``
lines (step, loss, lr, train_seconds, ...) and ``valid`` lines (step, dev scores). Written by
the trainer (``MetricsLog``) and read by everything that shows a run (curves, the model card,
the sweep table), with one rule for a damaged line (``parse_record``); and RUN_DIR/config.yaml,
the recipe a run was trained with, which resume compares and the model card shows. Also the
checks of the counts and numbers a run records (``is_count``, ``is_finite_number``), shared by
the checkpoint loader and the model card.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from nmtkit.errors import ConfigError, DataError, NmtkitError
from nmtkit.recipe_text import MAX_RECIPE_BYTES, safe_yaml
from nmtkit.storage.files import atomic_write_text, read_regular
from nmtkit.workdir import RunDir, WorkDir

RESTART = "`nmtkit train RECIPE --restart`"  # what every refusal to resume suggests: `run` has no --restart


def parse_record(line: str) -> Optional[dict]:
    """A metrics record, or None for a blank line, one that a kill cut short, or one that
    cannot be a record (every record has a ``type`` and a non-negative integer ``step``, and
    its ``train_seconds``, when there, is a number)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("type"), str):
        return None
    step, seconds = record.get("step"), record.get("train_seconds", 0.0)
    if not _is_number(step) or not isinstance(step, int) or step < 0 or not _is_number(seconds):
        return None
    return record


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_count(value) -> bool:
    """A non-negative integer (not a bool), as a run records steps and counts."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_finite_number(value) -> bool:
    """A finite int or float (not a bool): what a run records as a score or a sum (JSON lets NaN in)."""
    return _is_number(value) and math.isfinite(value)


def read_run_config(run_dir: str | Path) -> Optional[dict]:
    """RUN_DIR/config.yaml, the recipe a run was trained with, as a plain mapping (what resume
    compares and the model card shows): None when there is none, DataError when damaged."""
    import yaml

    path = RunDir(Path(run_dir)).config
    if not path.is_file():
        return None
    try:  # read as a recipe is (no anchors or aliases): the one way a saved config is read
        saved = safe_yaml(read_regular(path, MAX_RECIPE_BYTES, DataError, "run config").decode("utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError, ConfigError):
        saved = None
    if not isinstance(saved, dict) or not all(isinstance(saved.get(s, {}), dict) for s in ("model", "train", "vocab")):
        raise DataError(f"{path} is damaged")
    return saved


def saved_section(saved: dict, section: str, cfg) -> dict:
    """One section of a saved run config, for comparing with ``cfg``'s: a key the saved recipe
    lacks was added to nmtkit since, and that run used the value nmtkit had then (its default,
    or its old value where the default changed: ``LEGACY_VALUES``)."""
    return {**json.loads(json.dumps(type(cfg).legacy_tree()[section])), **(saved.get(section) or {})}


def check_resume_settings(cfg, run_dir: Path, console) -> None:
    """Refuse to resume with a different model; say which training settings changed."""
    try:
        saved = read_run_config(run_dir)
    except DataError as err:
        console.warn(f"{err}: settings are not compared with the previous session's")
        return
    if saved is None:
        return
    now = cfg.to_dict()
    old_model = saved_section(saved, "model", cfg)
    if old_model != json.loads(json.dumps(now["model"])):
        changed = sorted(k for k in now["model"] if old_model.get(k) != now["model"][k])
        raise ConfigError(f"model settings differ from the checkpoints in {run_dir} ({', '.join(changed)}); "
                          f"use --restart to train a new model ({RESTART})")
    for section in ("train", "vocab", "data"):  # data: what resume may change is corpus weights
        old, new = saved_section(saved, section, cfg), json.loads(json.dumps(now[section]))
        for key in sorted(new):
            if section == "train" and key == "init_from" and new[key]:
                continue  # a new run's start: training/startup.py refuses it when it is not this run's
            if old.get(key) != new[key]:
                console.warn(f"resuming with {section}.{key} = {new[key]!r} (was {old.get(key)!r})")


def metrics_path(run_dir: str | Path) -> Path:
    """RUN_DIR/metrics.jsonl; a work directory (WORKDIR/train/metrics.jsonl) works too."""
    run_dir = Path(run_dir)
    for candidate in (RunDir(run_dir).metrics, WorkDir(run_dir).run.metrics):
        if candidate.is_file():
            return candidate
    raise DataError(f"{run_dir}: no metrics.jsonl (give a training run directory, e.g. WORKDIR/train)")


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of a run, in order. A cut-off last line (a run still writing) is skipped."""
    path = metrics_path(run_dir)
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start}): not a metrics log") from None
    records = []
    for number, line in enumerate(lines, 1):
        record = parse_record(line)
        if record is not None:
            records.append(record)
        elif number < len(lines):
            raise DataError(f"{path}:{number}: not a metrics record (a JSON object with a type and a step)")
    return records


def summary_writer_class():
    """TensorBoard's SummaryWriter, or a one-line error saying how to install it; training
    calls it before building the model, so a missing package is found at the start."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise NmtkitError("train.tensorboard=true needs the tensorboard package: "
                          "pip install 'nmtkit[tensorboard]' (or tensorboard)") from None
    return SummaryWriter


class MetricsLog:
    """The trainer's side of RUN_DIR/metrics.jsonl (the source of truth), mirrored with
    ``tensorboard`` as TensorBoard scalars ``{type}/{field}`` in RUN_DIR/tensorboard."""

    def __init__(self, run_dir: Path, tensorboard: bool) -> None:
        self.run = RunDir(Path(run_dir))
        self.path, self.tensorboard = self.run.metrics, tensorboard
        self._writer = None

    def start_over(self) -> None:
        self.path.unlink(missing_ok=True)

    def truncate_after(self, step: int) -> None:
        """Drop records written after the checkpoint a run resumes from (and a line torn by a kill)."""
        if not self.path.is_file():
            return
        keep = [line for line in self.path.read_text(encoding="utf-8", errors="replace").split("\n")
                if (record := parse_record(line)) is not None and record.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(line + "\n" for line in keep))

    def append(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.tensorboard:
            writer = self._writer or self._open_tensorboard(record["step"])
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    writer.add_scalar(f"{record['type']}/{key}", value, record["step"])
            writer.flush()

    def _open_tensorboard(self, first_step: int):
        SummaryWriter = summary_writer_class()
        # purge_step hides events a previous session wrote after the checkpoint we resumed from
        self._writer = SummaryWriter(log_dir=str(self.run.path / "tensorboard"), purge_step=first_step)
        return self._writer
