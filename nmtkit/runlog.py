"""A training run's metrics log, RUN_DIR/metrics.jsonl: one JSON record per line, ``train``
lines (step, loss, lr, train_seconds, ...) and ``valid`` lines (step, dev scores). Read here
for everything that shows a run (curves, the model card).
"""
from __future__ import annotations

import json
from pathlib import Path

from nmtkit.errors import DataError
from nmtkit.workdir import RunDir, WorkDir


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
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise DataError(f"{path}:{number}: not a JSON record") from None
    return records
