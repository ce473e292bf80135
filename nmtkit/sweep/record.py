"""A variant's record, VARIANT_DIR/sweep-run.json: what its last session left (status, config
digest, peak RSS). Read by the runner (what to skip) and the results table, written by the runner.
"""
from __future__ import annotations

from pathlib import Path

from nmtkit.files import read_json_dict
from nmtkit.sweep.spec import Sweep, Variant
from nmtkit.workdir import WorkDir

RECORD = "sweep-run.json"


def read_record(variant_dir: Path) -> dict:
    return read_json_dict(variant_dir / RECORD) or {}


def variant_status(sweep: Sweep, variant: Variant) -> str:
    """done / failed / stopped as the last session left it, or pending (never run, or run with
    other settings than the sweep file's now)."""
    record = read_record(sweep.variant_dir(variant.name))
    if record.get("config") != variant.config_key:
        return "pending"
    results = WorkDir(sweep.variant_dir(variant.name)).results / "results.json"
    if record.get("status") == "done" and not results.is_file():
        return "pending"
    return record.get("status", "pending")
