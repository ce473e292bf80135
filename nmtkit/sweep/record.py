"""A variant's record, VARIANT_DIR/sweep-run.json: what its last session left (status, config
digest, peak RSS). Read by the runner (what to skip) and the results table, written by the runner.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from nmtkit.storage.files import read_json_dict, sha256_file
from nmtkit.sweep.spec import Sweep, Variant
from nmtkit.workdir import WorkDir

RECORD = "sweep-run.json"


FIELDS = {"config": str, "status": str, "exit_code": int, "sessions": int, "peak_rss_mib": (int, float),
          "error": str}
SPLIT_FIELDS = {"sentences": int, "translate_seconds": (int, float)}


def _typed(value, kind) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def read_record(variant_dir: Path) -> dict:
    """The variant's record; a field of the wrong type is left out (a damaged record, or a
    damaged status, reads as pending and the variant runs again)."""
    record = read_json_dict(variant_dir / RECORD) or {}
    return {key: value for key, value in record.items() if key in FIELDS and _typed(value, FIELDS[key])}


def read_results(variant_dir: Path) -> Optional[dict]:
    """VARIANT_DIR/results/results.json as ``nmtkit run`` wrote it, or None when it is missing
    or damaged (then the variant is pending: running it again rewrites the file)."""
    results = read_json_dict(WorkDir(variant_dir).results / "results.json")
    splits = results.get("splits") if results is not None else None
    if not isinstance(splits, dict):
        return None
    for split in ("dev", "test"):
        row = splits.get(split)
        if not isinstance(row, dict) or not all(_typed(row.get(k), kind) for k, kind in SPLIT_FIELDS.items()):
            return None
        for metric in ("bleu", *(name for name in ("chrf", "chrf++", "ter", "comet") if name in row)):
            scored = row.get(metric)  # BLEU always; the others as the recipe's eval.metrics named them
            if not isinstance(scored, dict) or not _typed(scored.get("score"), (int, float)) or \
                    not isinstance(scored.get("signature"), str):
                return None
    if not _typed(results.get("train_minutes", 0), (int, float)):
        return None
    return results


def variant_status(sweep: Sweep, variant: Variant) -> str:
    """done / failed / stopped / started (a session that never reported: killed outright) as the
    last session left it, or pending (never run, run with other settings than the sweep file's
    now, or done but its results.json or test.hyp, which the table reads, missing or damaged
    since: running it again makes them again, without training)."""
    directory = sweep.variant_dir(variant.name)
    record = read_record(directory)
    if record.get("config") != variant.config_key:
        return "pending"
    if record.get("status") == "done" and (read_results(directory) is None or
                                           not translation_intact(WorkDir(directory).results / "test.hyp",
                                                                  _sha256)):
        return "pending"
    return record.get("status", "pending")


def translation_intact(hyp_path: Path, digest=sha256_file) -> bool:
    """Whether ``hyp_path`` (results/test.hyp) holds the bytes that the stamp ``nmtkit run``
    wrote beside it (SPLIT.hyp.stamp, pipeline.translate_split) recorded: missing, cut short or
    edited since, it is not that run's translation."""
    stamp = read_json_dict(hyp_path.with_name(hyp_path.name + ".stamp")) or {}
    return isinstance(stamp.get("sha256"), str) and hyp_path.is_file() and digest(hyp_path) == stamp["sha256"]


_DIGESTS: dict[tuple, str] = {}


def _sha256(path: Path) -> str:
    """sha256_file, kept per (file, size, mtime): the table asks every variant's status after
    each run, and a finished variant's test.hyp seldom changes."""
    info = path.stat()
    key = (str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    if key not in _DIGESTS:
        if len(_DIGESTS) > 100_000:
            _DIGESTS.clear()
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]
