"""One manifest of checksums per directory nmtkit writes: model directories, checkpoints,
prepared data and CTranslate2 exports.

    DIR/checksums.json   {"format": 1, "files": {name: {"size": bytes, "sha256": hex}}}

It is written last, after every file it lists is complete, and each reader verifies the
files it is about to read against it, so a truncated, flipped or swapped file is a one-line
error naming it before anything parses it. Directories written before manifests existed
have none: their readers fall back to the checks they always made (``verify`` says so by
returning False).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional

from nmtkit.errors import NmtkitError
from nmtkit.storage.files import atomic_write_text, read_regular, sha256_file

MANIFEST = "checksums.json"
FORMAT = 1
MAX_MANIFEST_BYTES = 1 << 20  # a manifest lists a few dozen files; anything larger is not one


def file_entry(path: Path) -> dict:
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def write_manifest(directory: Path, names: Iterable[str]) -> None:
    """Record size and sha256 of ``names`` (files in ``directory``) in its manifest."""
    directory = Path(directory)
    files = {name: file_entry(directory / name) for name in sorted(set(names))}
    atomic_write_text(directory / MANIFEST, json.dumps({"format": FORMAT, "files": files}, indent=1) + "\n")


def read_manifest(directory: Path, error: type[NmtkitError]) -> Optional[dict[str, dict]]:
    """The listed files of ``directory``'s manifest; None when it has none; ``error`` when it is damaged."""
    path = Path(directory) / MANIFEST
    if not os.path.lexists(path):
        return None
    try:
        manifest = json.loads(read_regular(path, MAX_MANIFEST_BYTES, error, "checksum manifest").decode("utf-8"))
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not isinstance(files, dict) or not all(
                isinstance(name, str) and "/" not in name and isinstance(entry, dict)
                and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
                for name, entry in files.items()):
            raise ValueError("unexpected content")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        raise error(f"{path}: damaged checksum manifest ({err})") from None
    return files


def verify(directory: Path, names: Iterable[str], error: type[NmtkitError],
           manifest: Optional[dict[str, dict]] = None, hint: str = "") -> bool:
    """Check ``names`` against ``directory``'s manifest (``error`` naming the first bad file,
    followed by ``hint``). False when the directory has no manifest, so the caller applies
    its older checks."""
    directory = Path(directory)
    files = manifest if manifest is not None else read_manifest(directory, error)
    if files is None:
        return False
    for name in names:
        path = directory / name
        if name not in files:
            raise error(f"{path}: not listed in {directory / MANIFEST} (a file from elsewhere?){hint}")
        if not path.is_file():
            raise error(f"{path}: missing or not a file ({directory / MANIFEST} lists it){hint}")
        expected = files[name]
        if path.stat().st_size != expected["size"] or sha256_file(path) != expected["sha256"]:
            raise error(f"{path}: checksum mismatch (truncated or corrupt file){hint}")
    return True
