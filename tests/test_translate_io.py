"""translate on streams and large files: a line answered as it arrives (--stream, a terminal),
and -i FILE -o FILE resumed from its saved chunks after a crash, never from stale ones."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import options, tiny_sentences
from nmtkit.decoding.guides import GuideFiles
from nmtkit.decoding.translate import Translator, translate_lines
from nmtkit.errors import ConfigError
from nmtkit.runtime.console import NmtConsole
from nmtkit.storage.partial import partial_dir
from nmtkit.translate_files import chunk_seed, progress_key, scan_input, translate_file
from support.text_io import recording_console, write_lines

FLAGS = ("--beam-size", "2", "--max-len-a", "0", "--max-len-b", "4", "--device", "cpu", "--dtype", "float32")


def start_translate(model: Path, *args: str, stdin=subprocess.PIPE) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "nmtkit", "translate", "-m", str(model), *FLAGS, *args],
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def watchdog(proc: subprocess.Popen, seconds: float = 120) -> threading.Timer:
    """Kill ``proc`` if the test hangs on a read (a stream that never answers)."""
    timer = threading.Timer(seconds, proc.kill)
    timer.start()
    return timer


def test_stream_answers_each_line_before_the_next_is_written(model_dir, loaded):
    lines = ["the cat sat", "", "a big red dog ran quickly under the mat"]
    expected = translate_lines(loaded, lines, options(nbest=2))  # N lines per input line
    proc = start_translate(model_dir, "--stream", "--nbest", "2")
    timer = watchdog(proc)
    try:
        for line, answer in zip(lines, expected):
            proc.stdin.write((line + "\n").encode("utf-8"))
            proc.stdin.flush()  # the process holds this line and no EOF: it must answer now
            got = [proc.stdout.readline().decode("utf-8") for _ in range(2)]
            assert "".join(got) == answer + "\n"
        proc.stdin.close()
        assert proc.stdout.read() == b"" and proc.wait(timeout=60) == 0
    finally:
        timer.cancel()
        proc.kill()


def test_a_terminal_stdin_is_translated_line_by_line_without_the_flag(model_dir, loaded, monkeypatch):
    lines = ["the cat sat", "a dog", "", "the mat"]
    calls, real = [], Translator.translate
    monkeypatch.setattr(Translator, "translate", lambda self, chunk, **kw: calls.append(list(chunk)) or
                        real(self, chunk, **kw))
    out = io.BytesIO()
    for terminal, expected_calls in ((True, [[line] for line in lines]), (False, [lines])):
        text = "".join(line + "\n" for line in lines).encode("utf-8")
        stdin = SimpleNamespace(isatty=lambda: terminal, buffer=io.BytesIO(text))
        monkeypatch.setattr(sys, "stdin", stdin)
        monkeypatch.setattr(sys, "stdout", SimpleNamespace(buffer=out))
        calls.clear()
        out.seek(0), out.truncate()
        translate_file([str(model_dir)], None, None, options(), recording_console()[0])
        assert calls == expected_calls  # a terminal: one line per call, each flushed before the next is read
        assert out.getvalue().decode("utf-8") == "".join(t + "\n" for t in translate_lines(loaded, lines, options()))


def test_a_terminal_refuses_the_chunk_and_worker_counts_it_cannot_use(model_dir, monkeypatch, capsys):
    """A terminal is translated line by line, as --stream is: --chunk-lines and --workers above 1
    were accepted there and ignored (--stream refused them)."""
    from support.cli import assert_error, cli_in_process

    monkeypatch.setattr(sys, "stdin", SimpleNamespace(isatty=lambda: True, buffer=io.BytesIO(b"the cat\n")))
    for flags, name in ((("--chunk-lines", "5"), "--chunk-lines"), (("--workers", "2"), "--workers")):
        code, _, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(model_dir), *FLAGS, *flags)
        assert assert_error(code, err, 2) == (f"nmtkit: error: {name} does not apply to a terminal, whose lines are "
                                              f"translated one by one as they are typed")
    code, out, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(model_dir), *FLAGS, "--workers", "1")
    assert code == 0 and out.count("\n") == 1, err


def test_a_crashed_translation_resumes_from_its_saved_chunks(tmp_path, model_dir, loaded, monkeypatch):
    lines = tiny_sentences(23, seed=7)
    source, out = write_lines(tmp_path / "in.txt", lines), tmp_path / "out.txt"
    real, seen = Translator.translate, []

    def crash_at_fourth_chunk(self, chunk, **kw):
        if len(seen) == 3:
            raise KeyboardInterrupt  # as Ctrl-C would, mid-run
        seen.append(list(chunk))
        return real(self, chunk, **kw)

    monkeypatch.setattr(Translator, "translate", crash_at_fourth_chunk)
    console, said = recording_console()
    with pytest.raises(KeyboardInterrupt):
        translate_file([str(model_dir)], str(source), str(out), options(chunk_lines=5), console)
    assert not out.exists()  # whole or not at all
    store = partial_dir(out)
    assert sorted(p.name for p in store.iterdir()) == [".nmtkit.lock", "chunk-000000.txt", "chunk-000001.txt",
                                                       "chunk-000002.txt", "key.json"]
    assert "15 of 23 lines are saved in" in said.getvalue()

    seen.clear()
    monkeypatch.setattr(Translator, "translate", lambda self, chunk, **kw: seen.append(list(chunk)) or
                        real(self, chunk, **kw))
    console, said = recording_console()
    translate_file([str(model_dir)], str(source), str(out), options(chunk_lines=5), console)
    assert seen == [lines[15:20], lines[20:]]  # only what was not saved
    assert "resuming: 15 of 23 lines" in said.getvalue()
    assert out.read_text(encoding="utf-8") == "".join(t + "\n" for t in translate_lines(loaded, lines, options()))
    assert not store.exists()


def test_saved_chunks_of_other_settings_are_not_reused(tmp_path, model_dir, loaded, monkeypatch):
    lines = tiny_sentences(12, seed=8)
    source, out = write_lines(tmp_path / "in.txt", lines), tmp_path / "out.txt"
    real, calls = Translator.translate, []

    def crash_at_third_chunk(self, chunk, **kw):
        calls.append(chunk)
        if len(calls) == 3:
            raise RuntimeError("crash")
        return real(self, chunk, **kw)

    monkeypatch.setattr(Translator, "translate", crash_at_third_chunk)
    with pytest.raises(RuntimeError):
        translate_file([str(model_dir)], str(source), str(out), options(chunk_lines=4), recording_console()[0])
    assert len(list(partial_dir(out).glob("chunk-*"))) == 2
    monkeypatch.undo()
    console, said = recording_console()
    translate_file([str(model_dir)], str(source), str(out), options(chunk_lines=4, beam_size=1), console)
    assert "held chunks of another input, model or settings: starting over" in said.getvalue()
    assert out.read_text(encoding="utf-8") == "".join(t + "\n" for t in translate_lines(loaded, lines,
                                                                                        options(beam_size=1)))
    assert not partial_dir(out).exists()


def test_the_progress_key_follows_input_models_settings_and_device(tmp_path, model_dir):
    source = write_lines(tmp_path / "in.txt", ["the cat", "a dog"])

    def key(path=source, models=(str(model_dir),), description="on cpu in float32", side=GuideFiles(), **settings):
        translator = SimpleNamespace(options=options(**settings), engine=SimpleNamespace(description=description))
        return progress_key(list(models), scan_input(path, "strict"), translator, side.read())

    assert key() == key()
    other_input = write_lines(tmp_path / "other.txt", ["the cat", "a dog."])
    other_model = tmp_path / "model2"
    other_model.mkdir()
    for item in model_dir.iterdir():
        (other_model / item.name).write_bytes(item.read_bytes())
    assert key(models=[str(other_model)]) == key()  # the same files elsewhere: the same model
    (other_model / "checksums.json").write_bytes((model_dir / "checksums.json").read_bytes() + b" ")
    changed = [key(path=other_input), key(models=[str(other_model)]), key(beam_size=3), key(lenpen=0.5),
               key(nbest=2), key(alignments=True), key(chunk_lines=7), key(sample=True), key(seed=2),
               key(description="on cuda:0 in bfloat16"),
               key(side=GuideFiles(prefix=write_lines(tmp_path / "p", ["a", ""]))),
               key(side=GuideFiles(constraints=write_lines(tmp_path / "c", ["[]", "[]"])))]
    assert len(set(changed + [key()])) == len(changed) + 1
    # counts that never change a translation: a rerun with fewer threads or batches at once goes on
    assert key(threads=1) == key(threads=3) == key(workers=1) == key(workers=4) == key()


def test_sampling_seeds_are_per_chunk_and_something_in_the_way_is_refused(tmp_path, model_dir):
    assert chunk_seed(5, 0) == 5 and chunk_seed(5, 1) != chunk_seed(6, 0) != chunk_seed(5, 2)
    assert all(0 <= chunk_seed(2**63 - 1, k) < 2**63 for k in range(5))
    source, out = write_lines(tmp_path / "in.txt", ["a"]), tmp_path / "out.txt"
    in_the_way = partial_dir(out)
    in_the_way.write_text("mine", encoding="utf-8")
    with pytest.raises(ConfigError, match="is in the way"):
        translate_file(["no-such-model"], str(source), str(out), options(), recording_console()[0])
    assert in_the_way.read_text(encoding="utf-8") == "mine"


def test_a_killed_translation_rerun_gives_the_uninterrupted_output(tmp_path, model_dir, loaded):
    lines = tiny_sentences(60, seed=9)
    source, out = write_lines(tmp_path / "big.txt", lines), tmp_path / "out.txt"
    store = partial_dir(out)
    proc = start_translate(model_dir, "-i", str(source), "-o", str(out), "--chunk-lines", "2", stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(list(store.glob("chunk-*.txt")) if store.is_dir() else []) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert not out.exists()
    saved = len(list(store.glob("chunk-*.txt")))
    assert 3 <= saved < 30
    console, said = recording_console()  # the same command, rerun in this process (one start-up less)
    translate_file([str(model_dir)], str(source), str(out), options(chunk_lines=2), console)
    assert f"resuming: {2 * saved} of 60 lines" in said.getvalue()
    assert out.read_bytes() == "".join(t + "\n" for t in translate_lines(loaded, lines, options())).encode("utf-8")
    assert not store.exists()


def test_a_terminal_shows_lines_per_second_and_the_time_left(tmp_path, model_dir):
    source, out = write_lines(tmp_path / "in.txt", tiny_sentences(9, seed=4)), tmp_path / "out.txt"
    text = io.StringIO()
    console = NmtConsole(file=text, width=200, force_terminal=True)
    translate_file([str(model_dir)], str(source), str(out), options(chunk_lines=3), console)
    shown = text.getvalue()
    assert "translating" in shown and "9/9" in shown and "lines/s" in shown and "0:00:00" in shown
    plain = io.StringIO()  # not a terminal (a log file): no bar
    translate_file([str(model_dir)], str(source), str(out), options(), NmtConsole(file=plain, width=200))
    assert plain.getvalue() == ""
