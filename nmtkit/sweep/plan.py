"""SWEEP_DIR/sweep.json, the sweep's plan: its runs in order with their settings, data and
config keys, parameter counts, and (seeds x splits) each run's variant, seed and split. Written
by the runner before any run, read by ``nmtkit plot SWEEP_DIR``.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Optional

from nmtkit.errors import ConfigError
from nmtkit.storage.files import atomic_write_text, read_json_dict, refuse_foreign
from nmtkit.sweep.record import RECORD
from nmtkit.sweep.spec import VARIANT_NAME, Sweep, variant_dir
from nmtkit.workdir import WorkDir


def write_plan(sweep: Sweep, counts: dict[str, dict]) -> None:
    """sweep.json: the variants in order (for `nmtkit plot SWEEP_DIR` and for people)."""
    plan = {"sweep": sweep.name, "sweep_file": str(sweep.path), "recipe": str(sweep.recipe),
            "overrides": list(sweep.shared_overrides),
            "variants": [{"name": v.name, "recipe": str(v.recipe), "overrides": list(v.overrides), "data_key": v.data_key,
                          "config_key": v.config_key, "parameters": counts[v.name],
                          **({"group": v.group, "seed": v.seed, "split": v.split} if v.group else {})}
                         for v in sweep.variants]}
    text = json.dumps(plan, indent=1, ensure_ascii=False) + "\n"
    path = sweep.workdir / "sweep.json"
    if not path.is_file() or path.read_bytes() != text.encode("utf-8"):  # damaged or stale: rewritten
        atomic_write_text(path, text)


def sweep_groups(directory: str | Path) -> list[tuple[str, list[Path], list[float]]] | None:
    """(variant, its runs' training directories, their test BLEU scores) of a replicated sweep
    directory, in sweep order, from sweep.json and each run's results; None when ``directory``
    is not a replicated sweep."""
    plan = read_json_dict(Path(directory) / "sweep.json") or {}
    entries = plan.get("variants") if isinstance(plan.get("variants"), list) else []
    if not entries or not all(isinstance(e, dict) and isinstance(e.get("group"), str) for e in entries):
        return None
    runs = dict(sweep_runs(directory))  # checks the names; only runs that trained
    groups: dict[str, tuple[list[Path], list[float]]] = {}
    for entry in entries:
        if entry["name"] in runs:
            paths, bleus = groups.setdefault(entry["group"], ([], []))
            paths.append(runs[entry["name"]])
            results = read_json_dict(WorkDir(variant_dir(Path(directory), entry["name"])).results / "results.json")
            bleu = ((((results or {}).get("splits") or {}).get("test") or {}).get("bleu") or {}).get("score")
            if isinstance(bleu, (int, float)):
                bleus.append(float(bleu))
    return [(name, paths, bleus) for name, (paths, bleus) in groups.items()]


def sweep_runs(directory: str | Path) -> list[tuple[str, Path]] | None:
    """(variant name, training run dir) of a sweep directory's variants that have started
    training, in sweep order; None when ``directory`` is not a sweep directory."""
    plan_path = Path(directory) / "sweep.json"
    if not plan_path.is_file():
        return None
    try:
        names = [v["name"] for v in (read_json_dict(plan_path) or {})["variants"]]
    except (KeyError, TypeError):
        names = None
    if not names or not all(isinstance(name, str) and VARIANT_NAME.fullmatch(name) for name in names):
        raise ConfigError(f"{plan_path}: not a sweep plan written by `nmtkit sweep`")
    runs = [(name, WorkDir(variant_dir(Path(directory), name)).run) for name in names]
    runs = [(name, run.path) for name, run in runs if run.metrics.is_file()]
    if not runs:
        raise ConfigError(f"{directory}: no variant of this sweep has trained yet")
    return runs


def _is_plan(record: Optional[dict]) -> bool:
    return record is not None and isinstance(record.get("sweep"), str) and isinstance(record.get("variants"), list)


def refuse_foreign_files(sweep: Sweep) -> None:
    """A one-line error, before anything is written, when the sweep's directory holds a file of
    the names the sweep writes that nmtkit did not write (``files.refuse_foreign``): the
    directory is the sweep's once its sweep.json is a plan; before that, a sweep.json,
    results.json, results.md or a variant's sweep-run.json there must read as one of ours."""
    workdir = sweep.workdir
    if _is_plan(read_json_dict(workdir / "sweep.json")):
        return
    recognised = {"sweep.json": _is_plan, "results.json": _is_plan,
                  "results.md": lambda path: _starts_with(path, b"# Sweep ")}
    for name, ours in recognised.items():
        path = workdir / name
        if os.path.lexists(path) and not ours(read_json_dict(path) if name.endswith(".json") else path):
            refuse_foreign(path, "the sweep's " + ("plan" if name == "sweep.json" else "results"), "sweep workdir")
    for variant in sweep.variants:
        path = sweep.variant_dir(variant.name) / RECORD
        record = read_json_dict(path)
        if os.path.lexists(path) and not (record and isinstance(record.get("config"), str)
                                          and isinstance(record.get("status"), str)):
            refuse_foreign(path, f"the record of variant {variant.name}", "sweep workdir")


def _starts_with(path: Path, start: bytes) -> bool:
    """Whether the regular file ``path`` starts with ``start`` (only that much is read)."""
    try:
        with open(path, "rb") if path.is_file() else contextlib.nullcontext(None) as handle:
            return handle is not None and handle.read(len(start)) == start
    except OSError:
        return False
