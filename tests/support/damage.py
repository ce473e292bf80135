"""Files damaged the way disks, copies and people do (cut short, bytes flipped, another file
type, a malicious pickle), and work directories to damage."""
from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path


class Payload:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def malicious_pickle(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker))


def mutate(path: Path, how: str, marker: Path) -> None:
    """Damage ``path`` the way disks, copies and people do."""
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif how == "flipped":  # a few bytes in the middle, as a bad sector or a bit rot would
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 3]) + data[middle + 3:])
    elif how == "another file type":  # binary where text is expected and the other way round
        other = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) if data[:1] in (b"{", b"n", b"a", b"f") or path.suffix in (
            ".json", ".yaml", ".src", ".tgt") else json.dumps({"model": {"d_model": 16}}).encode()
        path.write_bytes(other)
    elif how == "pickle":
        path.write_bytes(malicious_pickle(marker))
    else:
        raise ValueError(how)


MUTATIONS = ("truncated", "flipped", "another file type", "pickle")


def copy_work(source: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of a workdir and its recipe (pointing at the copy)."""
    work = tmp_path / "work"
    shutil.copytree(source, work)
    recipe = work / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace(str(source), str(work)))
    return work, recipe
