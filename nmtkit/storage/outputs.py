"""What ``-o`` may name, checked before any work, so nmtkit never destroys what it did not create.

Every command's ``-o`` follows the same rules:
- an empty path, a path under something that is not a directory, or a block device or
  socket is a one-line error;
- a symbolic link is followed: what it points to is written (or refused) by these rules
  and the link itself stays;
- a file output (translate, plot, attention) replaces a regular file atomically and is
  written directly, without a temporary file, to a character device (``/dev/null``) or a
  named pipe; a directory there is an error, and so is a read-only file (one without write
  bits too, which root could write);
- a path naming an open file descriptor (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``,
  ``/proc/self/fd/N``) is written through that descriptor's file, appended to and never
  replaced: the shell's ``>> all.txt`` keeps what all.txt held, and a pipe stays a pipe;
- a directory output (average, export) replaces an existing directory only when it is a
  complete directory of the kind the command writes (the caller's ``problem`` check says
  why not otherwise); a file there is an error. There is no ``--force``: nmtkit never
  deletes a user's directory or file, the user moves it.
"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import IO, Callable, Iterator, Optional

from nmtkit.errors import ConfigError
from nmtkit.storage.files import atomic_open


def names_descriptor(path: str | Path) -> bool:
    """Whether ``path`` reaches an open file descriptor (``/dev/stdout`` -> ``/proc/self/fd/1``):
    the kernel resolves such a link to the open file itself, which ``realpath`` cannot name
    (a pipe's target is ``pipe:[N]``), so the path must be used as given."""
    path = Path(path).expanduser()
    for _ in range(40):  # the kernel's limit on links followed
        path = Path(os.path.realpath(path.parent)) / path.name
        parts = path.parts
        if (parts[:3] == ("/", "dev", "fd") and len(parts) == 4) or \
                (parts[:2] == ("/", "proc") and len(parts) == 5 and parts[3] == "fd"):
            return True
        if not path.is_symlink():
            return False
        path = path.parent / os.readlink(path)
    return False


def same_file(one: str | Path, other: str | Path) -> bool:
    """Whether two paths name one file or directory: the same path once links and ``..`` are
    resolved (so an output not made yet is still caught), or, both existing, the same inode
    (a hard link). Callers refuse writing one over the other: verses' -o and --refs, an output
    inside the model directory translate reads."""
    if os.path.realpath(one) == os.path.realpath(other):
        return True
    try:
        return os.path.samefile(one, other)
    except OSError:  # one of them does not exist (yet)
        return False


def _target(text: str | Path, option: str) -> Path:
    """The path ``-o`` names, a symbolic link followed (not one to an open descriptor), its
    parents checked."""
    if str(text).strip() == "":
        raise ConfigError(f"{option} is empty: give a path")
    path = Path(text).expanduser()
    if names_descriptor(path):
        if _kind(path) is None:
            raise ConfigError(f"{option} {text}: no such open file descriptor")
        return path
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    ancestor = target.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"{option} {text}: {ancestor} is not a directory")
    return target


def _kind(path: Path) -> Optional[str]:
    """None when nothing is at ``path``, else what is there."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISFIFO, "named pipe"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _where(text: str | Path, target: Path) -> str:
    return str(text) if Path(text) == target else f"{text} (-> {target})"


def check_output_file(text: str | Path | None, option: str = "-o") -> Optional[Path]:
    """The file to write for ``-o TEXT`` (None: stdout), or a one-line ConfigError."""
    if text is None:
        return None
    target = _target(text, option)
    kind, descriptor = _kind(target), names_descriptor(target)
    # no write bit is the owner's own refusal: root, whom os.access always lets write, is refused too
    if kind == "file" and not descriptor and (not os.access(target, os.W_OK) or not target.stat().st_mode & 0o222):
        raise ConfigError(f"{option} {_where(text, target)} is read-only: nmtkit will not replace it; make it "
                          f"writable or choose another {option}")
    if kind in (None, "file", "character device", "named pipe") or (descriptor and kind != "directory"):
        return target
    if kind == "directory":
        raise ConfigError(f"{option} {_where(text, target)} is a directory: give a file path")
    raise ConfigError(f"{option} {_where(text, target)} is a {kind}: nmtkit writes only files, "
                      f"character devices and named pipes")


def check_output_dir(text: str | Path, problem: Callable[[Path], Optional[str]], option: str = "-o") -> Path:
    """The directory to write for ``-o TEXT``. An existing directory is replaced only when
    ``problem(target)`` is None; anything else there is a one-line ConfigError."""
    target = _target(text, option)
    kind = _kind(target)
    if kind is None:
        return target
    if kind != "directory":
        raise ConfigError(f"{option} {_where(text, target)} is a {kind}, not a directory: "
                          f"nmtkit will not replace it; choose another {option}")
    reason = problem(target)
    if reason is not None:
        raise ConfigError(f"{option} {_where(text, target)} exists and {reason}: nmtkit replaces only a "
                          f"directory it wrote; choose another {option} or move it away")
    return target


def is_stream(path: Path) -> bool:
    """A character device, named pipe or open descriptor: written in place, never replaced."""
    return names_descriptor(path) or _kind(path) in ("character device", "named pipe")


@contextlib.contextmanager
def open_output(path: Path, mode: str = "wb") -> Iterator[IO]:
    """``path`` opened for writing: directly for a device, pipe or descriptor (a regular file
    behind a descriptor is appended to), else atomically."""
    if is_stream(path):
        if _kind(path) == "file":  # reopening /dev/stdout with "w" would truncate a `>>` file
            mode = mode.replace("w", "a")
        try:
            with open(path, mode) as handle:
                yield handle
        except OSError as err:
            if err.filename is None:  # a failed write (/dev/full): name the output
                raise OSError(err.errno, err.strerror, str(path)) from err
            raise
    else:
        with atomic_open(path, mode) as handle:
            yield handle
