"""SentencePiece encoding of a stream of sentence pairs for ``prepare``: chunks spread over
worker processes, results as compact numpy arrays, in order, a bounded number in flight, written
into a split's id file as they come (``encode_split``).

The pairs come as the raw lines of two text files nmtkit wrote itself (UTF-8, every line break
inside a sentence made a space): the main process only reads and joins bytes, the workers decode
them, and the lines kept are written back as they were read, never decoded and encoded again."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from nmtkit.data.ids import SplitWriter
from nmtkit.data.mapped_vocab import open_vocab
from nmtkit.data.vocab import Vocab
from nmtkit.errors import DataError
from nmtkit.specials import UNK

Lines = tuple[Iterable[bytes], Iterable[bytes]]  # source and target lines, each ending in a newline


@dataclass
class EncodedPairs:
    """A chunk of sentence pairs, as their raw lines, and their ids: per side one flat array and
    each sentence's length."""

    src_lines: list[bytes]
    tgt_lines: list[bytes]
    src: np.ndarray  # int32 [tokens]
    src_lengths: np.ndarray  # int64 [len(pairs)]
    tgt: np.ndarray
    tgt_lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.src_lines)

    def select(self, keep: np.ndarray) -> "EncodedPairs":
        """The pairs where ``keep`` is true."""
        return EncodedPairs(list(itertools.compress(self.src_lines, keep)),
                            list(itertools.compress(self.tgt_lines, keep)),
                            self.src[np.repeat(keep, self.src_lengths)], self.src_lengths[keep],
                            self.tgt[np.repeat(keep, self.tgt_lengths)], self.tgt_lengths[keep])


class Encoder:
    """SentencePiece encoding of text in chunks, spread over worker processes when it is large.

    Building the Python lists of ids holds the GIL, so SentencePiece's own threads barely
    help (3.1 s instead of 4.3 s for 380k lines); worker processes each build their own
    and send back compact numpy arrays. Small inputs stay in this process, where starting
    workers costs more than it saves.
    """

    MIN_PARALLEL_LINES = 200_000  # below this, starting workers costs more than it saves
    CHUNK_LINES = 5_000

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.pool = None
        if workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))

    def __enter__(self) -> "Encoder":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def encode_pairs(self, models: tuple[Path, Path], lines: Lines) -> Iterator[EncodedPairs]:
        """The pairs of ``lines`` in chunks with their ids (source side by ``models[0]``, target by
        ``models[1]``), in order, with at most two chunks per worker in flight (bounded memory)."""
        names = (str(models[0]), str(models[1]))
        chunks = _chunks(lines, self.CHUNK_LINES)
        if self.pool is None:
            yield from (EncodedPairs(*chunk, *_encode_chunk(names, *map(b"".join, chunk))) for chunk in chunks)
            return
        pending: list = []
        for chunk in chunks:  # one bytes object a side travels to the worker, not a string a sentence
            pending.append((chunk, self.pool.submit(_encode_chunk, names, *map(b"".join, chunk))))
            if len(pending) >= 2 * self.workers:
                done, future = pending.pop(0)
                yield EncodedPairs(*done, *future.result())
        for done, future in pending:
            yield EncodedPairs(*done, *future.result())


_VOCABS: dict[str, Vocab] = {}  # per process: each worker loads a model once


def _chunks(lines: Lines, size: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Up to ``size`` lines of each side at a time, as many of one side as of the other."""
    src, tgt = map(iter, lines)
    while all(chunk := (list(itertools.islice(src, size)), list(itertools.islice(tgt, size)))):
        count = min(map(len, chunk))
        yield chunk[0][:count], chunk[1][:count]


def _encode_chunk(models: tuple[str, str], src: bytes, tgt: bytes) -> tuple[np.ndarray, ...]:
    """(source ids, source lengths, target ids, target lengths) of a chunk of pairs given as the
    joined lines of each side."""
    out = []
    for model, raw in zip(models, (src, tgt)):
        lines = raw.decode("utf-8").removesuffix("\n").split("\n")
        if model not in _VOCABS:
            _VOCABS[model] = open_vocab(model)  # numbered by its id map, when it has one
        ids = _VOCABS[model].encode_batch(lines)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        out += [np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum())), lengths]
    return tuple(out)


class Tally:
    """What encoding a split wrote and dropped: pairs, tokens and <unk> ids per side, the length
    rules' counts, and with several corpora (``corpus_ends``: where each ends) the same per corpus."""

    def __init__(self, corpus_ends=None) -> None:
        self.corpus_ends, self.read = corpus_ends, 0
        self.pairs, self.dropped = 0, {"too_long": 0, "ratio": 0}
        self.tokens, self.unknown = {"src": 0, "tgt": 0}, {"src": 0, "tgt": 0}
        corpora = 0 if corpus_ends is None else len(corpus_ends)
        self.by_corpus = [{"too_long": 0, "ratio": 0, "kept": 0} for _ in range(corpora)]

    def corpus_of(self, count: int):
        """The corpus number of the next ``count`` pairs read (None for one corpus)."""
        start, self.read = self.read, self.read + count
        if self.corpus_ends is None:
            return None
        return np.searchsorted(self.corpus_ends, np.arange(start, self.read), side="right")

    def apply(self, rules, chunk: EncodedPairs, corpus) -> np.ndarray:
        """The keep mask of the length ``rules`` over ``chunk``, what they drop counted per rule
        (and per corpus: the rules look at each pair alone, so corpus by corpus is the same)."""
        keep = np.ones(len(chunk), dtype=bool)
        if rules is None:
            return keep
        for number in [None] if corpus is None else np.unique(corpus).tolist():
            rows = slice(None) if number is None else corpus == number
            keep[rows], dropped = rules(chunk.src_lengths[rows], chunk.tgt_lengths[rows])
            for rule, count in dropped.items():
                self.dropped[rule] += count
                if number is not None:
                    self.by_corpus[number][rule] += count
        return keep

    def add(self, chunk: EncodedPairs, corpus) -> None:
        """Count the pairs of ``chunk`` written (``corpus``: the number of each, or None)."""
        self.pairs += len(chunk)
        for side in ("src", "tgt"):
            ids = getattr(chunk, side)
            self.tokens[side] += len(ids)
            self.unknown[side] += int((ids == UNK).sum())
        if corpus is not None:
            for number, kept in zip(*np.unique(corpus, return_counts=True)):
                self.by_corpus[number]["kept"] += int(kept)


def encode_split(encoder: Encoder, models, lines: Lines, writer: SplitWriter, tally: Tally, rules=None,
                 advance: Callable[[int], None] = lambda n: None) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """The pairs of ``lines`` encoded chunk by chunk into ``writer``, only those ``rules``
    (length_filter) keep; yields the lines of the pairs written, a chunk at a time. A DataError
    when the rules keep none."""
    for chunk in encoder.encode_pairs(models, lines):
        advance(len(chunk))
        corpus = tally.corpus_of(len(chunk))
        keep = tally.apply(rules, chunk, corpus)
        chunk, corpus = chunk.select(keep), None if corpus is None else corpus[keep]
        writer.add(chunk.src, chunk.src_lengths, chunk.tgt, chunk.tgt_lengths, corpus)
        tally.add(chunk, corpus)
        yield chunk.src_lines, chunk.tgt_lines
    if rules is not None and not tally.pairs:  # raised inside both writers: neither file is left behind
        counts = ", ".join(f"{rule} {count:,}" for rule, count in tally.dropped.items())
        raise DataError(f"no training pairs left after the length filters ({counts}; "
                        f"see data.clean.max_len and data.clean.max_ratio)")
