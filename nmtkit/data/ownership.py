"""Whose ``prepared/`` is it: ``prepare`` rewrites every file there, so it refuses a directory it
did not make and a corpus kept inside it (nmtkit never deletes or replaces what it did not create)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from nmtkit.config import DataConfig
from nmtkit.data.steps import UNFINISHED
from nmtkit.errors import ConfigError
from nmtkit.storage.checksums import MANIFEST
from nmtkit.storage.files import LOCK_NAME, refuse_foreign

# what only prepare writes in prepared/ (an older nmtkit's: at least the id files)
OURS = frozenset({"stamps", "manifest.json", MANIFEST, UNFINISHED, "train.npz", "dev.npz", "test.npz"})


def check_prepared_dir(data: DataConfig, out: Path) -> None:
    """prepare rewrites the files of ``out``: refuse a corpus file inside it, and an ``out`` that
    holds files of someone else's (not empty, and none of the files only prepare writes there)."""
    for key, path in _corpus_files(data):
        if path.resolve().is_relative_to(out.resolve()):
            raise ConfigError(f"{key} ({path}) is inside {out}, where prepare writes its own files; "
                              f"keep the corpus outside it")
    if out.is_dir():
        names = {entry.name for entry in out.iterdir()} - {LOCK_NAME}
        if names and not names & OURS:
            refuse_foreign(out, "the prepared data")


def _corpus_files(data: DataConfig) -> Iterator[tuple[str, Path]]:
    """(recipe key, path) of every local file the recipe's ``files`` sources name."""
    for index, corpus in enumerate(data.training_sources()):
        prefix = f"data.corpora[{index}].files" if data.corpora else "data.files"
        if corpus.source != "files" or not isinstance(corpus.files, dict):
            continue
        for split, entry in corpus.files.items():
            for lang, path in (entry.items() if isinstance(entry, dict) else ()):
                if isinstance(path, (str, Path)) and str(path):
                    yield f"{prefix}.{split}.{lang}", Path(str(path)).expanduser()
