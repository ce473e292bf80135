"""File helpers every step uses: atomic writes, checked UTF-8 line reading, checksums.

Everything nmtkit writes goes to a temporary name in the same directory and is renamed
into place, so a killed process never leaves a half-written file that looks finished.
Temporary names say whose they are, ``.NAME.nmtkit-HOST-PID-RANDOM.tmp``: one that a
``kill -9`` left behind is removed by the next write beside NAME, but only when HOST is this
machine, process PID no longer runs and the current user owns it.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import glob
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
from pathlib import Path
from typing import IO, Iterable, Iterator

from nmtkit.errors import ConfigError, DataError, NmtkitError

UMASK = os.umask(0o022)  # read the process umask (setting it is the only way) ...
os.umask(UMASK)  # ... and put it back
_HOST = re.sub(r"\W", "_", socket.gethostname())[:32] or "host"
_NAME_CHARS = 80  # of NAME kept in a temporary name (file names are limited to 255 bytes)
LOCK_NAME = ".nmtkit.lock"  # named as ours: a work directory may be the user's, holding a `.lock` of theirs


def sibling_name(path: Path, tag: str) -> str:
    """The name of something nmtkit keeps beside ``path``: ``.NAME.nmtkit-TAG`` (temporary files,
    a translation's finished chunks), so that whose it is and what for can be read off it. A
    NAME too long to keep whole is cut and followed by a digest of the whole name, so two
    names that share their first characters never share a sibling."""
    name = path.name
    if len(name) > _NAME_CHARS:
        digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        name = f"{name[:_NAME_CHARS - 17]}~{digest}"
    return f".{name}.nmtkit-{tag}"


def _temp_prefix(path: Path) -> str:
    return sibling_name(path, f"{_HOST}-")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; not a pid we would write
        return True
    return True


def remove_stale_temps(path: Path) -> list[Path]:
    """Delete temporary siblings of ``path`` that a dead nmtkit process of this user on this
    machine left behind; return them."""
    prefix = _temp_prefix(path)
    pattern = re.compile(re.escape(prefix) + r"(\d+)-\w+\.tmp$")
    candidates = path.parent.glob(f"{glob.escape(prefix)}*.tmp") if path.parent.is_dir() else []
    return _remove_stale(candidates, pattern)


_ANY_TEMP = re.compile(r"^\..+\.nmtkit-" + re.escape(_HOST) + r"-(\d+)-[0-9a-f]+\.tmp$")


def remove_stale_temps_in(directory: Path) -> list[Path]:
    """``remove_stale_temps`` for every name in ``directory``: the temporary files and
    directories a dead nmtkit process of this user on this machine left there, whatever
    they were to become; return them."""
    directory = Path(directory)
    return _remove_stale(directory.iterdir() if directory.is_dir() else [], _ANY_TEMP)


def _stale(candidate: Path, pid: int) -> bool:
    """Whether ``candidate``, named by process ``pid`` of this machine, is a dead process's
    leftover of this user (and not ours, still in use)."""
    if pid == os.getpid() or _running(pid):
        return False
    try:
        return candidate.lstat().st_uid == os.geteuid()
    except FileNotFoundError:
        return False


def _remove_stale(candidates: Iterable[Path], pattern: re.Pattern) -> list[Path]:
    removed = []
    for candidate in candidates:
        match = pattern.match(candidate.name)
        if not match or not _stale(candidate, int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):  # another cleaner was first
            if candidate.is_dir() and not candidate.is_symlink():
                shutil.rmtree(candidate)
            else:
                candidate.unlink()
            removed.append(candidate)
    return removed


@contextlib.contextmanager
def temp_beside(path: str | Path, directory: bool = False) -> Iterator[Path]:
    """A new temporary file (or directory) beside ``path``, named as ours, with the usual
    permissions, for the block to fill and rename into place; whatever is still there when the
    block ends (it raised, a signal's exception included, or returned early) is removed. Its name is
    chosen before it is created, inside the same ``try``, so a SIGTERM or Ctrl-C that arrives just
    after the file appears (a script may signal as soon as it sees it) does not leave it behind.
    Stale temporaries of dead nmtkit processes beside ``path`` are removed first."""
    path = Path(path)
    remove_stale_temps(path)
    tmp = _temp_name(path)
    try:
        _create(tmp, directory)
        yield tmp
    finally:
        _remove(tmp)


def _temp_name(path: Path) -> Path:
    return path.with_name(f"{_temp_prefix(path)}{os.getpid()}-{secrets.token_hex(6)}.tmp")


def _create(tmp: Path, directory: bool) -> None:
    """Create ``tmp`` exclusively, with the permissions the umask gives (as ``open`` would)."""
    if directory:
        os.mkdir(tmp, 0o777)
    else:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))


def _remove(tmp: Path) -> None:
    """Remove a temporary file or directory of ours, if it is (still) there; a failure to (a
    read-only directory) must not replace the exception that is on its way out."""
    with contextlib.suppress(OSError):
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink()


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temp file beside ``path``; on success fsync and rename it over ``path``, with the
    permission bits of the file it replaces (a private file stays private)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with temp_beside(path) as tmp:
            with open(tmp, mode, encoding=None if "b" in mode else encoding) as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            with contextlib.suppress(FileNotFoundError):
                os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
            os.replace(tmp, path)
    except OSError as err:
        if err.filename is None:  # a failed write (a full disk): name the file
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


@contextlib.contextmanager
def exclusive(directory: Path, holder: str, shared: bool = False) -> Iterator[None]:
    """Hold a lock on ``directory`` (its ``.nmtkit.lock`` file) or fail at once: two processes writing
    the same files would corrupt them. ``holder`` names the other user in the error, with the
    pid and host it recorded in the file. The kernel releases a ``flock`` however its holder
    exits, so the lock of a killed process is simply taken over (no guessing by pid).
    ``shared``: a reader's hold, which any number of readers share and which keeps the
    exclusive holder (the writer) out; a directory a reader cannot lock (read-only) is read
    without one."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking
        yield
        return
    lock_file = Path(directory) / LOCK_NAME
    # not truncated before we hold the lock; a symbolic link there is refused (ELOOP), not
    # followed: the pid written next would overwrite whatever it points to
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as err:
        if not shared or err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        yield
        return
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError:
            raise NmtkitError(f"{directory} is in use by {holder} ({_lock_holder(lock_file)}); "
                              f"wait for it to finish") from None
        if not shared:  # readers leave the writer's record alone
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        try:
            yield
        finally:
            if not shared:  # a later refusal must not name this finished writer
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


def _lock_holder(lock_file: Path) -> str:
    """Who holds ``lock_file``, as the holder recorded it."""
    try:
        text = lock_file.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        text = ""
    return text or "pid not recorded: a reader, or a writer just starting"


def replace_directory(tmp: Path, out_dir: Path) -> None:
    """Move the finished directory ``tmp`` to ``out_dir``, replacing what is there (the caller
    has checked it may). Where the kernel can, the two swap places in one rename (``renameat2``
    with ``RENAME_EXCHANGE``), so ``out_dir`` is never missing; the old copy is then under our
    temporary name, which stale-temp cleaning removes if a kill comes first. Elsewhere it takes
    two renames, ``out_dir`` -> ``.NAME.nmtkit-old-HOST-PID-RANDOM`` (``parked_name``) and ``tmp``
    -> ``out_dir``: a kill in between leaves only that complete old copy, which the next write
    of ``out_dir`` (or a resumed training) moves back, once its process is gone."""
    restore_parked(out_dir)
    if not os.path.lexists(out_dir):
        os.replace(tmp, out_dir)
        return
    if _exchange(tmp, out_dir):
        _remove(tmp)  # the old copy now
        return
    parked = out_dir.with_name(parked_name(out_dir))
    os.replace(out_dir, parked)
    os.replace(tmp, out_dir)
    shutil.rmtree(parked, ignore_errors=True)


def parked_name(out_dir: Path) -> str:
    """Where ``replace_directory`` parks the old ``out_dir`` between its two renames: named as
    ours, with host and pid, so that only a copy a dead process of ours left is ever touched."""
    return sibling_name(out_dir, f"old-{_HOST}-{os.getpid()}-{secrets.token_hex(6)}")


def restore_parked(out_dir: Path) -> list[Path]:
    """Copies of ``out_dir`` that a killed ``replace_directory`` parked (``parked_name``; a dead
    process of this user on this machine): the first goes back to ``out_dir`` when nothing is
    there, the rest are removed; returns them. Any other name is not touched here: an older
    nmtkit's ``.NAME.old`` may be the user's outside a training run (``tidy_run_dir`` takes
    back the run's own)."""
    out_dir = Path(out_dir)
    prefix = sibling_name(out_dir, f"old-{_HOST}-")
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[0-9a-f]+$")
    found = []
    for candidate in sorted(out_dir.parent.glob(f"{glob.escape(prefix)}*")) if out_dir.parent.is_dir() else []:
        match = pattern.match(candidate.name)
        if not match or not _stale(candidate, int(match.group(1))) or not candidate.is_dir():
            continue
        with contextlib.suppress(FileNotFoundError):  # another cleaner was first
            if os.path.lexists(out_dir):
                shutil.rmtree(candidate)
            else:
                os.replace(candidate, out_dir)
            found.append(candidate)
    return found


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100
# what renameat2 answers where this kernel, file system or sandbox cannot swap (seccomp filters
# commonly refuse a syscall they do not allow with EPERM): the caller then renames twice
_CANNOT_EXCHANGE = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP),
                    errno.EPERM}


@functools.cache
def _renameat2():
    """libc's renameat2 and ctypes' errno reader, looked up once; None where there is none."""
    import ctypes

    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "renameat2"), ctypes.get_errno
    except (OSError, AttributeError, TypeError):  # no C library to load, or no renameat2 in it
        return None


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` in one rename; False where the kernel, C library, file system or
    sandbox cannot (the caller then renames twice)."""
    found = _renameat2()
    if found is None:
        return False
    call, get_errno = found
    if call(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = get_errno()
    if code in _CANNOT_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(b))


def refuse_foreign(path: str | Path, role: str, where: str = "workdir") -> None:
    """The one rule for a file nmtkit keeps in a directory that may be the user's (a work
    directory, a sweep's): the caller found ``path`` there and could not recognise it as one
    nmtkit wrote, so it is the user's, and nmtkit replaces nothing it did not create."""
    raise ConfigError(
        f"{path} exists and nmtkit did not write it (it is where nmtkit keeps {role}); move it, "
        f"or choose another {where}")


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def write_text_if_changed(path: str | Path, text: str) -> bool:
    """Write ``text`` atomically unless the file already holds it (then the file and its mtime are
    left alone); says whether it wrote."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if Path(path).read_text(encoding="utf-8") == text:
            return False
    atomic_write_text(path, text)
    return True


def shown_path(path: str | Path, key: str, given: str | Path | None = None) -> str:
    """How an error names a path a recipe gave (``key``), or one under it (``given``: the
    recipe's value): the absolute path tried and, for a relative one, the directory it was
    resolved against (the current directory)."""
    given = Path(path if given is None else given)
    absolute = Path(os.path.abspath(path))
    if given.is_absolute():
        return f"{absolute} ({key})"
    return f"{absolute} ({key} = {str(given)!r}, relative to the current directory {os.getcwd()})"


MAX_RECORD_BYTES = 1 << 20  # a record, stamp, manifest or model config nmtkit writes is a few kB


def read_regular(path: str | Path, limit: int = MAX_RECORD_BYTES, error: type[NmtkitError] = DataError,
                 what: str = "file") -> bytes:
    """The bytes of ``path``, which must be a regular file (a link to one is followed) of at most
    ``limit`` bytes, else ``error`` in one line. Where nmtkit expects a file it wrote, a link to
    /dev/zero would be read until memory runs out and a named pipe would wait for a writer
    forever: the kind and size are checked on the opened descriptor (opened without waiting)
    before a byte is read, and no more than ``limit`` bytes are ever read."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise error(f"{path}: cannot read the {what} ({err.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path}: not a regular file (a {what} is one); replace it with the file itself")
        if info.st_size > limit:
            raise error(f"{path}: {info.st_size:,} bytes, more than a {what} holds (at most {limit:,})")
        os.set_blocking(fd, True)
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as err:
        raise error(f"{path}: cannot read the {what} ({err.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while it was read
        raise error(f"{path}: more than a {what} holds (at most {limit:,} bytes)")
    return data


def read_json_dict(path: str | Path) -> dict | None:
    """A small JSON record nmtkit wrote (a stamp, a record, a saved config), or None when it
    is missing, unreadable, not a regular file of a record's size, damaged, nested past the
    parser's depth, or not an object: the callers treat all of these as "no record"."""
    try:
        record = json.loads(read_regular(path).decode("utf-8"))
    except (NmtkitError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


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
        return decode_lines(handle, str(path), errors)


def decode_lines(raws: Iterable[bytes], name: str, errors: str = "strict") -> list[str]:
    """``decode_line`` over lines of bytes (a file, or a decompressing reader's), numbered from 1."""
    return [decode_line(raw, name, i, errors) for i, raw in enumerate(raws, 1)]
