"""Compact storage of encoded splits: one ``.npz`` per split with flat token arrays, memory-mapped.

A split holds ``src``/``tgt`` token ids concatenated into one array each (uint16 when the
vocabulary has at most 65,536 pieces, else uint32; directories prepared by older versions hold
int32 and read the same), plus ``*_offsets`` (int64, N+1 entries) so sentence i is
``ids[offsets[i]:offsets[i+1]]``; with several training corpora, ``corpus`` (int32, N) numbers
the corpus of each pair. No BOS/EOS are stored; the batcher adds them. No pickles.

The archive is stored uncompressed (as numpy's ``savez`` writes it too), so each array is a ``.npy``
at a fixed place in the file: ``load_split`` memory-maps them, and training reads the pages of
the sentences it batches instead of holding the corpus in memory. ``SplitWriter`` writes a split
a chunk of sentences at a time, so ``prepare`` never holds all the ids either.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from nmtkit.errors import DataError
from nmtkit.storage.checksums import verify
from nmtkit.storage.files import atomic_open, temp_beside

ARRAYS = ("src", "src_offsets", "tgt", "tgt_offsets")
CORPUS = "corpus"  # the optional fifth array
CHUNK = 1 << 22  # elements copied or hashed at a time
_LOCAL_HEADER = 30  # bytes of a zip member's local header before its name and extra field


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id of a ``vocab_size`` vocabulary."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


@dataclass
class ParallelIds:
    src: np.ndarray  # uint16/uint32 (int32 when prepared by older versions) [total src tokens]
    src_offsets: np.ndarray  # int64 [N + 1]
    tgt: np.ndarray
    tgt_offsets: np.ndarray
    corpus: Optional[np.ndarray] = None  # int [N]: which of data.corpora each pair comes from (None: one corpus)

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def digest(self) -> str:
        """sha256 of the ids themselves (not of the .npz, whose zip headers carry times), hashed
        as int32 ids and int64 offsets whatever the stored types: a run recorded on int32 ids
        resumes on the same ids stored as uint16."""
        digest = hashlib.sha256()
        arrays = [(self.src, np.int32), (self.src_offsets, np.int64), (self.tgt, np.int32),
                  (self.tgt_offsets, np.int64)]
        for array, dtype in arrays + ([(self.corpus, np.int32)] if self.corpus is not None else []):
            digest.update(f"{np.dtype(dtype).str}{array.shape}".encode())
            for start in range(0, len(array), CHUNK):
                digest.update(np.ascontiguousarray(array[start:start + CHUNK], dtype=dtype).data)
        return digest.hexdigest()

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.src[self.src_offsets[i]:self.src_offsets[i + 1]],
                self.tgt[self.tgt_offsets[i]:self.tgt_offsets[i + 1]])


def flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Sentences of ids -> (flat int32 ids, int64 offsets with N+1 entries)."""
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    if not len(seqs):
        return np.zeros(0, dtype=np.int32), offsets
    flat = np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs])  # ~10x faster than a Python loop
    return flat, offsets


class SplitWriter:
    """A split written a chunk of sentences at a time: ids and lengths go to temporary files
    beside ``path`` as they come, and ``close`` assembles the .npz from them (atomically).
    ``with_corpus``: each pair also carries the number of its training corpus."""

    def __init__(self, path: str | Path, vocab_sizes: tuple[int, int], with_corpus: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        src_type, tgt_type = (id_dtype(size) for size in vocab_sizes)
        self.dtypes = {"src": src_type, "src_offsets": np.dtype(np.int64), "tgt": tgt_type,
                       "tgt_offsets": np.dtype(np.int64)}
        if with_corpus:
            self.dtypes[CORPUS] = np.dtype(np.int32)
        self.sizes = dict.fromkeys(self.dtypes, 0)  # elements written (lengths, for the offsets)
        self._temps = contextlib.ExitStack()  # the part files: removed on close or on any failure
        try:
            self.parts = {name: self._temps.enter_context(temp_beside(self.path)) for name in self.dtypes}
            self.handles = {name: self._temps.enter_context(open(part, "wb")) for name, part in self.parts.items()}
        except BaseException:
            self._temps.close()
            raise

    def __enter__(self) -> "SplitWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if exc_type is None:
                self.close()
        finally:
            self._discard_parts()

    def add(self, src: np.ndarray, src_lengths: np.ndarray, tgt: np.ndarray, tgt_lengths: np.ndarray,
            corpus: Optional[np.ndarray] = None) -> None:
        """Append sentences: flat ids of each side, the length of each sentence (and its corpus)."""
        if len(src_lengths) != len(tgt_lengths) or (corpus is None) != (CORPUS not in self.dtypes) or (
                corpus is not None and len(corpus) != len(src_lengths)):
            raise ValueError(f"{len(src_lengths)} source vs {len(tgt_lengths)} target sentences"
                             + ("" if corpus is None else f" vs {len(corpus)} corpus numbers"))
        for name, values in zip(self.dtypes, (src, src_lengths, tgt, tgt_lengths, corpus)):
            values = np.asarray(values)
            dtype = self.dtypes[name]
            if name in ("src", "tgt") and len(values) and (values.min() < 0 or values.max() > np.iinfo(dtype).max):
                raise ValueError(f"{name} ids outside [0, {np.iinfo(dtype).max}]")
            values.astype(dtype, copy=False).tofile(self.handles[name])
            self.sizes[name] += len(values)

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()
        with atomic_open(self.path, "wb") as handle, \
                zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name in self.dtypes:
                offsets = name.endswith("_offsets")
                count = self.sizes[name] + (1 if offsets else 0)
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member, open(self.parts[name], "rb") as part:
                    header = {"descr": np.lib.format.dtype_to_descr(self.dtypes[name]), "fortran_order": False,
                              "shape": (count,)}
                    np.lib.format.write_array_header_1_0(member, header)
                    _copy_part(part, member, self.dtypes[name], offsets)

    def _discard_parts(self) -> None:
        self._temps.close()  # closes the handles, then removes the parts


def _copy_part(part, member, dtype: np.dtype, offsets: bool) -> None:
    """Copy a part file into an archive member; lengths become offsets (a leading 0, running sums)."""
    total = np.zeros(1, np.int64)
    if offsets:
        member.write(total.tobytes())
    while len(chunk := np.fromfile(part, dtype=dtype, count=CHUNK)):
        if offsets:
            chunk = total[-1] + np.cumsum(chunk)
            total = chunk[-1:]
        member.write(chunk.tobytes())


def save_split(path: str | Path, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]],
               corpus: Optional[np.ndarray] = None, vocab_sizes: Optional[tuple[int, int]] = None) -> None:
    """A whole split at once; ``corpus`` (one int per pair) tells several training corpora apart.
    Ids are stored in the type ``vocab_sizes`` needs (else the type their largest id needs)."""
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} source vs {len(tgt)} target sentences")
    (src_flat, src_off), (tgt_flat, tgt_off) = flatten(src), flatten(tgt)
    sizes = vocab_sizes or tuple(int(flat.max()) + 1 if len(flat) else 1 for flat in (src_flat, tgt_flat))
    with SplitWriter(path, sizes, with_corpus=corpus is not None) as writer:
        writer.add(src_flat, np.diff(src_off), tgt_flat, np.diff(tgt_off), corpus)


def prepared_file(path: Path) -> Path:
    """``path`` (a file of a prepared directory), verified against the directory's checksums.json
    (when ``prepare`` wrote one): a damaged file is a DataError before anything reads it. A
    directory a ``prepare`` left unfinished (its ``.unfinished`` mark: a step changed its outputs
    and prepare did not get to the end) may mix old and new files (a new SentencePiece model
    beside ids of the old one), so it is refused too."""
    if (path.parent / ".unfinished").exists():
        raise DataError(f"{path.parent} is incomplete: the last `nmtkit prepare` did not finish; run it again")
    verify(path.parent, [path.name], DataError, hint="; delete it and rerun `nmtkit prepare`")
    return path


def load_split(path: str | Path, vocab_sizes: Optional[tuple[int, int]] = None) -> ParallelIds:
    """A split as ``SplitWriter`` (or an older numpy ``savez``) wrote it, memory-mapped, checked for
    the layout every reader relies on and, with ``vocab_sizes`` (source, target), for ids the
    vocabularies have: a DataError naming the file otherwise (a truncated zip, a foreign array,
    ids from another SentencePiece model)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"prepared data not found: {path} (run `nmtkit prepare` first)")
    try:
        with zipfile.ZipFile(path) as archive, open(path, "rb") as raw:
            names = [*ARRAYS, *([CORPUS] if f"{CORPUS}.npy" in archive.namelist() else [])]
            ids = ParallelIds(**{name: _member_array(path, archive, raw, f"{name}.npy") for name in names})
        _check_layout(ids)
        for side, size in zip(("src", "tgt"), vocab_sizes or ()):
            flat = getattr(ids, side)
            if len(flat) and (int(flat.min()) < 0 or int(flat.max()) >= size):
                bad = int(flat.min()) if int(flat.min()) < 0 else int(flat.max())
                raise ValueError(f"{side} token id {bad} is outside the vocabulary of {size} pieces "
                                 f"(encoded with another SentencePiece model?)")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error, struct.error) as err:
        raise DataError(f"{path}: corrupt prepared data ({err}); delete it and rerun `nmtkit prepare`") from None
    return ids


def _member_array(path: Path, archive: zipfile.ZipFile, raw, name: str) -> np.ndarray:
    """One .npy of the archive: memory-mapped when stored uncompressed, else read (no pickles)."""
    info = archive.getinfo(name)
    with archive.open(info) as member:
        if info.compress_type != zipfile.ZIP_STORED:
            return np.lib.format.read_array(member, allow_pickle=False)
        version = np.lib.format.read_magic(member)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"{name}: .npy format {version} is not one nmtkit writes")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(member)
        header_bytes = member.tell()
    if dtype.hasobject:
        raise ValueError(f"{name} holds Python objects, not token ids")
    raw.seek(info.header_offset)
    local = raw.read(_LOCAL_HEADER)
    if len(local) < _LOCAL_HEADER or local[:4] != b"PK\x03\x04":
        raise ValueError(f"{name}: damaged zip member header")
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    start = info.header_offset + _LOCAL_HEADER + name_length + extra_length + header_bytes
    count = int(np.prod(shape))
    if start + count * dtype.itemsize > os.fstat(raw.fileno()).st_size:
        raise ValueError(f"{name}: {count} elements do not fit in the file (truncated?)")
    if count == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=shape).view(np.ndarray)


def _check_layout(ids: ParallelIds) -> None:
    """Flat integer id arrays with offsets from 0 to their length that never decrease (ValueError)."""
    for side in ("src", "tgt"):
        flat, offsets = getattr(ids, side), getattr(ids, f"{side}_offsets")
        if flat.ndim != 1 or offsets.ndim != 1 or flat.dtype.kind not in "iu" or offsets.dtype.kind not in "iu":
            raise ValueError(f"{side}: expected flat integer arrays, got {flat.dtype}{flat.shape} "
                             f"and offsets {offsets.dtype}{offsets.shape}")
        if not len(offsets) or offsets[0] != 0 or offsets[-1] != len(flat) or (np.diff(offsets) < 0).any():
            raise ValueError(f"{side}_offsets do not index the {len(flat)} {side} ids")
    if len(ids.src_offsets) != len(ids.tgt_offsets):
        raise ValueError(f"{len(ids.src_offsets) - 1} source vs {len(ids.tgt_offsets) - 1} target sentences")
    corpus = ids.corpus
    if corpus is not None and (corpus.shape != (len(ids),) or corpus.dtype.kind not in "iu"
                               or (len(corpus) and int(corpus.min()) < 0)):
        raise ValueError(f"corpus: expected one corpus number per pair, got {corpus.dtype}{corpus.shape}")
