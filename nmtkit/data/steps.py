"""Steps that run only when what they depend on changed (the engine behind ``nmtkit prepare``).

A step's inputs are hashed into a key; its stamp, DIR/stamps/NAME.json, keeps the key, the
size and mtime of every output, the step's report and its wall time (``seconds``, for people
and benchmarks/scale.py; never compared). A step is skipped when the key matches
and no output was touched; otherwise its stamp (and DIR's checksums.json) is removed before
the step touches its outputs and written after they are complete, so an interrupted step is
redone. A stamp carries a sha256 of its content: a damaged one makes its step run again.
An output a later step has used up can be deleted with ``consume``: the stamp then records it
absent, so the step still counts as done (a caller that needs the output again forces the step).
The caller holds DIR's lock (``nmtkit.storage.files.exclusive``).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from nmtkit.storage.checksums import MANIFEST
from nmtkit.storage.files import atomic_write_text, read_json_dict


def run_step(out: Path, name: str, inputs: dict, work: Callable[[], tuple[dict, list[str]]],
             force: bool = False) -> tuple[dict, str]:
    """Run ``work`` unless (without ``force``) its stamp matches ``inputs`` and its outputs are
    untouched; returns (report, "done" or "up to date").

    ``work`` returns (report, output file names); the report is kept in the stamp so a
    skipped step still contributes to the manifest.
    """
    report = None if force else current_report(out, name, inputs)
    if report is not None:
        return report, "up to date"
    _stamp_path(out, name).unlink(missing_ok=True)  # outputs are about to change: no stamp until they are
    (out / MANIFEST).unlink(missing_ok=True)  # complete, and no checksums (rewritten at the end)
    (out / UNFINISHED).touch()  # until prepare ends: training refuses a directory of old and new files
    start = time.perf_counter()
    report, outputs = work()
    _write_stamp(out, name, {"key": _key(inputs), "inputs": inputs,
                             "outputs": {file: _file_state(out / file) for file in outputs}, "report": report,
                             "seconds": round(time.perf_counter() - start, 1)})
    return report, "done"


def current_report(out: Path, name: str, inputs: dict) -> dict | None:
    """The report of step ``name`` when its stamp matches ``inputs`` and its outputs are as it
    left them (None: the step has to run)."""
    stamp = _read_stamp(_stamp_path(out, name))
    if stamp and stamp["key"] == _key(inputs) and all(
            _file_state(out / file) == state for file, state in stamp["outputs"].items()):
        return stamp["report"]
    return None


def read_stamp(out: Path, name: str) -> dict | None:
    """Step ``name``'s stamp (key, inputs, outputs, report), or None when missing or damaged."""
    return _read_stamp(_stamp_path(out, name))


def consume(out: Path, name: str, files: list[str]) -> bool:
    """Delete ``files``, outputs of the finished step ``name`` left as it wrote them, and record
    them absent in its stamp; True if any was deleted. Files the step did not write, or that
    changed since, are left alone."""
    stamp = _read_stamp(_stamp_path(out, name))
    if stamp is None:
        return False
    present = [file for file in files if stamp["outputs"].get(file) is not None
               and _file_state(out / file) == stamp["outputs"][file]]
    if not present:
        return False
    for file in present:
        (out / file).unlink()
    _write_stamp(out, name, {**stamp, "outputs": {**stamp["outputs"], **dict.fromkeys(present)}})
    return True


def _stamp_path(out: Path, name: str) -> Path:
    return out / "stamps" / f"{name}.json"


def _key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def _write_stamp(out: Path, name: str, stamp: dict) -> None:
    stamp = {key: value for key, value in stamp.items() if key != "sha256"}
    stamp["sha256"] = _stamp_digest(stamp)
    atomic_write_text(_stamp_path(out, name), json.dumps(stamp, indent=1, ensure_ascii=False) + "\n")


def _stamp_digest(stamp: dict) -> str:
    """A checksum of a stamp's content: its report goes into the manifest when the step is
    skipped, so a flipped digit there must not pass as the data's counts."""
    content = {key: value for key, value in stamp.items() if key != "sha256"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _read_stamp(path: Path) -> dict | None:
    """The stamp of a finished step, or None when it is missing or damaged (the step runs again).
    Stamps from before the checksum have none and are taken as they are (not redone on upgrade)."""
    stamp = read_json_dict(path)
    if stamp is None or ("sha256" in stamp and stamp["sha256"] != _stamp_digest(stamp)):
        return None
    if not isinstance(stamp.get("key"), str) or not isinstance(stamp.get("outputs"), dict) or "report" not in stamp:
        return None
    return stamp


def _file_state(path: Path) -> list[int] | None:
    """Size and modification time: any rewrite of an output changes them."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return [stat.st_size, stat.st_mtime_ns]


UNFINISHED = ".unfinished"  # in prepared/ while a step's outputs and the others' may not match


def remove_leftovers(out: Path) -> None:
    """Temp files of a killed run (atomic writes, SentencePiece scratch dirs); we hold the lock."""
    for path in itertools.chain(out.glob(".*.tmp"), (out / "stamps").glob(".*.tmp")):
        path.unlink(missing_ok=True)
    for path in out.glob("tmp*"):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)

