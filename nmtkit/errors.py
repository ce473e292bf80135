"""Errors a user can cause. The CLI prints them as one line and exits non-zero;
anything else is a bug and keeps its traceback."""


class NmtkitError(Exception):
    """A problem with the user's input, files or environment (exit code 1)."""

    exit_code = 1


class ConfigError(NmtkitError):
    """An invalid recipe, override or option (exit code 2: bad usage)."""

    exit_code = 2


class DataError(NmtkitError):
    """Unreadable, mismatched or malformed data files (exit code 2: bad input)."""

    exit_code = 2


class CheckpointError(NmtkitError):
    """A missing, truncated, corrupt or unsafe checkpoint / model directory."""
