"""HuggingFace ``datasets`` with a ``translation`` column of ``{lang: text}`` rows.

``data.hf_name`` is a Hub id (``wmt/wmt14`` with ``hf_config: de-en``; pin ``hf_revision``
for reproducibility) or a local directory: one written by ``Dataset(Dict).save_to_disk``,
or a directory of parquet files named by split (``train-*.parquet``, ``validation-*``,
...; a subdirectory named ``hf_config`` is used when present, and must be named when several
subdirectories hold parquet files: parquet loading reads them all, as one dataset).
``data.hf_splits`` maps our train/dev/test to the dataset's split names (WMT14: validation is newstest2013, test
is newstest2014). ``datasets`` is imported here only, so other commands never pay for it.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

from nmtkit.config import SourceConfig
from nmtkit.data.sources.corpus import Corpus, Pair
from nmtkit.errors import ConfigError, DataError
from nmtkit.storage.files import shown_path

BATCH_ROWS = 10_000  # rows per arrow batch when streaming the training split


def local_dir(data: SourceConfig) -> Path | None:
    """The local dataset directory ``hf_name`` names, or None for a Hub id."""
    path = Path(data.hf_name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise DataError(f"{shown_path(path, 'data.hf_name')} is a file; data.hf_name must be a dataset directory "
                        f"(save_to_disk, or parquet files) or a Hub id")
    if data.hf_name.startswith((".", "/", "~")) or data.hf_name.count("/") > 1:
        raise DataError(f"dataset directory not found: {shown_path(path, 'data.hf_name')}")
    return None


def fingerprint(data: SourceConfig) -> dict:
    """What identifies the dataset: a local directory's files, or the Hub id and revision."""
    if not data.hf_name:
        raise ConfigError("data.hf_name: give a Hub dataset id (e.g. wmt/wmt14) or a local directory")
    keys = {"hf_name": data.hf_name, "hf_config": data.hf_config, "hf_revision": data.hf_revision,
            "hf_splits": data.hf_splits}
    path = local_dir(data)
    if path is not None:
        keys["files"] = sorted([str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns]
                               for p in path.rglob("*") if p.is_file())
    return keys


def read(data: SourceConfig) -> Corpus:
    fingerprint(data)  # validates hf_name
    dataset = _load(data)
    splits = {ours: _split(dataset, data, ours) for ours in ("train", "dev", "test")}
    for ours, split in splits.items():
        _check_languages(split, data, ours)
    dev, test = (list(_pairs(splits[name], data)) for name in ("dev", "test"))
    provenance = {
        "hf_name": data.hf_name, "hf_config": data.hf_config, "hf_revision": data.hf_revision,
        "splits": {ours: data.hf_splits.get(ours) for ours in splits},
        "rows": {ours: len(split) for ours, split in splits.items()},
        "fingerprints": {ours: getattr(split, "_fingerprint", None) for ours, split in splits.items()},
    }
    return Corpus(train=_pairs(splits["train"], data), dev=dev, test=test, provenance=provenance,
                  train_size=len(splits["train"]))


def _load(data: SourceConfig):
    """A DatasetDict from disk, parquet or the Hub; failures become one-line DataErrors."""
    import datasets

    path = local_dir(data)
    if path is not None and data.hf_revision:
        raise ConfigError(f"data.hf_revision pins a Hub dataset's version; {path} is a local directory, which has "
                          f"none: remove data.hf_revision")
    if path is not None and data.hf_config and not (path / data.hf_config).is_dir():
        raise ConfigError(f"data.hf_config {data.hf_config!r}: the local directory {path} has no subdirectory of that "
                          f"name (a local dataset's configurations are its subdirectories); remove data.hf_config "
                          f"to read {path} itself")
    try:
        with _quiet_hub():
            if path is None:
                return datasets.load_dataset(data.hf_name, data.hf_config or None, revision=data.hf_revision or None)
            if data.hf_config:
                path = path / data.hf_config
            if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
                loaded = datasets.load_from_disk(str(path))
                return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict(train=loaded)
            if next(path.rglob("*.parquet"), None) is not None:
                if not data.hf_config:
                    _refuse_several_configs(path)
                return datasets.load_dataset("parquet", data_dir=str(path))
    except (ConfigError, DataError):
        raise
    except Exception as err:  # datasets raises anything (IndexError, KeyError, ...) on a damaged local dataset
        where = f"{data.hf_name}" + (f" ({data.hf_config})" if data.hf_config else "")
        first = _first_line(err)
        if err.__cause__ is not None:  # DatasetGenerationError says only "An error occurred ..."; the cause says what
            first += f": {_first_line(err.__cause__)}"
        hint = " (offline? data.hf_name can be a local directory)" if isinstance(err, ConnectionError) else ""
        raise DataError(f"cannot load dataset {where}: {first}{hint}") from None
    raise DataError(f"{path}: neither a saved dataset (save_to_disk) nor a directory of parquet files")


def _first_line(err: BaseException) -> str:
    """The error's first line; named by its type unless it is an OSError or ValueError, whose messages
    stand alone (a KeyError's is just the key)."""
    text = str(err).strip()
    if not text:
        return type(err).__name__
    first = text.splitlines()[0]
    return first if isinstance(err, (OSError, ValueError)) else f"{type(err).__name__}: {first}"


def _refuse_several_configs(path: Path) -> None:
    """``load_dataset("parquet", data_dir=...)`` reads subdirectories recursively: parquet files in
    several subdirectories (configurations such as de-en/ and fr-en/) would be merged silently."""
    if next(path.glob("*.parquet"), None) is not None:
        return
    holders = sorted(sub.name for sub in path.iterdir() if sub.is_dir() and next(sub.rglob("*.parquet"), None))
    if len(holders) > 1:
        raise ConfigError(f"{path} holds parquet files in several subdirectories ({', '.join(holders)}), which would "
                          f"be merged: set data.hf_config to the one to read")


@contextlib.contextmanager
def _quiet_hub():
    """Silence per-retry warnings from the Hub client; the final error is reported once."""
    loggers = [logging.getLogger(name) for name in ("huggingface_hub", "datasets")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _split(dataset, data: SourceConfig, ours: str):
    name = (data.hf_splits or {}).get(ours)
    if not name:
        raise ConfigError(f"data.hf_splits.{ours}: missing; the dataset has splits {', '.join(dataset)}")
    if name not in dataset:
        raise DataError(f"dataset {data.hf_name} has no split {name!r} (data.hf_splits.{ours}); "
                        f"it has {', '.join(dataset)}")
    return dataset[name]


def _check_languages(split, data: SourceConfig, ours: str) -> None:
    if "translation" not in split.column_names:
        raise DataError(f"dataset {data.hf_name} split {ours} has no 'translation' column "
                        f"(columns: {', '.join(split.column_names)})")
    feature = split.features["translation"]
    if not (hasattr(feature, "languages") or isinstance(feature, dict)):
        raise DataError(f"dataset {data.hf_name} split {ours}: the translation column holds "
                        f"{getattr(feature, 'dtype', type(feature).__name__)}, not {{language: text}} rows")
    langs = list(getattr(feature, "languages", None) or (feature.keys() if isinstance(feature, dict) else []))
    missing = [lang for lang in (data.src_lang, data.tgt_lang) if lang not in langs]
    if missing:
        raise DataError(f"dataset {data.hf_name} has no language {missing[0]!r} in its translation column "
                        f"(languages: {', '.join(langs)})")


def _pairs(split, data: SourceConfig) -> Iterator[Pair]:
    """(source, target) rows in order; a missing text (or a null row) reads as empty, anything
    but text is a DataError."""
    for batch in split.iter(batch_size=BATCH_ROWS):
        for row in batch["translation"]:
            pair = tuple(_text((row or {}).get(lang)) for lang in (data.src_lang, data.tgt_lang))
            if not all(isinstance(text, str) for text in pair):
                raise DataError(f"dataset {data.hf_name}: a translation row holds {pair!r}, not text")
            yield pair


def _text(value):
    """None reads as empty; anything else is kept as is so a non-text value is reported as it was."""
    return "" if value is None else value
