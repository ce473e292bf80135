"""Subword regularisation: the training sentences segmented anew every epoch by sampling.

- unigram models (Kudo 2018): a word's segmentation is drawn from the model's distribution
  over all its segmentations, each weighted by exp(alpha * its log-probability): forward
  filtering over the word's lattice, backward sampling. Small alpha: close to uniform;
  large alpha: the best segmentation. With ``nbest`` > 1 the draw is limited to the n best
  segmentations of the whole sentence (Kudo's l), which SentencePiece lists for us.
- BPE models (BPE-dropout, Provilkov et al. 2020): the merges are replayed and, at every
  step, each applicable merge is skipped with probability alpha.

The draws are ours, not SentencePiece's: its sampling generator cannot be seeded so that two
processes draw the same. Each sentence has its own generator seeded by a hash of (seed,
epoch, side, sentence index), so an epoch's segmentation is a pure function of the data
position and a resumed run re-draws exactly what an uninterrupted one drew. The sampler
starts from the deterministic ids of train.npz: pieces never cross a word boundary (``▁``),
so each word is re-segmented alone, and its lattice is built once per distinct word. Words
holding an unknown piece or a tag keep their segmentation. Dev and test are never sampled.
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from nmtkit.data.ids import ParallelIds, flatten
from nmtkit.data.vocab import Vocab

WORD_START = "\u2581"  # SentencePiece's "▁": a piece that begins a word starts with it


def sentence_seeds(seed: int, epoch: int, side: int, count: int) -> np.ndarray:
    """uint64 seeds, one per sentence index 0..count-1: a splitmix64 hash of (seed, epoch, side, index)."""
    golden = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):  # wrap-around arithmetic is the hash
        key = _mix(np.uint64(seed) * golden + np.uint64(epoch))
        key = _mix(key * golden + np.uint64(side))
        return _mix(key + (np.arange(count, dtype=np.uint64) + np.uint64(1)) * golden)


def _mix(z):
    """The splitmix64 finaliser (Steele et al. 2014): every input bit affects every output bit."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class PieceTable:
    """The pieces a segmentation may use (no control, unknown, unused or byte pieces)."""

    def __init__(self, vocab: Vocab) -> None:
        sp = vocab.sp
        self.unk = sp.unk_id()
        self.pieces = [sp.IdToPiece(i) for i in range(len(vocab))]
        usable = [i for i in range(len(vocab)) if not (sp.IsControl(i) or sp.IsUnknown(i) or sp.IsUnused(i)
                                                       or sp.IsByte(i))]
        self.ids = {self.pieces[i]: i for i in usable}
        self.scores = {self.pieces[i]: sp.GetScore(i) for i in usable}
        self.longest = max(len(self.pieces[i]) for i in usable)


@dataclass
class UnigramWord:
    """One word's lattice, forward-filtered once: for every end position, the pieces ending
    there with the cumulative probability of choosing each when sampling backwards."""

    choices: list = field(default_factory=list)  # [end] -> (cumulative probabilities, starts, ids)

    @classmethod
    def build(cls, word: str, table: PieceTable, alpha: float) -> "UnigramWord":
        forward = [0.0] + [-math.inf] * len(word)
        arcs: list[list[tuple[int, int, float]]] = [[] for _ in range(len(word) + 1)]
        for end in range(1, len(word) + 1):
            for start in range(max(0, end - table.longest), end):
                piece = word[start:end]
                if piece in table.ids and forward[start] > -math.inf:
                    arcs[end].append((start, table.ids[piece], forward[start] + alpha * table.scores[piece]))
            forward[end] = _logsumexp([weight for _, _, weight in arcs[end]])
        made = cls()
        for end in range(len(word) + 1):
            total, cumulative = 0.0, []
            for _, _, weight in arcs[end]:
                total += math.exp(weight - forward[end])
                cumulative.append(total)
            made.choices.append(([c / total for c in cumulative] if cumulative else [],
                                 [start for start, _, _ in arcs[end]], [i for _, i, _ in arcs[end]]))
        return made

    def sample(self, rng: random.Random) -> list[int]:
        ids, end = [], len(self.choices) - 1
        while end > 0:
            cumulative, starts, piece_ids = self.choices[end]
            k = min(bisect.bisect_left(cumulative, rng.random()), len(cumulative) - 1)
            ids.append(piece_ids[k])
            end = starts[k]
        return ids[::-1]


def _logsumexp(values: list[float]) -> float:
    if not values:
        return -math.inf
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


@dataclass
class BpeWord:
    """One word's characters, merged again for every draw with some merges dropped."""

    chars: list[str]
    table: PieceTable
    dropout: float

    def sample(self, rng: random.Random) -> list[int]:
        symbols = list(self.chars)
        while len(symbols) > 1:
            best, best_score = -1, -math.inf
            for i in range(len(symbols) - 1):  # the highest-scoring applicable merge that is not dropped
                score = self.table.scores.get(symbols[i] + symbols[i + 1])
                if score is not None and rng.random() >= self.dropout and score > best_score:
                    best, best_score = i, score
            if best < 0:
                break
            symbols[best:best + 2] = [symbols[best] + symbols[best + 1]]
        return [self.table.ids[s] for s in symbols]


class FixedWord:
    """A word that keeps its one segmentation (it holds an unknown piece, or has no other)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def sample(self, rng: random.Random) -> list[int]:
        return self.ids


class SideSampler:
    """Samples one side (source or target) of the training data."""

    def __init__(self, vocab: Vocab, kind: str, alpha: float, nbest: int, sentences: Sequence[np.ndarray],
                 kept: Sequence[str] = ()) -> None:
        self.vocab, self.table, self.kind, self.alpha, self.nbest = vocab, PieceTable(vocab), kind, alpha, nbest
        # words holding one of these ids keep their segmentation: the unknown piece, and tags
        # (<bt>, <2es>), which a draw over their characters could spell out
        self.fixed = {self.table.unk} | {self.table.ids[piece] for piece in kept if piece in self.table.ids}
        self.words: dict[tuple[int, ...], object] = {}
        self.sentences = [self._word_keys(ids) for ids in sentences]

    def _word_keys(self, ids: np.ndarray) -> list[tuple[int, ...]]:
        """The sentence's words as tuples of ids; each distinct word gets its sampler once."""
        words, current = [], []
        for piece_id in ids.tolist():
            if current and self.table.pieces[piece_id].startswith(WORD_START):
                words.append(tuple(current))
                current = []
            current.append(piece_id)
        if current:
            words.append(tuple(current))
        for key in words:
            if key not in self.words:
                self.words[key] = self._word_sampler(key)
        return words

    def _word_sampler(self, key: tuple[int, ...]):
        if self.fixed.intersection(key):
            return FixedWord(list(key))
        text = "".join(self.table.pieces[i] for i in key)
        if self.kind == "bpe":
            usable = len(text) > 1 and all(char in self.table.ids for char in text)
            return BpeWord(list(text), self.table, self.alpha) if usable else FixedWord(list(key))
        word = UnigramWord.build(text, self.table, self.alpha)
        branching = any(len(cumulative) > 1 for cumulative, _, _ in word.choices)
        return word if branching and word.choices[-1][0] else FixedWord(list(key))

    def sample(self, index: int, seed: int) -> list[int]:
        rng = random.Random(seed)
        if self.nbest > 1 and self.kind == "unigram":
            return self._sample_nbest(index, rng)
        ids: list[int] = []
        for key in self.sentences[index]:
            ids.extend(self.words[key].sample(rng))
        return ids

    def given(self, index: int) -> list[int]:
        """The sentence's deterministic segmentation (as prepared)."""
        return [i for key in self.sentences[index] for i in key]

    def _sample_nbest(self, index: int, rng: random.Random) -> list[int]:
        """One of the n best segmentations of each run of words between fixed words (an unknown
        piece or a tag; the whole sentence when it has none), chosen with probability ~ exp(alpha *
        log p). Fixed words keep theirs: re-encoded as text, ``<unk>`` would be spelled out."""
        ids: list[int] = []
        run: list[tuple[int, ...]] = []
        for key in [*self.sentences[index], None]:
            if key is not None and not self.fixed.intersection(key):
                run.append(key)
                continue
            if run:
                ids.extend(self._nbest_of(run, rng))
                run = []
            if key is not None:
                ids.extend(key)
        return ids

    def _nbest_of(self, words: list[tuple[int, ...]], rng: random.Random) -> list[int]:
        text = "".join(self.table.pieces[i] for key in words for i in key)
        candidates = self.vocab.sp.NBestEncodeAsIds(text.replace(WORD_START, " ").strip(), self.nbest)
        if not candidates:
            return [i for key in words for i in key]
        weights = [self.alpha * sum(self.vocab.sp.GetScore(i) for i in ids) for ids in candidates]
        top = max(weights)
        return rng.choices(candidates, weights=[math.exp(w - top) for w in weights])[0]


class SubwordSampler:
    """Re-segments the training split of a prepared directory, one epoch at a time."""

    def __init__(self, data: ParallelIds, vocabs: tuple[Vocab, Vocab], kind: str, alpha: float, nbest: int,
                 seed: int, max_positions: int | None = None, tags: Sequence[str] = ()) -> None:
        pairs = [data.pair(i) for i in range(len(data))]
        self.sides = [SideSampler(vocab, kind, alpha, nbest, [pair[side] for pair in pairs], tags)
                      for side, vocab in enumerate(vocabs)]
        self.size, self.seed = len(data), seed
        # a position table's rows (sinusoidal or learned positions): sources up to max_positions
        # pieces, targets one fewer (BOS); a longer draw keeps the prepared segmentation, which
        # training checked to fit, instead of being cut (a cut target + EOS teaches early stops)
        self.limits = (max_positions, max_positions - 1) if max_positions else (None, None)

    def epoch(self, epoch: int) -> ParallelIds:
        """Every training pair segmented by sampling for ``epoch``."""
        flat = []
        for side, sampler in enumerate(self.sides):
            seeds = sentence_seeds(self.seed, epoch, side, self.size).tolist()
            drawn = [sampler.sample(i, seed) for i, seed in enumerate(seeds)]
            limit = self.limits[side]
            if limit is not None:
                drawn = [ids if len(ids) <= limit else sampler.given(i) for i, ids in enumerate(drawn)]
            flat.append(flatten(drawn))
        (src, src_offsets), (tgt, tgt_offsets) = flat
        return ParallelIds(src, src_offsets, tgt, tgt_offsets)
