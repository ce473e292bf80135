"""The training corpora of a recipe read as one stream for ``prepare``: ``data`` itself (one
untagged corpus) or each of ``data.corpora`` in order, with its tag before every source sentence.

Each corpus is read as a whole source (its own dev and test too), and all of them pass through
one ``TextFilter``, so a pair is kept once across corpora (in the first corpus that has it) and
no corpus trains on a dev or test pair of any corpus, either way round (a reverse-direction
corpus holds the test verses reversed). The filter sees the text without tags; the tag is put
before the kept source sentence. Dev and test are the first corpus's, its tag on their sources,
so a multilingual model is validated as it will be asked to translate.
"""
from __future__ import annotations

import contextlib
import itertools
import re
from typing import Callable, Iterator, Optional

from nmtkit.data.clean import BATCH_PAIRS, TextFilter
from nmtkit.data.sources import files, fingerprint, read_corpus
from nmtkit.data.sources.corpus import Corpus, Pair
from nmtkit.data.vocab import with_tag
from nmtkit.errors import ConfigError, DataError


def read_source(source, first: bool, index: Optional[int] = None, split_seed: int = 0) -> Corpus:
    """``source`` read, its dev and test re-drawn when ``split_seed`` > 0; ``index``: its place in
    data.corpora, named by its errors."""
    with _named(index):
        return files.read(source, ("train",)) if source.training_only(first) else read_corpus(source, split_seed)


def source_fingerprint(source, first: bool, index: Optional[int] = None) -> dict:
    """What reading ``source`` depends on (see ``nmtkit.data.sources``)."""
    with _named(index):
        return files.fingerprint(source, ("train",)) if source.training_only(first) else fingerprint(source)


_DATA_KEY = re.compile(r"(?<![\w./'\"-])data\.(?!corpora\b)")  # a key, not part of a path or a quoted value


@contextlib.contextmanager
def _named(index: Optional[int]) -> Iterator[None]:
    """Errors of the sources name their keys as ``data.KEY``; for the corpus at ``index`` of
    data.corpora the key a user must fix is ``data.corpora[index].KEY``."""
    try:
        yield
    except (ConfigError, DataError) as error:
        message = str(error) if index is None else _DATA_KEY.sub(f"data.corpora[{index}].", str(error))
        if message == str(error):
            raise
        raise type(error)(message) from error


class CorpusStream:
    """The recipe's corpora, read; ``train()`` streams their cleaned, tagged training pairs and
    fills ``counts`` (per corpus: what each text rule dropped, and what it kept)."""

    def __init__(self, data) -> None:
        self.sources = data.training_sources()
        indexed = bool(data.corpora)
        self.corpora = [read_source(source, first=i == 0, index=i if indexed else None, split_seed=data.split_seed)
                        for i, source in enumerate(self.sources)]
        self.tags = sorted({source.tag for source in self.sources if source.tag})
        for source, corpus in zip(self.sources, self.corpora):
            for src, tgt in corpus.dev + corpus.test:
                self._check_untagged(src, tgt, source.name)
        first, tag = self.corpora[0], self.sources[0].tag
        self.dev, self.test = ([(with_tag(src, tag), tgt) for src, tgt in pairs] for pairs in (first.dev, first.test))
        heldout = [pair for corpus in self.corpora for pair in corpus.dev + corpus.test]
        if len(self.corpora) > 1:
            heldout += [(tgt, src) for src, tgt in heldout]
        self.filter = TextFilter(dedup=data.clean.dedup, heldout=heldout)
        # every later corpus's own test set, tagged, so `nmtkit run` scores each direction or domain
        self.other_tests = {source.name: [(with_tag(src, source.tag), tgt) for src, tgt in corpus.test]
                            for source, corpus in zip(self.sources[1:], self.corpora[1:]) if corpus.test}
        self.counts: list[dict] = []

    @property
    def name(self) -> str:
        """What the dev and test sets come from."""
        return self.sources[0].source if len(self.sources) == 1 else f"{self.sources[0].name} corpus"

    @property
    def provenance(self) -> dict:
        if len(self.sources) == 1:
            return self.corpora[0].provenance
        return {source.name: corpus.provenance for source, corpus in zip(self.sources, self.corpora)}

    @property
    def total(self) -> Optional[int]:
        """Training pairs to read, when every source knows its size (for the progress bar)."""
        sizes = []
        for source, corpus in zip(self.sources, self.corpora):
            size = corpus.train_size
            if source.max_train_pairs > 0:
                size = min(size or source.max_train_pairs, source.max_train_pairs)
            sizes.append(size)
        return None if None in sizes else sum(sizes)

    def train(self, advance: Callable[[int], None] = lambda n: None) -> Iterator[Pair]:
        for source, corpus in zip(self.sources, self.corpora):
            pairs = corpus.train
            if source.max_train_pairs > 0:
                pairs = itertools.islice(pairs, source.max_train_pairs)
            before, kept = dict(self.filter.counts), 0
            for src, tgt in self.filter(_counting(pairs, advance)):
                self._check_untagged(src, tgt, source.name)
                kept += 1
                yield with_tag(src, source.tag), tgt
            dropped = {rule: count - before[rule] for rule, count in self.filter.counts.items()}
            self.counts.append({"name": source.name, "source": source.source, "tag": source.tag, **dropped,
                                "kept": kept})


    def _check_untagged(self, src: str, tgt: str, name: str) -> None:
        """A DataError when a corpus tag occurs in the text itself: SentencePiece keeps a reserved
        piece whole wherever it appears, so every such occurrence would encode as the tag and
        the model could not tell the data's word from the corpus it marks."""
        for tag in self.tags:
            if tag in src or tag in tgt:
                raise DataError(f"the corpus tag {tag!r} occurs in the text of corpus {name} "
                                f"({(src if tag in src else tgt)[:60]!r}): it would encode as the tag there; "
                                "choose a tag the data does not hold (one in angle brackets, such as <bible>, rarely occurs in text)")


def _counting(items, advance: Callable[[int], None]) -> Iterator:
    """``items``, with ``advance`` told of them a batch at a time (a progress bar per item is slow)."""
    items = iter(items)
    while batch := list(itertools.islice(items, BATCH_PAIRS)):
        advance(len(batch))
        yield from batch
