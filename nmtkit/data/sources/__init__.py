"""Where parallel data comes from: local text files, HuggingFace ``datasets``, SWORD Bibles.

Every source turns a ``SourceConfig`` (``data``, or one of ``data.corpora``) into a ``Corpus``:
training pairs (a list, or a lazy iterator so that a large corpus streams), dev and test pairs
as lists, and a JSON-able ``provenance`` record for the manifest. ``fingerprint`` names what a
fetch depends on (config fields, input file sizes and times, module versions) without reading
the data, so ``prepare`` can tell cheaply whether its fetched copy is stale. ``data.split_seed``
re-draws dev and test from the same corpus (``resplit.py``; split 0: the source's own).
"""
from __future__ import annotations

from types import ModuleType

from nmtkit.data.sources.corpus import Corpus


def source_module(source: str) -> ModuleType:
    """The module implementing ``read(data) -> Corpus`` and ``fingerprint(data) -> dict``."""
    if source == "files":
        from nmtkit.data.sources import files as module
    elif source == "hf":
        from nmtkit.data.sources import hf as module
    elif source == "sword":
        from nmtkit.data.sources import sword as module
    else:
        from nmtkit.errors import ConfigError

        raise ConfigError(f"data.source: {source!r} is not one of files, hf, sword")
    return module


def read_corpus(data, split_seed: int = 0) -> Corpus:
    """The source's corpus; ``split_seed`` > 0 re-draws its dev and test (see resplit.py)."""
    if data.source == "sword":  # re-draws by book, keeping the verse references of what it holds out
        from nmtkit.data.sources import sword

        return sword.read(data, split_seed)
    from nmtkit.data.sources.resplit import resplit

    return resplit(source_module(data.source).read(data), split_seed)


def fingerprint(data) -> dict:
    return source_module(data.source).fingerprint(data)
