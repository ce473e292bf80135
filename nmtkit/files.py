"""File helpers every step uses: atomic writes, checked UTF-8 line reading, checksums.

Everything nmtkit writes goes to a temporary name in the same directory and is renamed
into place, so a killed process never leaves a half-written file that looks finished.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

from nmtkit.errors import DataError, NmtkitError

UMASK = os.umask(0o022)  # read the process umask (setting it is the only way) ...
os.umask(UMASK)  # ... and put it back


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temp file beside ``path``; on success fsync and rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp makes 0600; give the file the usual permissions
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None:  # a failed write (a full disk): name the file
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


@contextlib.contextmanager
def exclusive(directory: Path, holder: str) -> Iterator[None]:
    """Hold a lock on ``directory`` (its ``.lock`` file) or fail at once: two processes writing
    the same files would corrupt them. ``holder`` names the other user in the error."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking
        yield
        return
    with open(Path(directory) / ".lock", "a") as handle:  # "a": taking the lock leaves the file untouched
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise NmtkitError(f"{directory} is in use by {holder}; wait for it to finish") from None
        yield


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def shown_path(path: str | Path, key: str) -> str:
    """How an error names a path a recipe gave (``key``): the absolute path tried and, for a
    relative one, the directory it was resolved against (the current directory)."""
    path = Path(path)
    absolute = Path(os.path.abspath(path))
    if path.is_absolute():
        return f"{absolute} ({key})"
    return f"{absolute} ({key} = {str(path)!r}, relative to the current directory {os.getcwd()})"


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def decode_line(raw: bytes, name: str, lineno: int, errors: str = "strict") -> str:
    """Decode one line of UTF-8, naming file and line on failure; strips the newline (\\n or
    \\r\\n) and, on line 1, a byte-order mark (editors on Windows write one)."""
    try:
        text = raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as err:
        raise DataError(f"{name}: line {lineno} is not valid UTF-8 (byte {err.start})") from None
    text = text.rstrip("\n").rstrip("\r")
    return text.removeprefix("\ufeff") if lineno == 1 else text


def check_readable(path: str | Path) -> Path:
    """``path`` if it can be read as text: a file, a pipe or a device such as /dev/stdin."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"file not found: {path}")
    if path.is_dir():
        raise DataError(f"{path} is a directory, not a text file")
    return path


def read_lines(path: str | Path, errors: str = "strict") -> list[str]:
    """Read UTF-8 text (a file, a pipe, /dev/stdin) as a list of lines (no newlines); a clear error otherwise."""
    path = check_readable(path)
    with open(path, "rb") as handle:
        return [decode_line(raw, str(path), i, errors) for i, raw in enumerate(handle, 1)]
