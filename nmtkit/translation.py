"""``nmtkit translate`` on files and streams: the engine the options name, chosen in one
explicit branch (torch: ``decoding/torch_engine.py``; ctranslate2: ``ctranslate2/engine.py``),
behind the one ``Translator``.

Lines are read as bytes and decoded one by one (invalid UTF-8 names its line) and streamed
in chunks; a file output is written atomically, so a failure leaves no partial file.
stdout receives translations only.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Callable, Iterator, Optional, Sequence

from nmtkit.decoding.translate import TranslateOptions, Translator, warn_truncated
from nmtkit.errors import ConfigError, DataError
from nmtkit.files import atomic_open, decode_line

CHUNK_LINES = 10_000  # lines read, translated and written at a time


def open_engine(model_dirs: Sequence[str], options: TranslateOptions):
    """The search engine ``options.engine`` names, loaded from ``model_dirs``."""
    if options.engine == "ctranslate2":
        from nmtkit.ctranslate2.engine import CT2Engine

        if len(model_dirs) != 1:
            raise ConfigError("--engine ctranslate2 decodes one model (no ensembles); give one -m")
        return CT2Engine(model_dirs[0], options)
    from nmtkit.decoding.torch_engine import TorchEngine

    return TorchEngine.open(model_dirs, options)


def translate_file(model_dirs: Sequence[str], input_path: Optional[str | Path], output_path: Optional[str | Path],
                   options: TranslateOptions, console) -> None:
    """Translate a file (or stdin) to a file (atomically, with a progress bar) or stdout.
    The input is checked before any model loads."""
    options.validate()
    total = None
    if input_path is not None:
        input_path = Path(input_path)
        if not input_path.is_file():
            raise DataError(f"input file not found: {input_path}")
        total = count_lines(input_path, options.errors)
    engine = open_engine(model_dirs, options)
    console.detail(f"translating {engine.description}")
    translator = Translator(engine, options)
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
    warn_truncated(translator, console)


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


def _stream(translator: Translator, source: IO[bytes], name: str, out: IO[bytes],
            progress: Optional[Callable[[int], None]]) -> None:
    done = 0
    for chunk in read_chunks(source, name, translator.options.errors):
        lines = translator.translate(chunk, first_index=done, progress=progress)
        out.write("".join(line + "\n" for line in lines).encode("utf-8"))
        out.flush()
        done += len(chunk)
