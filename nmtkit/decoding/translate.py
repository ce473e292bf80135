"""The translation front end: text lines in, text lines out, always one for one, in order.

Lines are encoded with the source SentencePiece model, sorted by length into token-budgeted
batches, searched by an engine, put back in input order and detokenised. Empty and
whitespace-only lines give empty translations without running the model; lines over the
model's positions are truncated (one warning counts them). A line may come with a target
prefix and constraints (``guides.py``); a batch holding none of them runs the plain search.
Files and streams: ``nmtkit/translate_files.py``.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

from nmtkit.data.vocab import with_tag
from nmtkit.decoding.alignment import pharaoh, piece_pairs, word_indices, word_pairs
from nmtkit.decoding.batching import token_batches
from nmtkit.decoding.cost import check_search_cost, estimate_search_bytes, split_by_cost
from nmtkit.decoding.guides import Guide, prefixed_text, target_ids
from nmtkit.decoding.hypothesis import Hypothesis
from nmtkit.decoding.options import TranslateOptions
from nmtkit.decoding.parallel import run_side_by_side
from nmtkit.errors import ConfigError
from nmtkit.specials import cut_source

# characters that would split an output line for some reader (tab separates fields)
_LINE_BREAKS = str.maketrans({c: " " for c in "\t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


_CHARS_PER_PIECE = 64  # far above SentencePiece's longest piece (16 characters by default)


class Translator:
    """Text lines to output lines, one for one, with any engine (``torch_engine.py`` says what
    one offers): encodes, truncates to the engine's positions (counted in ``truncated``
    across calls, so a stream warns once), batches by tokens, searches, restores the order
    and formats. The caller chooses the engine."""

    def __init__(self, engine, options: TranslateOptions) -> None:
        self.engine, self.options = engine, options
        self.src_vocab, self.tgt_vocab = engine.src_vocab, engine.tgt_vocab
        # longer inputs are truncated: --max-source-len, else the model's max_positions, and never
        # past a position table (sinusoidal, learned), which has no row for them
        chosen = options.max_source_len or engine.input_limit
        self.input_limit = min(chosen, engine.max_positions) if engine.max_positions else chosen
        self.truncated = 0
        self.tag = target_tag_for(self.src_vocab, options.target_lang)  # "" unless --target-lang

    def translate(self, lines: Sequence[str], first_index: int = 0,
                  progress: Optional[Callable[[int], None]] = None,
                  guides: Optional[Sequence[Guide]] = None) -> list[str]:
        """One output string per line (with nbest > 1 it holds nbest lines joined by newlines);
        ``guides``: a prefix and constraints per line (``decoding/guides.py``)."""
        sources, results = self.hypotheses(lines, progress, guides, first_index)
        prefixes = [guide.prefix for guide in guides] if guides is not None else [""] * len(lines)
        return [self.format(first_index + i, results[i], sources[i], prefixes[i]) for i in range(len(lines))]

    def hypotheses(self, lines: Sequence[str], progress: Optional[Callable[[int], None]] = None,
                   guides: Optional[Sequence[Guide]] = None,
                   first_index: int = 0) -> tuple[list[list[int]], list[list[Hypothesis]]]:
        """Source ids and best-first hypotheses of every line, in input order (a blank line
        gets one empty hypothesis of score 0 without running the model). Lines with
        constraints are searched in batches their cost allows (``cost.py``); a line whose
        constraints cost too much alone is refused before any search runs."""
        opts = self.options
        sources = self.encode(lines)
        targets = target_ids(self.tgt_vocab, guides) if guides is not None and any(guides) else None
        todo = [i for i, ids in enumerate(sources) if ids]
        pieces = self.constraint_pieces(targets, todo, sources, first_index)
        results: dict[int, list[Hypothesis]] = {}
        rows = opts.nbest if opts.sample else opts.beam_size
        calls: list[list[int]] = []  # the lines of each search call
        for batch in token_batches([len(sources[i]) for i in todo], opts.batch_tokens, rows):
            positions = [todo[i] for i in batch]
            calls += [positions] if not any(pieces.get(i) for i in positions) else \
                split_by_cost(positions, lambda group: self.search_cost(group, sources, pieces), pieces.__getitem__)

        def search(positions: list[int]) -> list[list[Hypothesis]]:
            batch = self.engine.batch([sources[i] for i in positions])
            return self.engine.search(*batch, **batch_targets(targets, positions))

        # constrained calls are cut to fit the search-memory bound one at a time: never side by side
        workers = 1 if any(pieces.values()) else self.engine.batch_workers
        for positions, found in run_side_by_side(calls, search, workers):
            results.update(zip(positions, found))
            if progress is not None:
                progress(len(positions))
        if progress is not None and len(lines) > len(todo):
            progress(len(lines) - len(todo))  # empty lines count as done
        return sources, [results.get(i) or [Hypothesis([], 0.0, 0.0)] for i in range(len(lines))]

    def constraint_pieces(self, targets: Optional[tuple[list, list]], todo: Sequence[int],
                          sources: Sequence[Sequence[int]], first_index: int) -> dict[int, int]:
        """The constraint pieces of each line to search (position -> count), every constrained
        line checked against the search bound on its own (``cost.check_search_cost``) before
        any search runs."""
        if targets is None:
            return {}
        pieces = {i: sum(len(phrase) for phrase in targets[1][i]) for i in todo}
        for i in todo:
            if pieces[i]:
                check_search_cost(self.search_cost([i], sources, pieces), f"line {first_index + i + 1}", pieces[i],
                                  self.options.beam_size)
        return pieces

    def search_cost(self, group: Sequence[int], sources: Sequence[Sequence[int]], pieces: dict[int, int]) -> int:
        """Peak bytes of one search call over the lines ``group`` (``cost.estimate_search_bytes``)."""
        o = self.options
        longest = max(len(sources[i]) for i in group)
        output = math.floor(o.max_len_a * longest + o.max_len_b)
        if self.engine.max_positions:
            output = min(output, self.engine.max_positions - 1)
        return estimate_search_bytes(len(group), longest, output, o.nbest if o.sample else o.beam_size,
                                     len(self.tgt_vocab), max(pieces[i] for i in group), o.alignments)

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Source ids per line ([] for blank lines), cut to ``input_limit`` pieces; ids that end in
        EOS (an imported model's: ``MappedVocab``) keep it last, as MarianTokenizer's truncation
        does. A line far longer than that many pieces could hold is cut as text first, so encoding
        a huge line costs memory in proportion to the limit, not to the line."""
        limit = self.input_limit
        chars = limit * _CHARS_PER_PIECE
        cut = [len(line) > chars for line in lines]
        lines = [line[:chars] if long else line for line, long in zip(lines, cut)]
        sources = self.src_vocab.encode_batch([with_tag(line, self.tag) if line.strip() else "" for line in lines])
        self.truncated += sum(len(ids) > limit or long for ids, long in zip(sources, cut))
        return [cut_source(ids, limit) for ids in sources]

    def format(self, index: int, hyps: list[Hypothesis], src_ids: list[int], prefix: str = "") -> str:
        """The output line(s) of input ``index``. With nbest > 1 always exactly nbest lines: when the
        search found fewer hypotheses (always, for an empty input), the rest have an empty text and
        score -inf."""
        o = self.options
        hyps = hyps or [Hypothesis([], 0.0, 0.0)]
        found = len(hyps)
        if o.nbest > 1:
            hyps = hyps[:o.nbest] + [Hypothesis([], float("-inf"), float("-inf"))] * (o.nbest - len(hyps))
        fields = []
        for k, hyp in enumerate(hyps):
            text = self.text(hyp, prefix) if k < found else ""  # a filler holds nothing, not even the prefix
            columns = [str(index), f"{hyp.score:.4f}", text] if o.nbest > 1 else \
                [f"{hyp.score:.4f}", text] if o.scores else [text]
            if o.alignments:
                columns.append(self.alignment(hyp, src_ids, prefix))
            fields.append("\t".join(columns))
        return "\n".join(fields)

    def text(self, hyp: Hypothesis, prefix: str = "") -> str:
        """A hypothesis detokenised as one line (no tabs or line breaks); one searched from a
        target ``prefix`` starts with exactly that text (``guides.prefixed_text``)."""
        text = prefixed_text(self.tgt_vocab, hyp.tokens, prefix) if prefix else self.tgt_vocab.decode(hyp.tokens)
        return text.translate(_LINE_BREAKS)

    def alignment(self, hyp: Hypothesis, src_ids: list[int], prefix: str = "") -> str:
        """Pharaoh pairs of ``hyp`` for the source ``src_ids`` (``alignment.py``): whitespace words
        of the input line and of ``text(hyp, prefix)``, or pieces when ``alignment_units`` is pieces."""
        pairs = piece_pairs(hyp.attention if hyp.tokens else None, len(src_ids))
        if self.options.alignment_units == "pieces":
            return pharaoh(pairs)
        src_words = word_indices(self.src_vocab.surfaces(src_ids, unknown="\ufffd"))  # unknown: source text
        if self.tag:  # the target-language tag is the first word the model saw, not one of the input's
            src_words = [tuple(word - 1 for word in words if word > 0) for words in src_words]
        forced = min(len(self.tgt_vocab.encode(prefix)), len(hyp.tokens)) if prefix else 0  # the prefix's pieces
        tgt_surfaces = self.tgt_vocab.surfaces(hyp.tokens[:forced], unknown="\ufffd") + \
            self.tgt_vocab.surfaces(hyp.tokens[forced:])  # a prefix is written as given, unknown pieces too
        return pharaoh(word_pairs(pairs, src_words, word_indices(tgt_surfaces)))


def batch_targets(targets: Optional[tuple[list, list]], positions: list[int]) -> dict:
    """The search keywords for the lines at ``positions``: their prefixes, their constraints
    (from ``guides.target_ids``), each only when one of these lines has one, so a batch
    without them runs the plain search."""
    if targets is None:
        return {}
    prefixes, constraints = targets
    found = {}
    if any(prefixes[i] for i in positions):
        found["prefixes"] = [prefixes[i] for i in positions]
    if any(constraints[i] for i in positions):
        found["constraints"] = [constraints[i] for i in positions]
    return found


def target_tag_for(src_vocab, lang: str, name: str = "--target-lang") -> str:
    """The tag that asks a multilingual model for ``lang`` (<2es>), which its source vocabulary
    must hold as a reserved piece, as training put it there; "" for no language. Otherwise a
    ConfigError naming the languages it has, ``lang`` given as ``name`` (a flag, a JSON field)."""
    if not lang:
        return ""
    tag = src_vocab.tag_for(lang)  # <2es>; >>spa<< in an imported MarianMT model
    if not src_vocab.is_reserved(tag):
        languages = src_vocab.target_languages()
        known = f"its target languages: {', '.join(languages)}" if languages else \
            "it has none: a model of one direction"
        raise ConfigError(f"{name} {lang}: the model has no target-language tag {tag} ({known})")
    return tag


def translate_lines(loaded_models: Sequence, lines: Sequence[str], options: TranslateOptions,
                    console=None) -> list[str]:
    """Translate ``lines`` in memory with loaded models (``nmtkit.modeldir.LoadedModel``);
    one string per line, in order. Warns on ``console`` if lines were truncated."""
    from nmtkit.decoding.torch_engine import TorchEngine

    options.validate()
    translator = Translator(TorchEngine.from_loaded(loaded_models, options), options)
    out = translator.translate(lines)
    warn_truncated(translator, console)
    return out


def warn_truncated(translator: Translator, console) -> None:
    """One warning for every line cut so far, naming the limit that cut them: --max-source-len
    where it set the limit, else the model's max_positions."""
    if translator.truncated and console is not None:
        chosen = translator.options.max_source_len
        why = f"--max-source-len {chosen}" if chosen == translator.input_limit else \
            "the model's max_positions; --max-source-len sets it for a model without a position table"
        console.warn(f"{translator.truncated} input line(s) longer than {translator.input_limit} pieces were "
                     f"truncated ({why})")
