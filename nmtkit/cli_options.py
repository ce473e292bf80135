"""The options of ``nmtkit translate`` and ``nmtkit serve``, each declared once: a Typer
``Annotated`` type per option (flag, help text), gathered into dataclasses by what they
choose. A command names a group as one parameter (``decode: DecodeFlags``) and
``option_groups`` shows Typer its fields as options; the command receives the dataclass.
Every default comes from ``TranslateOptions`` (which embeds ``DecodeConfig``): one home."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, List, Optional

import typer

from nmtkit.decoding.options import TranslateOptions

DEFAULTS = TranslateOptions()  # one home for every translate default: DecodeConfig and TranslateOptions


def decode_flag(setting: str, text: str, *short: str):
    """A decode flag, unset unless given: the model's saved setting (else DecodeConfig's) applies then."""
    return typer.Option("--" + setting.replace("_", "-"), *short, show_default=False,
                        help=f"{text}. Default: the model's (from its recipe), else {getattr(DEFAULTS, setting)}.")


Models = Annotated[List[Path], typer.Option("-m", "--model", help="Model directory (repeat to ensemble; "
                                             "ctranslate2: a directory written by nmtkit export).")]
Input = Annotated[Optional[Path], typer.Option("-i", "--input", help="Source text file (default or -: stdin).")]
Output = Annotated[Optional[str], typer.Option(
    "-o", "--output", metavar="<path>", show_default=False,
    help="Output file (default or -: stdout), written atomically; a device or "
    "named pipe is written directly, an open descriptor (/dev/stdout, /dev/fd/N) appended to, "
    "a symbolic link is followed.")]
TargetLang = Annotated[str, typer.Option(
    "--target-lang", metavar="<lang>", show_default=False,
    help="A multilingual model: the language to translate into (puts its tag, e.g. <2es>, before every line; "
    "serve: for requests that name no target_lang).")]


@dataclass
class RunFlags:
    """How the models run: the engine, where and in what precision, into which language."""

    engine: Annotated[str, typer.Option("--engine", help="auto (ctranslate2 for a directory written by nmtkit "
                                        "export, torch otherwise), torch or ctranslate2.")] = DEFAULTS.engine
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")] = DEFAULTS.device
    dtype: Annotated[str, typer.Option("--dtype", help="auto (bf16 on GPUs and on CPUs with bf16 units, float32 "
                                       "elsewhere), float32, bf16, fp16 or int8 (CPU; ctranslate2: its compute type).")] = DEFAULTS.dtype
    target_lang: TargetLang = DEFAULTS.target_lang
    threads: Annotated[int, typer.Option("--threads", help="CPU threads (0: auto, the cores other processes leave "
                                         "free, measured at start; OMP_NUM_THREADS is used where set).")] = DEFAULTS.threads


@dataclass
class DecodeFlags:
    """A recipe's decode settings as flags, None where not given: the model's saved setting
    applies then (``translate_files.resolve_options``)."""

    beam_size: Annotated[Optional[int], decode_flag("beam_size", "Beam size (1: greedy)", "-b")] = None
    lenpen: Annotated[Optional[float], decode_flag(
        "lenpen", "GNMT length penalty alpha; 0 ranks by raw log-probability, larger favours longer outputs")] = None
    max_len_a: Annotated[Optional[float], decode_flag("max_len_a", "Output length limit a*|x|+b: a")] = None
    max_len_b: Annotated[Optional[int], decode_flag("max_len_b", "Output length limit a*|x|+b: b")] = None
    min_len: Annotated[Optional[int], decode_flag("min_len", "Minimum output length in pieces (EOS blocked before)")] = None
    batch_tokens: Annotated[Optional[int], decode_flag(
        "batch_tokens", "Source tokens x beam per batch (serve: per model call; waiting requests are collected "
        "up to it)")] = None
    eos_at_limit: Annotated[Optional[str], decode_flag(
        "eos_at_limit", "The EOS forced at the length limit: scored (its log-probability counts) or free "
        "(it counts 0, as in transformers' generate; an imported MarianMT model's default)")] = None


@dataclass
class FileFlags:
    """What translate reads and writes: the input, the output and the per-line side files."""

    input: Input = None
    output: Output = None
    prefix_file: Annotated[Optional[Path], typer.Option(
        "--prefix-file", show_default=False, help="Target prefixes, one line per input line (a blank line: none): "
        "each output starts with exactly its prefix and goes on from it.")] = None
    constraints: Annotated[Optional[Path], typer.Option(
        "--constraints", show_default=False, help='Terminology constraints, one JSON list of target phrases per '
        'input line (e.g. ["Haus", "rote Katze"]; [] or a blank line: none): each phrase appears in the output '
        "when the length limit leaves room (beam search, torch engine).")] = None


@dataclass
class CallFlags:
    """A translate call's own settings (``TranslateOptions`` fields that are not a recipe's)."""

    nbest: Annotated[int, typer.Option("--nbest", min=1, help="N > 1: exactly N lines per input line, best first, "
        "as INDEX<tab>SCORE<tab>TEXT (INDEX: the input line, from 0; --alignments adds a 4th field). Lines the "
        "search cannot fill (all but the first for an empty input) have an empty text and score -inf.")] = DEFAULTS.nbest
    scores: Annotated[bool, typer.Option("--scores", help="Prefix each line with its score and a tab (with --nbest "
                                         "above 1 always).")] = DEFAULTS.scores
    alignments: Annotated[bool, typer.Option("--alignments", help="Append a tab and Pharaoh alignment pairs "
        "i-j (as fast_align and Moses write them): source word i is aligned to target word j, words split at "
        "whitespace and counted from 0, pairs sorted. Each target piece is aligned to the source piece it attends "
        "to most.")] = DEFAULTS.alignments
    alignment_units: Annotated[str, typer.Option("--alignment-units", help="What --alignments counts: words, or "
        "pieces (SentencePiece pieces; one pair per target piece, in order).")] = DEFAULTS.alignment_units
    sample: Annotated[bool, typer.Option("--sample", help="Sample instead of beam search (for "
                                         "back-translation).")] = DEFAULTS.sample
    topk: Annotated[int, typer.Option("--topk", help="Sampling: keep the k most likely pieces (0: all).")] = DEFAULTS.topk
    topp: Annotated[float, typer.Option("--topp", help="Sampling: nucleus probability mass.")] = DEFAULTS.topp
    temperature: Annotated[float, typer.Option("--temperature", help="Sampling temperature.")] = DEFAULTS.temperature
    seed: Annotated[int, typer.Option("--seed", help="Random seed for sampling.")] = DEFAULTS.seed
    errors: Annotated[str, typer.Option("--errors", help="Invalid UTF-8 input: strict (error) or "
                                        "replace.")] = DEFAULTS.errors
    compile: Annotated[bool, typer.Option("--compile", help="torch.compile the decoder step (needs a C++ compiler "
        "on CPU; the first batches pay the compile time).")] = DEFAULTS.compile
    stream: Annotated[bool, typer.Option("--stream", help="Translate each input line as it arrives and flush its "
        "output at once (always when stdin is a terminal); without it, lines are read and translated "
        "--chunk-lines at a time.")] = DEFAULTS.stream
    chunk_lines: Annotated[int, typer.Option("--chunk-lines", help="Lines read, translated and written at a time; "
        "with -i FILE -o FILE each finished chunk is saved beside the output, so the same command after a crash "
        "continues from the last one.")] = DEFAULTS.chunk_lines
    workers: Annotated[int, typer.Option("--workers", help="Batches searched at once on a CPU, the threads "
        "shared among them, at most one batch per thread (0: auto, one per thread; 1: one batch at a time on every "
        "thread). Faster on several cores; each batch in flight holds its own search memory.")] = DEFAULTS.workers
    max_source_len: Annotated[int, typer.Option("--max-source-len", help="Source pieces read per line; longer lines "
        "are cut with a warning (0: the model's max_positions; a model with a sinusoidal or learned position table "
        "cannot go past it, rope, alibi and rnn can).")] = DEFAULTS.max_source_len


def settings(*groups) -> dict[str, Any]:
    """The fields of option groups as one dict (names are unique across groups)."""
    return {name: value for group in groups for name, value in vars(group).items()}


def option_groups(command: Callable) -> Callable:
    """Let ``command`` take option groups (the dataclasses above) as parameters: Typer sees each
    group's fields, in order, as keyword options; the command receives the group built from them."""
    groups: dict[str, tuple[type, list[str]]] = {}
    params = []
    for param in inspect.signature(command, eval_str=True).parameters.values():
        if not dataclasses.is_dataclass(param.annotation):
            params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))
            continue
        hints = typing.get_type_hints(param.annotation, include_extras=True)
        fields = dataclasses.fields(param.annotation)
        groups[param.name] = (param.annotation, [field.name for field in fields])
        params += [inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[field.name],
                                     default=inspect.Parameter.empty if field.default is dataclasses.MISSING
                                     else field.default) for field in fields]
    names = [param.name for param in params]
    assert len(names) == len(set(names)), f"an option group repeats a name: {names}"

    @functools.wraps(command)
    def run(**given):
        for name, (group, fields) in groups.items():
            given[name] = group(**{field: given.pop(field) for field in fields})
        return command(**given)

    run.__signature__ = inspect.Signature(params)
    run.__annotations__ = {param.name: param.annotation for param in params}  # what typing.get_type_hints reads
    return run
