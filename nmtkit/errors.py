"""Errors a user can cause. The CLI prints them as one line and exits non-zero;
anything else is a bug and keeps its traceback.

Exit codes: 2 when what the user gave is wrong (an option, a recipe, a file or directory
that is missing, of the wrong kind or damaged), 1 when a run fails for reasons outside
what was given (a full disk, a missing package, a failed write).
"""
from __future__ import annotations

import errno
from typing import Optional


class NmtkitError(Exception):
    """A runtime failure of the environment (exit code 1)."""

    exit_code = 1


class ConfigError(NmtkitError):
    """An invalid recipe, override or option (exit code 2: bad usage)."""

    exit_code = 2


class DataError(NmtkitError):
    """Unreadable, mismatched or malformed data files (exit code 2: bad input)."""

    exit_code = 2


class CheckpointError(NmtkitError):
    """A missing, truncated, corrupt or unsafe checkpoint / model directory (exit code 2: bad input)."""

    exit_code = 2


# OSErrors that are the user's to fix (a full disk, a quota, a read-only or forbidden place): exit 1
_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}
# ... and those that mean a path the user gave is the wrong kind of thing (workdir=a file): bad input, exit 2
_INPUT_ERRNOS = {errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP}


def user_os_error(err: OSError) -> Optional[tuple[str, int]]:
    """An OSError the user can fix as (one-line message, exit code); None for any other (a bug).
    Any other OSError that names a file (an I/O error, a name the file system refuses) is the
    environment's too: it is reported with that name, exit 1."""
    if err.errno not in _ENVIRONMENT_ERRNOS | _INPUT_ERRNOS and not err.filename:
        return None
    message = f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return message, 2 if err.errno in _INPUT_ERRNOS else 1
