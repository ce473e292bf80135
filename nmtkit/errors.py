"""Errors a user can cause. The CLI prints them as one line and exits non-zero;
anything else is a bug and keeps its traceback.

Exit codes: 2 when what the user gave is wrong (an option, a recipe, a file or directory
that is missing, of the wrong kind or damaged), 1 when a run fails for reasons outside
what was given (a full disk, a missing package, a failed write).
"""


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
