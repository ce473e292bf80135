"""Checksums computed ahead, in a background thread, while a command still imports torch.

Verifying a model's weights against checksums.json means reading and hashing every byte
(about 0.03 s for a 30 MB model), and ``nmtkit translate`` used to do it after torch was
imported. Hashing releases the GIL and torch's import keeps only one core busy, so the
digests can be computed beside the import instead. Nothing is trusted on that account:
``verify`` still compares every listed file with its manifest, taking an early digest only
when the file is still the one that was hashed (same device, inode, size, modification and
change times, before and after hashing and at use), else hashing it again. An early digest
is used once.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Iterable, Optional

from nmtkit.storage.files import sha256_file

Identity = tuple[int, int, int, int, int]


def identity(path: Path) -> Optional[Identity]:
    """What changes when a file is replaced or written: device, inode, size, mtime, ctime."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


class _Hashing:
    """The digests of ``paths``, hashed one after another in a daemon thread."""

    def __init__(self, paths: list[Path]) -> None:
        self.digests: dict[Path, tuple[Identity, str]] = {}
        self._thread = threading.Thread(target=self._run, args=(paths,), daemon=True, name="nmtkit-hash-ahead")
        self._thread.start()

    def _run(self, paths: list[Path]) -> None:
        for path in paths:
            before = identity(path)
            try:
                digest = sha256_file(path)
            except OSError:  # the reader reports it, in its own words, when it reads the file
                continue
            if before is not None and identity(path) == before:
                self.digests[path] = (before, digest)

    def take(self, path: Path) -> Optional[tuple[Identity, str]]:
        self._thread.join()
        return self.digests.pop(path, None)


_pending: dict[Path, _Hashing] = {}  # each file hashed ahead, until a reader takes its digest


def hash_ahead(paths: Iterable[Path]) -> None:
    """Begin hashing the regular files among ``paths`` in the background (links followed)."""
    files = [Path(os.path.abspath(p)) for p in paths if os.path.isfile(p)]
    if files:
        hashing = _Hashing(files)
        _pending.update((path, hashing) for path in files)


def file_sha256(path: str | Path) -> str:
    """The sha256 of ``path``: the digest computed ahead when the file is unchanged since, else
    hashed now."""
    key = Path(os.path.abspath(path))
    hashing = _pending.pop(key, None)
    early = hashing.take(key) if hashing is not None else None
    if early is not None and identity(key) == early[0]:
        return early[1]
    return sha256_file(path)
