"""``nmtkit translate`` on files and streams: the engine the options name, chosen in one
explicit branch (torch: ``decoding/torch_engine.py``; ctranslate2: ``ctranslate2/engine.py``),
behind the one ``Translator``.

Lines are read as bytes and decoded one by one (invalid UTF-8 names its line) and streamed
in chunks; a file output is written atomically, so a failure leaves no partial file.
stdout receives translations only.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import IO, Callable, Iterator, Optional, Sequence

from nmtkit.compiler import compile_decoder
from nmtkit.config import DecodeConfig
from nmtkit.decoding.guides import Guide, GuideFiles
from nmtkit.decoding.translate import TranslateOptions, Translator, warn_truncated
from nmtkit.errors import ConfigError, DataError
from nmtkit.files import check_readable, decode_line, read_json_dict
from nmtkit.modeldir import CONFIG, saved_decode
from nmtkit.outputs import check_output_file, is_stream, open_output

CHUNK_LINES = 10_000  # lines read, translated and written at a time


def resolve_engine(model_dirs: Sequence[str | Path], engine: str) -> str:
    """The engine for ``model_dirs``: ctranslate2 for exports (``nmtkit export`` writes
    nmtkit.json), torch for model directories; an explicit ``engine`` must agree."""
    from nmtkit.ctranslate2.export import META

    exported = [str(d) for d in model_dirs if (Path(d) / META).is_file()]
    if exported and len(exported) < len(model_dirs):
        raise ConfigError(f"cannot ensemble the CTranslate2 export {exported[0]} with torch model directories")
    if exported and engine == "torch":
        raise ConfigError(f"{exported[0]} is a CTranslate2 export ({META}): leave out --engine or use --engine ctranslate2")
    if engine == "auto":
        return "ctranslate2" if exported else "torch"
    return engine


def saved_decode_settings(model_dir: str | Path) -> DecodeConfig:
    """The decode settings saved with a model directory or a CTranslate2 export (its
    nmtkit.json); the defaults where there are none or the directory cannot be read (loading
    the model then reports that in its own words)."""
    from nmtkit.ctranslate2.export import META

    for name in (CONFIG, META):
        path = Path(model_dir) / name
        meta = read_json_dict(path)
        if meta is not None and "decode" in meta:
            return saved_decode(meta, path)
    return DecodeConfig()


def open_engine(model_dirs: Sequence[str], options: TranslateOptions):
    """The search engine for ``model_dirs`` (``options.engine``, auto: from the directories)."""
    if resolve_engine(model_dirs, options.engine) == "ctranslate2":
        from nmtkit.ctranslate2.engine import CT2Engine

        if len(model_dirs) != 1:
            raise ConfigError("--engine ctranslate2 decodes one model (no ensembles); give one -m")
        return CT2Engine(model_dirs[0], options)
    from nmtkit.decoding.torch_engine import TorchEngine

    return TorchEngine.open(model_dirs, options)


def read_guides(model_dirs: Sequence[str], options: TranslateOptions, side: GuideFiles) -> Optional[list[Guide]]:
    """The guides of ``side``'s files (None without files), and a one-line error where the
    search cannot follow them: constraints need beam search in the torch engine."""
    if side.constraints is not None:
        if options.sample:
            raise ConfigError("--constraints needs beam search, not --sample")
        if resolve_engine(model_dirs, options.engine) == "ctranslate2":
            from nmtkit.ctranslate2.engine import NO_CONSTRAINTS

            raise ConfigError(NO_CONSTRAINTS)
    return side.read(options.errors)


def translate_file(model_dirs: Sequence[str], input_path: Optional[str | Path], output_path: Optional[str | Path],
                   options: TranslateOptions, console, side: GuideFiles = GuideFiles()) -> None:
    """Translate a file (or stdin) to a file (atomically, with a progress bar; a device or
    named pipe directly) or stdout, each line from its prefix and with its constraints when
    ``side`` names files of them. The output, the input and the side files are checked before
    any model loads."""
    options.validate()
    output_path = check_output_file(output_path)
    guides = read_guides(model_dirs, options, side)
    total = None
    if input_path is not None:
        input_path = check_readable(input_path)
        if input_path.is_file():  # a pipe or device can be read only once: no count, no early check
            total = count_lines(input_path, options.errors)
            side.check_count(guides, total, str(input_path))
    engine = open_engine(model_dirs, options)
    if options.compile:
        if not hasattr(engine, "model"):  # --engine auto chose ctranslate2 for an export
            raise ConfigError("--compile applies to the torch engine only, not to a CTranslate2 export")
        engine.model = compile_decoder(engine.model, engine.device, console)
    console.detail(f"translating {engine.description}")
    translator = Translator(engine, options)
    source = open(input_path, "rb") if input_path is not None else sys.stdin.buffer
    name = str(input_path) if input_path is not None else "<stdin>"
    done = [0]  # input lines translated and written
    guides_of = functools.partial(side.slice, guides)
    try:
        if output_path is None:
            _stream(translator, source, name, sys.stdout.buffer, None, done, guides_of)
            side.check_count(guides, done[0], name)
        else:
            with open_output(output_path) as out, console.progress() as bar:
                task = bar.add_task("translating", total=total)
                _stream(translator, source, name, out, lambda n: bar.advance(task, n), done, guides_of)
                side.check_count(guides, done[0], name)  # inside: a short file leaves no output
    except DataError as err:  # undecodable input met while streaming: say what the output holds
        where = "stdout" if output_path is None else str(output_path)
        if done[0] == 0 or (output_path is not None and not is_stream(output_path)):
            raise DataError(f"{err}; nothing was written to {where}") from None
        raise DataError(f"{err}; the {done[0]} line(s) before it were translated and written to {where}") from None
    finally:
        if input_path is not None:
            source.close()
    warn_truncated(translator, console)


def read_chunks(handle: IO[bytes], name: str, errors: str, size: int = CHUNK_LINES) -> Iterator[list[str]]:
    """Lines of a binary stream, decoded and stripped of \\n / \\r\\n, ``size`` at a time.
    Before a DataError for an undecodable line, the lines before it come as a last chunk."""
    chunk = []
    for lineno, raw in enumerate(handle, 1):
        try:
            chunk.append(decode_line(raw, name, lineno, errors))
        except DataError:
            if chunk:
                yield chunk
            raise
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


def _stream(translator: Translator, source: IO[bytes], name: str, out: IO[bytes],
            progress: Optional[Callable[[int], None]], done: list[int],
            guides_of: Callable[[int, int], Optional[list[Guide]]]) -> None:
    """Translate ``source`` chunk by chunk into ``out``, counting finished lines in ``done[0]``;
    ``guides_of(start, count)``: the guides of those lines (None: none)."""
    for chunk in read_chunks(source, name, translator.options.errors, CHUNK_LINES):
        guides = guides_of(done[0], len(chunk))
        lines = translator.translate(chunk, first_index=done[0], progress=progress, guides=guides)
        out.write("".join(line + "\n" for line in lines).encode("utf-8"))
        out.flush()
        done[0] += len(chunk)
