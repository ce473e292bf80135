"""A resumed translation uses a saved chunk only as it was written: an edited or undecodable
chunk is translated again; guides from a pipe are keyed by what the pipe delivered; a named
pipe of constraints with -i FILE -o FILE is read once; long output names keep apart."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from conftest import tiny_sentences
from nmtkit.decoding.guides import GuideFiles
from nmtkit.decoding.translate import Translator, translate_lines
from nmtkit.storage.partial import open_partial, partial_dir
from nmtkit.translate_files import translate_file
from conftest import options
from support.text_io import recording_console, write_lines


def crash_after(monkeypatch, chunks: int) -> None:
    """Translator.translate raises on its call number ``chunks`` + 1 (a Ctrl-C mid-run)."""
    real, calls = Translator.translate, []

    def translate(self, chunk, **kw):
        if len(calls) == chunks:
            raise KeyboardInterrupt
        calls.append(chunk)
        return real(self, chunk, **kw)

    monkeypatch.setattr(Translator, "translate", translate)


def counting(monkeypatch) -> list:
    real, seen = Translator.translate, []
    monkeypatch.setattr(Translator, "translate", lambda self, chunk, **kw: seen.append(list(chunk)) or
                        real(self, chunk, **kw))
    return seen


@pytest.mark.parametrize("damage", [
    lambda data: b"TAMPERED LINE, NOT A TRANSLATION\n" + data.split(b"\n", 1)[1],  # same line count
    lambda data: b"\xff" + data,  # invalid UTF-8
])
def test_an_edited_saved_chunk_is_translated_again(tmp_path, model_dir, loaded, monkeypatch, damage):  # noqa: F811
    lines = tiny_sentences(9, seed=3)
    source, out = write_lines(tmp_path / "in.txt", lines), tmp_path / "out.txt"
    crash_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        translate_file([str(model_dir)], str(source), str(out), options(chunk_lines=3), recording_console()[0])
    chunk = partial_dir(out) / "chunk-000000.txt"
    chunk.write_bytes(damage(chunk.read_bytes()))
    monkeypatch.undo()
    seen = counting(monkeypatch)
    translate_file([str(model_dir)], str(source), str(out), options(chunk_lines=3), recording_console()[0])
    assert seen == [lines[0:3], lines[3:6], lines[6:9]]  # chunk 0 failed its digest: it and those after it redone
    assert out.read_bytes() == "".join(t + "\n" for t in translate_lines(loaded, lines, options())).encode("utf-8")


def test_chunk_digests_are_recorded_and_a_chunk_without_one_is_not_used(tmp_path):
    out = tmp_path / "out.txt"
    with open_partial(out, "k") as partial:
        partial.save(0, b"a\nb\n")
        assert partial.has(0, 2)
        assert not partial.has(0, 3)
    (partial_dir(out) / "chunk-000001.txt").write_bytes(b"c\n")  # put there by hand: no digest recorded
    with open_partial(out, "k") as partial:
        assert partial.kept and partial.has(0, 2) and not partial.has(1, 1)
    with open_partial(out, "other key") as partial:
        assert not partial.has(0, 2) and not (partial_dir(out) / "chunk-000000.txt").exists()


def test_prefixes_from_a_pipe_are_keyed_by_what_the_pipe_gave(tmp_path, model_dir, loaded, monkeypatch):  # noqa: F811
    lines = tiny_sentences(6, seed=4)
    source, out = write_lines(tmp_path / "in.txt", lines), tmp_path / "out.txt"
    fifo = tmp_path / "prefixes"

    def translate_with_prefixes(prefixes: list[str]) -> None:
        os.mkfifo(fifo)
        writer = threading.Thread(target=lambda: write_lines(fifo, prefixes))
        writer.start()
        try:
            translate_file([str(model_dir)], str(source), str(out), options(chunk_lines=2), recording_console()[0],
                           GuideFiles(prefix=fifo))
        finally:
            writer.join(timeout=30)
            fifo.unlink()

    crash_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        translate_with_prefixes(["a"] * 6)
    monkeypatch.undo()
    seen = counting(monkeypatch)
    translate_with_prefixes(["b"] * 6)  # other prefixes: the saved chunks are not theirs
    assert len(seen) == 3
    assert all(line.startswith("b") for line in out.read_text(encoding="utf-8").splitlines())


def test_constraints_from_a_named_pipe_with_a_file_output_do_not_hang(tmp_path, model_dir):  # noqa: F811
    source, out = write_lines(tmp_path / "in.txt", ["the cat", "a dog"]), tmp_path / "out.txt"
    fifo = tmp_path / "constraints"
    os.mkfifo(fifo)
    script = f"import pathlib; pathlib.Path({str(fifo)!r}).write_text('[\"b\"]\\n[]\\n')"
    writer = subprocess.Popen([sys.executable, "-c", script])
    try:
        done = subprocess.run([sys.executable, "-m", "nmtkit", "translate", "-m", str(model_dir), "-i", str(source),
                               "-o", str(out), "--constraints", str(fifo), "--beam-size", "2", "--max-len-b", "4",
                               "--max-len-a", "0", "--device", "cpu"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        writer.kill()
        writer.wait()
    assert done.returncode == 0, done.stderr
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2


def test_outputs_sharing_a_long_start_keep_separate_chunk_stores(tmp_path):
    stem = "x" * 120
    first, second = tmp_path / f"{stem}-one.txt", tmp_path / f"{stem}-two.txt"
    assert partial_dir(first) != partial_dir(second)
    assert partial_dir(first) == partial_dir(first)  # the same name: the same store, run after run
    assert len(partial_dir(first).name) < 120
    with open_partial(first, "a"), open_partial(second, "b"):  # both held at once: no "in use" refusal
        pass
