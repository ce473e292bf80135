"""The seeds and data splits a sweep repeats its variants over: parsed and checked, one line
per mistake (``seeds:``/``splits:`` in a sweep file, ``--seeds``/``--splits`` on the command line)."""
from __future__ import annotations

from typing import Any

from nmtkit.errors import ConfigError

MAX_SPLITS = 100


def parse_seeds(text: str) -> list[int]:
    """``--seeds 1,2,3`` -> [1, 2, 3]."""
    try:
        return [int(item) for item in text.split(",")]
    except ValueError:
        raise ConfigError(f"--seeds {text}: expected training seeds separated by commas, e.g. 1,2,3") from None


def check_seeds(value: Any, where: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not value or \
            not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in value):
        raise ConfigError(f"{where}: expected a non-empty list of training seeds (integers 0 .. 2^31-1), got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where}: a seed is listed twice in {value!r}")
    return list(value)


def check_splits(value: Any, where: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SPLITS:
        raise ConfigError(f"{where}: expected a number of data splits from 1 to {MAX_SPLITS}, got {value!r}")
    return value
