"""The translation front end: text lines in, text lines out, always one for one, in order.

Lines are encoded with the source SentencePiece model, sorted by length into token-budgeted
batches, searched by an engine, put back in input order and detokenised. Empty and
whitespace-only lines give empty translations without running the model; lines over the
model's positions are truncated (one warning counts them). Files and streams:
``nmtkit/translation.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from nmtkit.decoding.batching import pad_sources, token_batches
from nmtkit.decoding.search import Hypothesis
from nmtkit.decoding.torch_engine import TorchEngine
from nmtkit.errors import ConfigError

# characters that would split an output line for some reader (tab separates fields)
_LINE_BREAKS = str.maketrans({c: " " for c in "\t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


@dataclass
class TranslateOptions:
    beam_size: int = 4
    lenpen: float = 0.6  # GNMT alpha; 0 ranks by raw log-probability, larger favours longer outputs
    max_len_a: float = 1.0  # output limit a * |x| + b pieces
    max_len_b: int = 50
    min_len: int = 1
    nbest: int = 1  # > 1: "index \t score \t text" lines, best first
    batch_tokens: int = 6000  # source pieces x beam (or samples) per batch
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bf16 | fp16 | int8 (CPU: Linear layers quantised dynamically)
    scores: bool = False  # prefix "score \t"
    alignments: bool = False  # append "\t i-j ..." (source piece i, target piece j)
    sample: bool = False  # sample instead of beam search
    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0
    seed: int = 1
    errors: str = "strict"  # invalid UTF-8: strict (error) | replace
    engine: str = "torch"  # torch | ctranslate2

    def validate(self) -> None:
        """Raise ConfigError for settings a user can get wrong."""
        problems = []
        if self.engine not in ("torch", "ctranslate2"):
            problems.append(f"--engine must be torch or ctranslate2, not {self.engine!r}")
        if self.errors not in ("strict", "replace"):
            problems.append(f"--errors must be strict or replace, not {self.errors!r}")
        if self.dtype not in ("auto", "float32", "bf16", "fp16", "int8"):
            problems.append(f"--dtype must be auto, float32, bf16, fp16 or int8, not {self.dtype!r}")
        if self.beam_size < 1 or self.nbest < 1 or self.batch_tokens < 1:
            problems.append("--beam-size, --nbest and --batch-tokens must be at least 1")
        if not self.sample and self.nbest > self.beam_size:
            problems.append(f"--nbest {self.nbest} needs --beam-size >= {self.nbest}")
        if self.min_len < 0 or self.max_len_b < 0 or self.max_len_a < 0:
            problems.append("--min-len, --max-len-a and --max-len-b must not be negative")
        if self.sample and (self.temperature <= 0 or not 0 < self.topp <= 1 or self.topk < 0):
            problems.append("sampling needs --temperature > 0, 0 < --topp <= 1 and --topk >= 0")
        if problems:
            raise ConfigError("; ".join(problems))


class Translator:
    """Text lines to output lines, one for one, with any engine (``torch_engine.py`` says what
    one offers): encodes, truncates to the engine's positions (counted in ``truncated``
    across calls, so a stream warns once), batches by tokens, searches, restores the order
    and formats. The caller chooses the engine."""

    def __init__(self, engine, options: TranslateOptions) -> None:
        self.engine, self.options = engine, options
        self.src_vocab, self.tgt_vocab = engine.src_vocab, engine.tgt_vocab
        self.max_positions = engine.max_positions  # longer inputs are truncated
        self.truncated = 0

    def translate(self, lines: Sequence[str], first_index: int = 0,
                  progress: Optional[Callable[[int], None]] = None) -> list[str]:
        """One output string per line (with nbest > 1 it holds nbest lines joined by newlines)."""
        opts = self.options
        sources = self.encode(lines)
        todo = [i for i, ids in enumerate(sources) if ids]
        results: dict[int, list[Hypothesis]] = {}
        rows = opts.nbest if opts.sample else opts.beam_size
        for batch in token_batches([len(sources[i]) for i in todo], opts.batch_tokens, rows):
            positions = [todo[i] for i in batch]
            src, src_mask = pad_sources([sources[i] for i in positions], self.engine.device)
            with torch.inference_mode():
                for position, hyps in zip(positions, self.engine.search(src, src_mask)):
                    results[position] = hyps
            if progress is not None:
                progress(len(positions))
        if progress is not None and len(lines) > len(todo):
            progress(len(lines) - len(todo))  # empty lines count as done
        return [self.format(first_index + i, results.get(i), len(sources[i])) for i in range(len(lines))]

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Source ids per line ([] for blank lines), cut to the model's positions."""
        sources = self.src_vocab.encode_batch([line if line.strip() else "" for line in lines])
        limit = self.max_positions
        if limit is not None:
            self.truncated += sum(len(ids) > limit for ids in sources)
            sources = [ids[:limit] for ids in sources]
        return sources

    def format(self, index: int, hyps: Optional[list[Hypothesis]], src_pieces: int) -> str:
        """The output line(s) of input ``index``; empty inputs get an empty text, score 0."""
        o = self.options
        fields = []
        for hyp in hyps or [Hypothesis([], 0.0, 0.0)]:
            text = self.tgt_vocab.decode(hyp.tokens).translate(_LINE_BREAKS)
            columns = [str(index), f"{hyp.score:.4f}", text] if o.nbest > 1 else \
                [f"{hyp.score:.4f}", text] if o.scores else [text]
            if o.alignments:
                columns.append(alignment_pairs(hyp, src_pieces))
            fields.append("\t".join(columns))
        return "\n".join(fields)


def alignment_pairs(hyp: Hypothesis, src_pieces: int) -> str:
    """"i-j" for every target piece j, i its most attended source piece."""
    if hyp.attention is None or not hyp.tokens or src_pieces == 0:
        return ""
    best = hyp.attention[:, :src_pieces].argmax(1).tolist()
    return " ".join(f"{i}-{j}" for j, i in enumerate(best))


def translate_lines(loaded_models: Sequence, lines: Sequence[str], options: TranslateOptions,
                    console=None) -> list[str]:
    """Translate ``lines`` in memory with loaded models (``nmtkit.modeldir.LoadedModel``);
    one string per line, in order. Warns on ``console`` if lines were truncated."""
    options.validate()
    translator = Translator(TorchEngine(loaded_models, options), options)
    out = translator.translate(lines)
    warn_truncated(translator, console)
    return out


def warn_truncated(translator: Translator, console) -> None:
    if translator.truncated and console is not None:
        console.warn(f"{translator.truncated} input line(s) longer than the model's "
                     f"{translator.max_positions} positions were truncated")
