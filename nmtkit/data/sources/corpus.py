"""What every source returns: a ``Corpus`` of ``Pair``s (a module of its own so that the
sources and the package that picks one do not import each other)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

Pair = tuple[str, str]


@dataclass
class Corpus:
    train: Iterable[Pair]
    dev: list[Pair]
    test: list[Pair]
    provenance: dict = field(default_factory=dict)
    train_size: Optional[int] = None  # number of training pairs when known up front (progress bars)
