"""``nmtkit translate`` on files and streams: the engine the options name, chosen in one
explicit branch (torch: ``decoding/torch_engine.py``; ctranslate2: ``ctranslate2/engine.py``),
behind the one ``Translator``.

Lines are read as bytes and decoded one by one (invalid UTF-8 names its line), translated
``chunk_lines`` at a time (one at a time when streaming: each answer is flushed before the
next line is read); a file output is written atomically, so a failure leaves no partial
file, and ``-i FILE -o FILE`` keeps its finished chunks to resume from. stdout receives
translations only.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Optional, Sequence

from nmtkit import __version__
from nmtkit.config import DecodeConfig
from nmtkit.decoding.guides import Guide, GuideFiles, guides_digest
from nmtkit.decoding.translate import TranslateOptions, Translator, warn_truncated
from nmtkit.errors import ConfigError, DataError
from nmtkit.modeldir import CONFIG, saved_decode
from nmtkit.runtime.threads import configure_threads
from nmtkit.storage.checksums import MANIFEST
from nmtkit.storage.files import check_readable, decode_line, read_json_dict, sha256_file
from nmtkit.storage.outputs import check_output_file, is_stream, names_descriptor, open_output, same_file
from nmtkit.storage.partial import open_partial, partial_dir


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


CT2_EOS_AT_LIMIT = ("--eos-at-limit scored needs the torch engine for beam search: CTranslate2's beam search "
                    "ends an output at the length limit without an EOS, choosing as --eos-at-limit free does")


def resolve_options(model_dirs: Sequence[str | Path], flags: dict[str, Any], largest_beam: int = 0,
                    **settings) -> TranslateOptions:
    """The options of ``translate`` or ``serve`` on ``model_dirs``: each decode setting from
    ``flags`` where it is given (not None), else the first model's saved decode section (an
    export's nmtkit.json), else ``DecodeConfig``'s default; ``settings``: the command's own
    (device, engine, ...). One precedence rule for both, so serve answers as translate does.
    CTranslate2's beam search chooses among outputs at the length limit as ``eos_at_limit`` free
    does, so asking it for scored (a flag, not the model's own setting) is refused wherever a beam
    above 1 may run: the options' own, or ``largest_beam`` (serve: the most a request may ask for)."""
    saved = saved_decode_settings(model_dirs[0]) if model_dirs else DecodeConfig()
    decode = dataclasses.replace(saved, **{name: value for name, value in flags.items() if value is not None})
    beam_search = max(decode.beam_size, largest_beam) > 1 and not settings.get("sample")
    if flags.get("eos_at_limit") == "scored" and beam_search and model_dirs and \
            resolve_engine(model_dirs, settings.get("engine", "auto")) == "ctranslate2":
        raise ConfigError(CT2_EOS_AT_LIMIT)
    return TranslateOptions.from_decode(decode, **settings)


def open_engine(model_dirs: Sequence[str], options: TranslateOptions, threads: Optional[Callable[[], int]] = None):
    """The search engine for ``model_dirs`` (``options.engine``, auto: from the directories);
    ``threads`` chooses CTranslate2's (None: PyTorch's count, which the caller set)."""
    if resolve_engine(model_dirs, options.engine) == "ctranslate2":
        from nmtkit.ctranslate2.engine import CT2Engine

        if len(model_dirs) != 1:
            raise ConfigError("--engine ctranslate2 decodes one model (no ensembles); give one -m")
        if options.workers > 1:
            raise ConfigError("--workers applies to the torch engine: the CTranslate2 engine searches one batch at "
                              "a time on every thread")
        return CT2Engine(model_dirs[0], options, threads)
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


def open_translator(model_dirs: Sequence[str], options: TranslateOptions, console) -> Translator:
    """The ``Translator`` of ``model_dirs`` under ``options`` (its decoder compiled on request),
    on ``options.threads`` CPU threads (0: the cores other processes leave free). The CTranslate2
    engine runs without torch: a shell user's first line does not wait for it to import."""
    if resolve_engine(model_dirs, options.engine) == "ctranslate2":
        if options.compile:  # --engine auto chose ctranslate2 for an export
            raise ConfigError("--compile applies to the torch engine only, not to a CTranslate2 export")
        engine = open_engine(model_dirs, options, lambda: configure_threads(
            options.threads, console, what="translating", option="--threads", pytorch=False))
    else:
        configure_threads(options.threads, console, what="translating", option="--threads")
        engine = open_engine(model_dirs, options)
    if options.compile:
        from nmtkit.runtime.compiler import compile_decoder

        engine.model = compile_decoder(engine.model, engine.device, console)
    console.detail(f"translating {engine.description}")
    return Translator(engine, options)


def translate_file(model_dirs: Sequence[str], input_path: Optional[str | Path], output_path: Optional[str | Path],
                   options: TranslateOptions, console, side: GuideFiles = GuideFiles()) -> None:
    """Translate a file or stdin into a file or stdout, ``chunk_lines`` at a time, each line from
    its prefix and with its constraints when ``side`` names files of them:
    - ``-i FILE -o FILE``: each finished chunk is saved beside the output (``storage/partial.py``), so
      the same command after a crash continues from the last one; the output appears whole;
    - stdin on a terminal, or ``options.stream``: each line translated and flushed as it arrives;
    - otherwise a file output is written atomically, a device or named pipe directly.
    The output, the input and the side files are checked before any model loads."""
    options.validate()
    input_path = None if str(input_path) == "-" else input_path  # "-": stdin, as for score
    output_path = None if str(output_path) == "-" else output_path
    if input_path is None and sys.stdin is None:
        raise ConfigError("stdin is closed: give the text to translate with -i FILE")
    if output_path is None and sys.stdout is None:
        raise ConfigError("stdout is closed: give a file to write with -o FILE")
    output_path = check_output_file(output_path)
    if options.stream and output_path is not None and not is_stream(output_path):
        raise ConfigError(f"--stream flushes each line as it is translated, but -o {output_path} is a file that "
                          f"appears whole at the end: leave out --stream (the run then resumes after a crash) "
                          f"or write to stdout")
    check_output_is_not_read(model_dirs, input_path, output_path, side)
    guides = read_guides(model_dirs, options, side)
    scan = scan_state = None
    if input_path is not None:
        input_path = check_readable(input_path)
        if input_path.is_file():  # a pipe or device can be read only once: no count, no early check
            scan_state = _file_state(input_path)
            scan = scan_input(input_path, options.errors)
            side.check_count(guides, scan.lines, str(input_path))
    streaming = options.stream or reads_a_terminal(input_path)
    resumable = scan is not None and output_path is not None and not is_stream(output_path) and not streaming
    if resumable:
        partial_dir(output_path)  # something in the way is refused before the model loads
    translator = open_translator(model_dirs, options, console)
    if resumable:
        key = progress_key(model_dirs, scan, translator, guides)
        _translate_resumably(translator, input_path, output_path, scan, key, functools.partial(side.slice, guides),
                             console, scan_state)
    else:
        size = 1 if streaming else options.chunk_lines
        _translate_stream(translator, input_path, output_path, size, scan.lines if scan else None, side, guides,
                          console, scan_state)
    warn_truncated(translator, console)


def _identity(path: Optional[str | Path], stream: Optional[IO] = None) -> Optional[tuple[int, int]]:
    """(device, inode) of the regular file at ``path``, or, with no path, of the one behind
    ``stream``'s descriptor (a shell's ``< FILE`` or ``>> FILE``); None for anything else."""
    try:
        stats = os.stat(path) if path is not None else os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # gone, closed, or no descriptor (a test's StringIO)
        return None
    return (stats.st_dev, stats.st_ino) if stat.S_ISREG(stats.st_mode) else None


def check_output_is_not_read(model_dirs: Sequence[str | Path], input_path: Optional[str | Path],
                             output_path: Optional[Path], side: GuideFiles) -> None:
    """Refuse an output (``output_path``, None: stdout) that is a file translate reads: the input
    (stdin's file too), a side file, or a file of or a place in a model directory. Replaced, the
    text or the model in use would be lost; appended to (``>> FILE``), the input would be read
    back with its own translations, without end."""
    where = "stdout" if output_path is None else f"-o {output_path}"
    written = _identity(output_path, sys.stdout)
    if written is not None:
        for what, read, stream in (("input file", input_path, sys.stdin), ("--prefix-file", side.prefix, None),
                                   ("--constraints file", side.constraints, None)):
            if (read is not None or stream is not None) and _identity(read, stream) == written:
                whose = "" if read is not None else " (stdin)"
                if output_path is None:
                    raise ConfigError(f"stdout is the {what}{whose}: the translation would go into the text it is "
                                      f"made from (`> FILE` empties it before translate starts, `>> FILE` appends "
                                      f"to it and reads that back); send stdout elsewhere or give -o FILE")
                raise ConfigError(f"-o {output_path} is the {what}{whose}: the translation would replace the text "
                                  f"it is made from; write it elsewhere")
    for model_dir in model_dirs:
        directory = Path(model_dir)
        if not directory.is_dir():
            continue  # loading the model says what is wrong with it
        if output_path is not None and not names_descriptor(output_path) and same_file(output_path.parent, directory):
            raise ConfigError(f"{where} is inside the model directory {model_dir}: the translation would be written "
                              f"among the files of the model in use; write it elsewhere")
        if written is not None:
            for path in directory.iterdir():
                if _identity(path) == written:
                    raise ConfigError(f"{where} is {path}, a file of the model in use: the translation would destroy "
                                      f"it; write it elsewhere")


def reads_a_terminal(input_path: Optional[str | Path]) -> bool:
    """Whether translate reads a terminal (stdin, ``-`` or a path such as ``/dev/tty``), which it
    translates line by line, as ``--stream`` asks."""
    if input_path is None or str(input_path) == "-":
        try:
            return sys.stdin is not None and sys.stdin.isatty()
        except ValueError:  # closed
            return False
    return _is_terminal(Path(input_path))


def _is_terminal(path: Path) -> bool:
    """Whether ``path`` is a terminal (``-i /dev/stdin`` or ``-i /dev/tty`` typed into); only a
    character device is opened to ask (opening a named pipe would disturb its writer)."""
    try:
        if not stat.S_ISCHR(os.stat(path).st_mode):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.isatty(fd)
    finally:
        os.close(fd)


class _InputChanged(DataError):
    """A file input that changed while it was streamed: its message says what was written."""


def _translate_stream(translator: Translator, input_path: Optional[Path], output_path: Optional[Path], size: int,
                      total: Optional[int], side: GuideFiles, guides: Optional[list[Guide]], console,
                      scan_state: Optional[tuple[int, int]] = None) -> None:
    """Translate ``input_path`` (None: stdin) into ``output_path`` (None: stdout), ``size`` lines
    at a time, with the guides of its lines; the input must not run past or short of them. A file
    input (``scan_state``: its size and mtime when scanned) is checked before each chunk is written
    and at the end, so no chunk of a changed file is written and no line added to it is left out
    silently, as ``_translate_resumably`` refuses such a file."""
    source = open(input_path, "rb") if input_path is not None else sys.stdin.buffer
    name = str(input_path) if input_path is not None else "<stdin>"
    done = [0]  # input lines translated and written
    guides_of = functools.partial(side.slice, guides)
    where = "stdout" if output_path is None else str(output_path)
    streams = output_path is None or is_stream(output_path)  # written as translated, not whole at the end

    def unchanged() -> None:
        if _file_state(input_path) != scan_state:
            written = f"nothing was written to {where}" if done[0] == 0 or not streams else \
                f"the {done[0]} line(s) translated before it changed were written to {where}"
            raise _InputChanged(f"{input_path} changed while it was translated: {written}; run the command "
                                f"again once the file is complete")

    check = unchanged if scan_state is not None else None
    try:
        if output_path is None:
            _stream(translator, source, name, sys.stdout.buffer, size, None, done, guides_of, check)
            side.check_count(guides, done[0], name)
        else:
            with open_output(output_path) as out, console.terminal_bar("translating", total, "lines") as advance:
                _stream(translator, source, name, out, size, advance, done, guides_of, check)
                side.check_count(guides, done[0], name)  # inside: a short file leaves no output
    except _InputChanged:
        raise
    except DataError as err:  # undecodable input met while streaming: say what the output holds
        if done[0] == 0 or not streams:
            raise DataError(f"{err}; nothing was written to {where}") from None
        raise DataError(f"{err}; the {done[0]} line(s) before it were translated and written to {where}") from None
    finally:
        if input_path is not None:
            source.close()


def _stream(translator: Translator, source: IO[bytes], name: str, out: IO[bytes], size: int,
            progress: Optional[Callable[[int], None]], done: list[int],
            guides_of: Callable[[int, int], Optional[list[Guide]]],
            unchanged: Optional[Callable[[], None]] = None) -> None:
    """Translate ``source`` chunk by chunk into ``out``, counting finished lines in ``done[0]``;
    ``guides_of(start, count)``: the guides of those lines (None: none); ``unchanged()`` raises
    if the input changed, called before each chunk is written and after the last."""
    for index, chunk in enumerate(read_chunks(source, name, translator.options.errors, size)):
        data = translate_chunk(translator, index, done[0], chunk, progress, guides_of(done[0], len(chunk)))
        if unchanged is not None:
            unchanged()
        out.write(data)
        out.flush()
        done[0] += len(chunk)
    if unchanged is not None:
        unchanged()


def _translate_resumably(translator: Translator, input_path: Path, output_path: Path, scan: InputScan, key: str,
                         guides_of: Callable[[int, int], Optional[list[Guide]]], console,
                         scan_state: tuple[int, int]) -> None:
    """``-i FILE -o FILE`` through the chunk store beside the output: the chunks an earlier run
    finished under the same ``key`` (``progress_key``) are kept, the rest translated. An input
    that changed since it was scanned (``scan_state``: size and mtime then) writes nothing."""
    options, size = translator.options, translator.options.chunk_lines
    sizes = [min(size, scan.lines - start) for start in range(0, scan.lines, size)]
    with open_partial(output_path, key) as partial:
        kept = 0
        while kept < len(sizes) and partial.has(kept, sizes[kept] * options.nbest):
            kept += 1
        saved = [sum(sizes[:kept])]  # input lines whose output is saved
        if partial.discarded:
            console.info(f"{partial.directory} held chunks of another input, model or settings: starting over")
        if kept:
            console.info(f"resuming: {saved[0]} of {scan.lines} lines were translated by an earlier run")
        try:
            with open(input_path, "rb") as source, \
                    console.terminal_bar("translating", scan.lines, "lines", saved[0]) as advance:
                for index, chunk in enumerate(read_chunks(source, str(input_path), options.errors, size)):
                    if index >= kept:
                        first = index * size
                        data = translate_chunk(translator, index, first, chunk, advance, guides_of(first, len(chunk)))
                        partial.save(index, data)
                        saved[0] += len(chunk)
        except BaseException:
            if saved[0]:
                console.info(f"{saved[0]} of {scan.lines} lines are saved in {partial.directory}: "
                             f"the same command continues from there")
            raise
        if _file_state(input_path) != scan_state:  # grown: lines left out; changed: chunks of two texts
            raise DataError(f"{input_path} changed while it was translated: nothing was written to {output_path}; "
                            f"run the command again once the file is complete")
        partial.finish(len(sizes))


def _file_state(path: Path) -> tuple[int, int]:
    stats = os.stat(path)
    return stats.st_size, stats.st_mtime_ns


def translate_chunk(translator: Translator, index: int, first_line: int, chunk: list[str],
                    progress: Optional[Callable[[int], None]] = None,
                    guides: Optional[list[Guide]] = None) -> bytes:
    """Chunk ``index`` of an input (``first_line``: its first line's number, from 0) as output
    bytes. Sampling starts from a seed of the chunk's own, so a chunk gets the same samples
    however the run got to it (a resumed run too)."""
    options = translator.options
    if options.sample:
        translator.engine.reseed(chunk_seed(options.seed, index))
    lines = translator.translate(chunk, first_index=first_line, progress=progress, guides=guides)
    return "".join(line + "\n" for line in lines).encode("utf-8")


def chunk_seed(seed: int, index: int) -> int:
    """The sampling seed of chunk ``index``: ``seed`` itself for chunk 0 (an input of one chunk
    samples as it did before chunks had seeds), a digest of both for the others."""
    if index == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:8], "big") >> 1


@dataclass(frozen=True)
class InputScan:
    lines: int
    sha256: str  # of the file's bytes


def scan_input(path: Path, errors: str) -> InputScan:
    """Lines and digest of the file ``path``; in strict mode also fails fast on the first
    invalid UTF-8 line."""
    digest, total = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        for total, raw in enumerate(handle, 1):
            digest.update(raw)
            if errors == "strict":
                decode_line(raw, str(path), total)
    return InputScan(total, digest.hexdigest())


def progress_key(model_dirs: Sequence[str], scan: InputScan, translator: Translator,
                 guides: Optional[Sequence[Guide]] = None) -> str:
    """What the output of ``translate -i FILE`` depends on, as one digest: the input's bytes,
    the models' files, the prefixes and constraints as read (a pipe's included), every
    option but the thread and worker counts, the engine's device and dtype, nmtkit's version. Saved
    chunks are reused only under the same key."""
    options = dataclasses.asdict(translator.options)
    # auto may choose differently on each start, and --workers 1 is the way out of a run short of
    # memory: neither count changes a translation, neither may discard saved chunks
    options.pop("threads")
    options.pop("workers")
    record = {"nmtkit": __version__, "input": dataclasses.asdict(scan), "models": [model_digest(d) for d in model_dirs],
              "guides": guides_digest(guides), "options": options, "engine": translator.engine.description}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).hexdigest()


def model_digest(model_dir: str | Path) -> str:
    """A model directory's content as one digest: its checksums.json, which lists every file's
    digest (and which loading verifies), or, where it has none, every file's bytes."""
    directory = Path(model_dir)
    if (directory / MANIFEST).is_file():
        return sha256_file(directory / MANIFEST)
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        digest.update(f"{path.name}\0{sha256_file(path)}\0".encode("utf-8"))
    return digest.hexdigest()


def read_chunks(handle: IO[bytes], name: str, errors: str, size: int) -> Iterator[list[str]]:
    """Lines of a binary stream, decoded and stripped of \\n / \\r\\n, ``size`` at a time (each
    chunk as soon as its last line arrives). Before a DataError for an undecodable line, the
    lines before it come as a last chunk."""
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
