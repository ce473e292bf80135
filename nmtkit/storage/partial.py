"""The finished chunks of an output file that is not whole yet, kept beside it so that a
killed ``translate -i FILE -o FILE`` continues where it stopped:

    .NAME.nmtkit-partial/    (NAME: the output's name; named as nmtkit's temporary files are)
        key.json             what the chunks were made from (input, models, settings), as a digest,
                             and the sha256 of every chunk saved under that key
        chunk-000000.txt     chunk 0's output lines, written atomically; chunk-000001.txt, ...
        .nmtkit.lock         held while a process writes here (a second one is refused)

The output itself appears only once every chunk is done, atomically, from the chunks in
order; then the directory is removed. Chunks made under another key are never used: they
are deleted (they are nmtkit's own) and the work starts over. A chunk is used only when its
bytes still have the digest recorded when it was saved and are valid UTF-8: one edited,
cut short or damaged since is translated again (with every chunk after it).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

from nmtkit.errors import ConfigError, NmtkitError
from nmtkit.storage.files import LOCK_NAME, atomic_open, atomic_write_text, exclusive, read_regular, sibling_name

KEY_FILE = "key.json"
_CHUNK = re.compile(r"chunk-\d{6,}\.txt")
MAX_CHUNK_BYTES = 1 << 34  # far above any chunk's translations; only a bound on what is read


def partial_dir(output: Path) -> Path:
    """Where the finished chunks of ``output`` wait; a one-line error when something that is
    not such a directory is in the way (nmtkit does not replace it)."""
    directory = output.with_name(sibling_name(output, "partial"))
    if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
        raise ConfigError(f"{directory} (where translate keeps the finished chunks of {output}) is in the way: "
                          f"move it away")
    return directory


class PartialOutput:
    """The chunk store of one output under one key (``open_partial`` makes it)."""

    def __init__(self, output: Path, directory: Path, key: str, digests: dict[str, str], kept: bool,
                 discarded: bool) -> None:
        self.output, self.directory, self.key = output, directory, key
        self.digests = digests  # chunk file name -> sha256 of its bytes, as saved under ``key``
        self.kept = kept  # chunks of an earlier run under the same key are here
        self.discarded = discarded  # chunks made under another key were deleted

    def chunk_path(self, index: int) -> Path:
        return self.directory / f"chunk-{index:06d}.txt"

    def has(self, index: int, lines: int) -> bool:
        """Whether chunk ``index`` is saved, whole and as written: a regular file whose digest
        is the one recorded when it was saved, valid UTF-8, of ``lines`` lines each ended by
        a newline."""
        path = self.chunk_path(index)
        expected = self.digests.get(path.name)
        if expected is None or not path.is_file():
            return False
        try:
            data = read_regular(path, MAX_CHUNK_BYTES, what="saved chunk")
            data.decode("utf-8")
        except (NmtkitError, UnicodeDecodeError):
            return False
        whole = data.count(b"\n") == lines and data.endswith(b"\n") == (lines > 0)
        return whole and hashlib.sha256(data).hexdigest() == expected

    def save(self, index: int, data: bytes) -> None:
        """Chunk ``index``'s digest in key.json, then the chunk: a chunk file that is there has
        its digest recorded, and a digest whose chunk a kill kept from being written names
        nothing (the chunk is translated again)."""
        self.digests[self.chunk_path(index).name] = hashlib.sha256(data).hexdigest()
        _write_key(self.directory, self.key, self.digests)
        with atomic_open(self.chunk_path(index), "wb") as handle:
            handle.write(data)

    def finish(self, chunks: int) -> None:
        """Write the output from chunks 0 .. ``chunks`` - 1 (atomically), then remove the store."""
        with atomic_open(self.output, "wb") as out:
            for index in range(chunks):
                with open(self.chunk_path(index), "rb") as handle:
                    shutil.copyfileobj(handle, out, 1 << 20)
        _remove_ours(self.directory, everything=True)
        with contextlib.suppress(OSError):  # a file that is not ours keeps the directory
            os.rmdir(self.directory)


@contextlib.contextmanager
def open_partial(output: Path, key: str) -> Iterator[PartialOutput]:
    """The chunk store of ``output`` for ``key``, locked while in use; chunks of another key
    are deleted first."""
    directory = partial_dir(output)
    directory.mkdir(parents=True, exist_ok=True)
    with exclusive(directory, f"another nmtkit translate writing {output}"):
        chunks = bool(_chunks(directory))
        saved_key, digests = _read_key(directory)
        same = saved_key == key
        if not same:
            _remove_ours(directory, everything=False)
            digests = {}
            _write_key(directory, key, digests)
        yield PartialOutput(output, directory, key, digests, kept=same and chunks, discarded=chunks and not same)


def _read_key(directory: Path) -> tuple[str | None, dict[str, str]]:
    """The key the chunks in ``directory`` were made under and their recorded digests
    ((None, {}) when key.json is missing or damaged: every chunk is then another key's)."""
    try:
        value = json.loads(read_regular(directory / KEY_FILE, what="chunk key").decode("utf-8"))
    except (NmtkitError, ValueError, RecursionError):
        return None, {}
    if not isinstance(value, dict) or not isinstance(value.get("key"), str):
        return None, {}
    digests = value.get("chunks")
    if not isinstance(digests, dict):
        digests = {}
    return value["key"], {name: digest for name, digest in digests.items()
                          if _CHUNK.fullmatch(name) and isinstance(digest, str)}


def _write_key(directory: Path, key: str, digests: dict[str, str]) -> None:
    atomic_write_text(directory / KEY_FILE, json.dumps({"key": key, "chunks": digests}, sort_keys=True) + "\n")


def _chunks(directory: Path) -> list[Path]:
    return [path for path in directory.iterdir() if _CHUNK.fullmatch(path.name)]


def _remove_ours(directory: Path, everything: bool) -> None:
    """Delete the chunk files in ``directory`` (with ``everything``, also key.json and the lock;
    ``.lock`` is the name an older nmtkit gave it), and nothing else."""
    paths = _chunks(directory) + ([directory / KEY_FILE, directory / LOCK_NAME, directory / ".lock"]
                                  if everything else [])
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
