"""Parallel text files: ``data.files = {split: {lang: path}}`` for train, dev and test.

Dev and test are read whole (they are small and must stay line for line as given); train
streams, so a corpus of millions of lines never sits in memory twice. A file compressed with
gzip, bzip2 or xz (as corpora are shipped) is read through it, whatever its name: its first
bytes say which. Every problem a user can cause (a missing or empty file, bytes that are not
UTF-8, sides of different lengths, a damaged compressed file) is a ``DataError`` that names
the file, and the line for bad bytes.
"""
from __future__ import annotations

import bz2
import gzip
import itertools
import lzma
import re
import zlib
from pathlib import Path
from typing import Callable, Iterator

from nmtkit.config import SourceConfig
from nmtkit.data.sources.corpus import Corpus, Pair
from nmtkit.errors import ConfigError, DataError
from nmtkit.storage.files import decode_line, decode_lines, shown_path

SPLITS = ("train", "dev", "test")


def paths(data: SourceConfig, splits: tuple[str, ...] = SPLITS) -> dict[str, tuple[Path, Path]]:
    """(source path, target path) per split, checked to exist and be non-empty."""
    if not isinstance(data.files, dict) or not data.files:
        raise ConfigError("data.files: give {train, dev, test} each with "
                          f"{data.src_lang} and {data.tgt_lang} paths (data.source=files)")
    unread = [str(key) for key in data.files if key not in splits]
    if unread:  # a `valid:` or `test2:` beside dev would be silently ignored
        raise ConfigError(f"data.files.{unread[0]}: not a split nmtkit reads here (it reads {', '.join(splits)})")
    out = {}
    for split in splits:
        entry = data.files.get(split)
        if not isinstance(entry, dict):
            raise ConfigError(f"data.files.{split}: missing; expected {{{data.src_lang}: path, {data.tgt_lang}: path}}")
        extra = [str(key) for key in entry if key not in (data.src_lang, data.tgt_lang)]
        if extra:  # a third language beside the two would be silently ignored, like an unknown split
            raise ConfigError(f"data.files.{split}.{extra[0]}: not a language of this corpus (it reads "
                              f"{data.src_lang} and {data.tgt_lang})")
        pair = []
        for lang in (data.src_lang, data.tgt_lang):
            if not entry.get(lang):
                raise ConfigError(f"data.files.{split}.{lang}: missing (languages given: {', '.join(map(str, entry))})")
            path = Path(str(entry[lang])).expanduser()
            if path.is_dir():
                raise DataError(f"{shown_path(path, f'data.files.{split}.{lang}')} is a directory, not a text file")
            if not path.is_file():
                raise DataError(f"file not found: {shown_path(path, f'data.files.{split}.{lang}')}")
            if path.stat().st_size == 0:
                raise DataError(f"file is empty: {shown_path(path, f'data.files.{split}.{lang}')}")
            _check_line_ends(path, f"data.files.{split}.{lang}")
            pair.append(path)
        out[split] = (pair[0], pair[1])
    return out


# the first bytes of each compressed format -> (its name, how to open it); bzip2's "BZh" is plain ASCII,
# so its block size digit and its first block's (or the empty stream's) magic must follow
COMPRESSED = {re.compile(rb"\x1f\x8b\x08"): ("gzip", gzip.open),
              re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)"): ("bzip2", bz2.open),
              re.compile(rb"\xfd7zXZ\x00"): ("xz", lzma.open)}
_DAMAGED = (EOFError, OSError, zlib.error, lzma.LZMAError)  # what a truncated or corrupt stream raises


def compression(path: Path) -> tuple[str, Callable]:
    """(format name, opener) of ``path``: gzip, bzip2 or xz by its first bytes, else plain."""
    with open(path, "rb") as handle:
        head = handle.read(10)
    return next((found for magic, found in COMPRESSED.items() if magic.match(head)), ("plain", open))


def _read(path: Path, key: str, read: Callable) -> Iterator:
    """What ``read(handle)`` yields from ``path`` opened through its compression; a damaged
    compressed file is a DataError naming it."""
    name, opener = compression(path)
    try:
        with opener(path, "rb") as handle:
            yield from read(handle)
    except _DAMAGED as err:
        if name == "plain":
            raise
        raise DataError(f"{shown_path(path, key)}: a damaged {name} file ({err})") from None


def _blocks(path: Path, key: str) -> Iterator[bytes]:
    """The bytes of ``path``, decompressed, a MiB at a time."""
    return _read(path, key, lambda handle: iter(lambda: handle.read(1 << 20), b""))


def _raw_lines(path: Path, key: str) -> Iterator[bytes]:
    """The lines of ``path``, decompressed, as bytes with their line ends."""
    return _read(path, key, iter)


def _check_line_ends(path: Path, key: str) -> None:
    """Lines end in \\n (or \\r\\n); a file of old-Mac \\r line ends would read as one huge line."""
    carriage_return, empty = False, True
    for block in _blocks(path, key):  # usually one block: up to the first \n
        if b"\n" in block:
            return
        carriage_return, empty = carriage_return or b"\r" in block, False
    if empty:  # a compressed file of nothing (a plain one is found by its size)
        raise DataError(f"file is empty: {shown_path(path, key)}")
    if carriage_return:
        raise DataError(f"{shown_path(path, key)} ends its lines with a carriage return alone (old Mac "
                        f"text), so it would read as one line; convert it, e.g. tr '\\r' '\\n' < FILE > NEW")


def fingerprint(data: SourceConfig, splits: tuple[str, ...] = SPLITS) -> dict:
    """Paths with their sizes and modification times: a changed file means a new fetch."""
    return {split: [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in pair]
            for split, pair in paths(data, splits).items()}


def read(data: SourceConfig, splits: tuple[str, ...] = SPLITS) -> Corpus:
    """The splits of ``data.files``; with ``splits=("train",)`` (a training-only corpus of
    data.corpora) dev and test are empty."""
    split_paths = paths(data, splits)
    if data.max_train_pairs > 0:  # reading stops early, before a length mismatch would show: count first
        counts = [count_lines(path, f"data.files.train.{lang}")
                  for path, lang in zip(split_paths["train"], (data.src_lang, data.tgt_lang))]
        if counts[0] != counts[1]:
            src, tgt = split_paths["train"]
            raise DataError(f"{src} has {counts[0]} lines but {tgt} has {counts[1]}")
    keys = {split: tuple(f"data.files.{split}.{lang}" for lang in (data.src_lang, data.tgt_lang)) for split in split_paths}
    dev, test = (_read_pairs(*split_paths[split], keys[split]) if split in split_paths else []
                 for split in ("dev", "test"))
    provenance = {"files": {split: {lang: str(path.resolve()) for lang, path in zip((data.src_lang, data.tgt_lang), pair)}
                            for split, pair in split_paths.items()}}
    return Corpus(train=_stream_pairs(*split_paths["train"], keys["train"]), dev=dev, test=test, provenance=provenance)


def count_lines(path: Path, key: str) -> int:
    """Lines as the readers split them (on \\n; a last line without one counts), without decoding."""
    lines, last = 0, b"\n"
    for block in _blocks(path, key):
        lines += block.count(b"\n")
        last = block[-1:]
    return lines + (last != b"\n")


def _read_pairs(src: Path, tgt: Path, keys: tuple[str, str]) -> list[Pair]:
    src_lines, tgt_lines = (decode_lines(_raw_lines(path, key), str(path)) for path, key in zip((src, tgt), keys))
    if len(src_lines) != len(tgt_lines):
        raise DataError(f"{src} has {len(src_lines)} lines but {tgt} has {len(tgt_lines)}")
    return list(zip(src_lines, tgt_lines))


def _stream_pairs(src: Path, tgt: Path, keys: tuple[str, str]) -> Iterator[Pair]:
    """Line pairs of two files read together; a length mismatch is found when one ends."""
    src_file, tgt_file = _raw_lines(src, keys[0]), _raw_lines(tgt, keys[1])
    for lineno, (src_raw, tgt_raw) in enumerate(itertools.zip_longest(src_file, tgt_file), 1):
        if src_raw is None or tgt_raw is None:
            src_total = lineno - 1 + (src_raw is not None) + sum(1 for _ in src_file)
            tgt_total = lineno - 1 + (tgt_raw is not None) + sum(1 for _ in tgt_file)
            raise DataError(f"{src} has {src_total} lines but {tgt} has {tgt_total}")
        yield decode_line(src_raw, str(src), lineno), decode_line(tgt_raw, str(tgt), lineno)
