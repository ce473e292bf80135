"""What a translation run is asked for: the recipe's decode settings (``DecodeConfig``, the one
place their defaults live) plus what only a translate call chooses (device, output format,
sampling, engine). No torch here, so the CLI can take its defaults from these dataclasses.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Union

from nmtkit.config import DECODE_SETTINGS, DecodeConfig
from nmtkit.errors import ConfigError
from nmtkit.limits import range_problem

# every numeric option and the rule it follows: a decode setting shares its recipe key's range
NUMERIC_OPTIONS = {**{name: f"decode.{name}" for name in DECODE_SETTINGS if name != "eos_at_limit"},
                   **{name: f"translate.{name}"
                      for name in ("nbest", "topk", "topp", "temperature", "seed", "chunk_lines", "max_source_len",
                                   "threads", "workers")}}

ENGINES = ("auto", "torch", "ctranslate2")
LANGUAGE = re.compile(r"[A-Za-z0-9_.-]{1,24}")  # what --target-lang names: the xx of a <2xx> tag
ALIGNMENT_UNITS = ("words", "pieces")  # what the i and j of --alignments count
EOS_AT_LIMIT = ("scored", "free")  # decode.eos_at_limit: how the EOS forced at the length limit counts


def language_problem(lang: str, name: str = "--target-lang") -> str:
    """Why ``lang`` (given as ``name``) cannot name a target-language tag; "" when it can, or is ""."""
    if lang and not LANGUAGE.fullmatch(lang):
        return f"{name} must be a language code such as es or pt_BR, not {lang!r}"
    return ""


@dataclass
class TranslateOptions(DecodeConfig):
    """``DecodeConfig`` (beam_size, lenpen, max_len_a/b, min_len, batch_tokens, eos_at_limit) plus the settings
    below, which are a translate call's own (an output format is not a recipe's to choose); nbest > 1
    writes exactly nbest "index \\t score \\t text" lines per input line, best first."""

    nbest: int = 1  # > 1: "index \t score \t text" lines, best first
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bf16 | fp16 | int8 (CPU: int8 Linear layers, models/quantize.py)
    scores: bool = False  # prefix "score \t"
    alignments: bool = False  # append "\t i-j ..." (Pharaoh: source i aligned to target j)
    alignment_units: str = "words"  # words (whitespace words of input and output) | pieces (SentencePiece)
    sample: bool = False  # sample instead of beam search
    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0
    seed: int = 1
    errors: str = "strict"  # invalid UTF-8: strict (error) | replace
    engine: str = "auto"  # auto (from the model directory) | torch | ctranslate2
    compile: bool = False  # torch.compile the decoder step (torch engine)
    target_lang: str = ""  # a multilingual model: translate into this language (its tag <2xx> goes first)
    stream: bool = False  # each line translated and flushed as it arrives (always for a terminal stdin)
    chunk_lines: int = 10_000  # lines read, translated, written (and saved, for -i FILE -o FILE) at a time
    max_source_len: int = 0  # source pieces read per line (0: the model's max_positions; a table's is the most)
    threads: int = 0  # CPU threads (0: auto, only the cores other processes leave free; runtime/threads.py)
    workers: int = 0  # CPU batches searched at once, the threads shared among them (0: one per thread; parallel.py)

    @classmethod
    def from_decode(cls, decode: DecodeConfig, **settings) -> "TranslateOptions":
        """A recipe's decode section with ``settings`` (device, a different beam, ...) on top."""
        return cls(**{**dataclasses.asdict(decode), **settings})

    def validate(self) -> None:
        """Raise ConfigError for settings a user can get wrong."""
        problems = []
        if self.engine not in ENGINES:
            problems.append(f"--engine must be auto, torch or ctranslate2, not {self.engine!r}")
        if self.compile and self.engine == "ctranslate2":
            problems.append("--compile applies to the torch engine only")
        if self.errors not in ("strict", "replace"):
            problems.append(f"--errors must be strict or replace, not {self.errors!r}")
        if self.alignment_units not in ALIGNMENT_UNITS:
            problems.append(f"--alignment-units must be words or pieces, not {self.alignment_units!r}")
        if self.dtype not in ("auto", "float32", "bf16", "fp16", "int8"):
            problems.append(f"--dtype must be auto, float32, bf16, fp16 or int8, not {self.dtype!r}")
        if self.eos_at_limit not in EOS_AT_LIMIT:
            problems.append(f"--eos-at-limit must be scored or free, not {self.eos_at_limit!r}")
        if language_problem(self.target_lang):
            problems.append(language_problem(self.target_lang))
        for name, key in NUMERIC_OPTIONS.items():  # the recipe's ranges (nmtkit/limits.py), named as flags
            problem = range_problem(key, getattr(self, name), "--" + name.replace("_", "-"))
            if problem:
                problems.append(problem)
        if not problems and not self.sample and self.nbest > self.beam_size:
            problems.append(f"--nbest {self.nbest} needs --beam-size >= {self.nbest}")
        if problems:
            raise ConfigError("; ".join(problems))


CALL_DEFAULTS = TranslateOptions()  # where SearchSettings reads its defaults: one home, not restated


@dataclass(frozen=True)
class SearchSettings:
    """Everything a search (beam, greedy, sampling) is asked for, as one value bound once:
    the beam and length rules of ``DecodeConfig`` and the n-best and sampling settings of
    ``TranslateOptions``, whose defaults these are. ``need_attn``: collect attention for
    alignments; ``seed`` seeds sampling when no generator is given."""

    beam_size: int = CALL_DEFAULTS.beam_size
    nbest: int = CALL_DEFAULTS.nbest
    lenpen: float = CALL_DEFAULTS.lenpen
    max_len_a: float = CALL_DEFAULTS.max_len_a
    max_len_b: int = CALL_DEFAULTS.max_len_b
    min_len: int = CALL_DEFAULTS.min_len
    need_attn: bool = CALL_DEFAULTS.alignments
    topk: int = CALL_DEFAULTS.topk
    topp: float = CALL_DEFAULTS.topp
    temperature: float = CALL_DEFAULTS.temperature
    seed: int = CALL_DEFAULTS.seed
    eos_at_limit: str = CALL_DEFAULTS.eos_at_limit  # "free": the EOS forced at the length limit scores 0

    @classmethod
    def of(cls, settings: Union[DecodeConfig, TranslateOptions], **overrides) -> "SearchSettings":
        """The search settings a recipe's decode section or a translate call's options hold
        (``alignments`` asks for attention), with ``overrides`` on top."""
        own = {f.name: getattr(settings, f.name) for f in dataclasses.fields(cls) if hasattr(settings, f.name)}
        if isinstance(settings, TranslateOptions):
            own["need_attn"] = settings.alignments
        return cls(**{**own, **overrides})
