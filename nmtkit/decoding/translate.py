"""The translation front end: text lines in, text lines out, always one for one, in order.

Lines are read as bytes and decoded one by one (invalid UTF-8 names its line), encoded with
the source SentencePiece model, sorted by length into token-budgeted batches, searched,
put back in input order and detokenised. Empty and whitespace-only lines give empty
translations without running the model; lines over the model's positions are truncated
(one warning counts them). Input is streamed in chunks, and a file output is written
atomically, so a failure leaves no partial file. stdout receives translations only.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Optional, Sequence

import torch

from nmtkit.decoding.batching import pad_sources, token_batches
from nmtkit.decoding.ensemble import EnsembleModel
from nmtkit.decoding.search import Hypothesis, beam_search, greedy_search, sample
from nmtkit.device import resolve_device, resolve_dtype
from nmtkit.errors import ConfigError, DataError, NmtkitError
from nmtkit.files import atomic_open, decode_line, sha256_file

CHUNK_LINES = 10_000  # lines read, translated and written at a time
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


def inference_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype weights are cast to for translation: ``auto`` is bf16 on a CUDA device that
    has it and float32 on CPU (where bf16 must be asked for)."""
    if name == "auto" and device.type == "cpu":
        return torch.float32
    if name == "int8":  # float32 weights, then quantised (Translator)
        if device.type != "cpu":
            raise ConfigError("--dtype int8 runs on CPU only (use --device cpu)")
        return torch.float32
    return resolve_dtype(name, device)


def load_models(model_dirs: Sequence[str], device: torch.device) -> list:
    """Load model directories for translation; an ensemble must share both vocabularies."""
    from nmtkit.models.store import load_model_dir

    if not model_dirs:
        raise ConfigError("no model given (-m MODEL_DIR)")
    loaded = [load_model_dir(path, device=device) for path in model_dirs]
    first = loaded[0]
    for path, item in zip(model_dirs[1:], loaded[1:]):
        for side in ("src_vocab", "tgt_vocab"):
            if sha256_file(getattr(item, side).path) != sha256_file(getattr(first, side).path):
                raise ConfigError(f"cannot ensemble {path} with {model_dirs[0]}: their "
                                  f"{side.replace('_vocab', '')} SentencePiece models differ")
    return loaded


class Translator:
    """Loaded models plus options; ``translate`` maps lines to output lines and counts
    truncated inputs in ``truncated`` across calls (so a stream warns once). The models are
    moved, in place, to ``options.device`` and ``options.dtype`` and set to eval mode."""

    def __init__(self, loaded_models: Sequence, options: TranslateOptions) -> None:
        if not loaded_models:
            raise ConfigError("no model given (-m MODEL_DIR)")
        self.device = resolve_device(options.device)
        self.dtype = inference_dtype(options.dtype, self.device)
        models = [item.model.to(device=self.device, dtype=self.dtype).eval() for item in loaded_models]
        if options.dtype == "int8":
            from nmtkit.models.quantize import quantize_int8

            models = [quantize_int8(model) for model in models]
        self.model = models[0] if len(models) == 1 else EnsembleModel(models)
        self.max_positions = self.model.max_positions  # longer inputs are truncated
        self.src_vocab, self.tgt_vocab = loaded_models[0].src_vocab, loaded_models[0].tgt_vocab
        self.options = options
        self.truncated = 0
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(options.seed)

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
            src, src_mask = pad_sources([sources[i] for i in positions], self.device)
            with torch.inference_mode():
                for position, hyps in zip(positions, self.search(src, src_mask)):
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

    def search(self, src, src_mask) -> list[list[Hypothesis]]:
        o = self.options
        common = dict(lenpen=o.lenpen, max_len_a=o.max_len_a, max_len_b=o.max_len_b, min_len=o.min_len,
                      need_attn=o.alignments)
        if o.sample:
            return sample(self.model, src, src_mask, topk=o.topk, topp=o.topp, temperature=o.temperature,
                          nbest=o.nbest, generator=self.generator, **common)
        if o.beam_size == 1:
            return greedy_search(self.model, src, src_mask, **common)
        return beam_search(self.model, src, src_mask, o.beam_size, nbest=o.nbest, **common)

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
    """Translate ``lines`` in memory with loaded models (``nmtkit.models.store.LoadedModel``);
    one string per line, in order. Warns on ``console`` if lines were truncated."""
    options.validate()
    translator = Translator(loaded_models, options)
    out = translator.translate(lines)
    _warn_truncated(translator, console)
    return out


def _warn_truncated(translator: Translator, console) -> None:
    if translator.truncated and console is not None:
        console.warn(f"{translator.truncated} input line(s) longer than the model's "
                     f"{translator.max_positions} positions were truncated")


def read_chunks(handle: IO[bytes], name: str, errors: str, size: int = CHUNK_LINES) -> Iterator[list[str]]:
    """Lines of a binary stream, decoded and stripped of \\n / \\r\\n, ``size`` at a time."""
    chunk = []
    for lineno, raw in enumerate(handle, 1):
        chunk.append(decode_line(raw, name, lineno, errors))
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def count_lines(path: Path, errors: str) -> int:
    """Lines in ``path``; in strict mode also fails fast on the first invalid UTF-8 line."""
    total = 0
    with open(path, "rb") as handle:
        for total, raw in enumerate(handle, 1):
            if errors == "strict":
                decode_line(raw, str(path), total)
    return total


def translate_file(model_dirs: Sequence[str], input_path: Optional[str | Path], output_path: Optional[str | Path],
                   options: TranslateOptions, console) -> None:
    """Translate a file (or stdin) to a file (atomically, with a progress bar) or stdout."""
    options.validate()
    if options.engine == "ctranslate2":
        _translate_file_ct2(model_dirs, input_path, output_path, options, console)
        return

    def make_translator() -> Translator:
        device = resolve_device(options.device)
        inference_dtype(options.dtype, device)  # bad settings fail before the models load
        translator = Translator(load_models(model_dirs, device), options)
        dtype = "int8" if options.dtype == "int8" else str(translator.dtype).replace("torch.", "")
        console.detail(f"translating on {device} in {dtype}")
        return translator

    run_file(make_translator, input_path, output_path, options, console)


def run_file(make_translator: Callable[[], "Translator"], input_path: Optional[str | Path],
             output_path: Optional[str | Path], options: TranslateOptions, console) -> None:
    """The file/stdin I/O every engine shares: check the input, then build the translator
    (``make_translator()``: anything with Translator's ``translate``, ``options``,
    ``truncated`` and ``max_positions``) and stream lines through it."""
    total = None
    if input_path is not None:
        input_path = Path(input_path)
        if not input_path.is_file():
            raise DataError(f"input file not found: {input_path}")
        total = count_lines(input_path, options.errors)
    translator = make_translator()
    source = open(input_path, "rb") if input_path is not None else sys.stdin.buffer
    name = str(input_path) if input_path is not None else "<stdin>"
    try:
        if output_path is None:
            _stream(translator, source, name, sys.stdout.buffer, None)
        else:
            with atomic_open(output_path, "wb") as out, console.progress() as bar:
                task = bar.add_task("translating", total=total)
                _stream(translator, source, name, out, lambda n: bar.advance(task, n))
    finally:
        if input_path is not None:
            source.close()
    _warn_truncated(translator, console)


def _stream(translator: Translator, source: IO[bytes], name: str, out: IO[bytes],
            progress: Optional[Callable[[int], None]]) -> None:
    done = 0
    for chunk in read_chunks(source, name, translator.options.errors):
        lines = translator.translate(chunk, first_index=done, progress=progress)
        out.write("".join(line + "\n" for line in lines).encode("utf-8"))
        out.flush()
        done += len(chunk)


def _translate_file_ct2(model_dirs, input_path, output_path, options, console) -> None:
    import importlib

    try:
        ct2_engine = importlib.import_module("nmtkit.decoding.ct2_engine")  # comes with `nmtkit export`
    except ModuleNotFoundError as err:
        if err.name != "nmtkit.decoding.ct2_engine":
            raise
        raise NmtkitError("engine ctranslate2 needs an exported model; see nmtkit export") from None
    ct2_engine.translate_file(model_dirs, input_path, output_path, options, console)
