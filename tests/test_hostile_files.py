"""Files that are not what they claim, with or without checksums rewritten to match: a config
that is a link to /dev/zero or a named pipe, a CTranslate2 vocabulary cut short, a prepared
manifest whose held-out verses were edited or mistyped, a constraints file with a lone
surrogate. Each is one line on stderr, exit 2, in bounded time and memory."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from support.cli import cli_in_process
from nmtkit.storage.checksums import MANIFEST, write_manifest
from nmtkit.data import verses
from nmtkit.decoding.guides import GuideFiles, parse_constraints
from nmtkit.errors import DataError
from nmtkit.storage.files import read_json_dict, read_regular



def one_line(code: int, err: str) -> str:
    assert code == 2 and err.startswith("nmtkit: error: ") and err.count("\n") == 1, err
    return err


def forge(directory: Path) -> None:
    """checksums.json rewritten to vouch for the files as they are now."""
    write_manifest(directory, json.loads((directory / MANIFEST).read_text())["files"])


def test_read_regular_refuses_devices_pipes_and_oversized_files(tmp_path):
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "big").write_bytes(b"x" * 101)
    (tmp_path / "ok").write_bytes(b"{}")
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    for name, message in (("zero", "not a regular file"), ("pipe", "not a regular file"),
                          ("big", r"101 bytes, more than a file holds \(at most 100\)"), ("missing", "cannot read")):
        with pytest.raises(DataError, match=message):
            read_regular(tmp_path / name, 100)
        assert read_json_dict(tmp_path / name) is None  # a record that cannot be one reads as none
    assert read_regular(tmp_path / "link", 100) == b"{}"  # a link to a regular file is followed


@pytest.mark.parametrize("kind", ["link to /dev/zero", "named pipe"])
@pytest.mark.parametrize("file_name", ["config.json", "checksums.json"])
def test_a_model_file_that_never_ends_is_one_line(model_dir, tmp_path, kind, file_name):  # noqa: F811
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    (model / file_name).unlink()
    if kind == "named pipe":
        os.mkfifo(model / file_name)
    else:
        (model / file_name).symlink_to("/dev/zero")
    source = tmp_path / "in.txt"
    source.write_text("a b\n", encoding="utf-8")
    for command in (["translate", "-m", str(model), "-i", str(source), "--device", "cpu"], ["info", str(model)]):
        done = subprocess.run([sys.executable, "-m", "nmtkit", *command], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert f"{model / file_name}: not a regular file" in done.stderr


def test_a_ctranslate2_vocabulary_cut_short_is_one_line(model_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    pytest.importorskip("ctranslate2")
    from nmtkit.ctranslate2.export import export_ctranslate2

    export = export_ctranslate2(model_dir, tmp_path / "ct2")
    source = tmp_path / "in.txt"
    source.write_text("a b\n", encoding="utf-8")
    vocabulary = export / "shared_vocabulary.json"
    pieces = json.loads(vocabulary.read_text(encoding="utf-8"))
    for text in (json.dumps(pieces[:len(pieces) // 2]), "[]", "", vocabulary.read_text()[:40],
                 json.dumps(pieces[1:] + pieces[:1])):
        vocabulary.write_text(text, encoding="utf-8")
        forge(export)
        err = one_line(*cli_in_process(monkeypatch, capsys, "translate", "-m", str(export), "-i", str(source))[::2])
        assert f"{vocabulary}: not the {len(pieces)} pieces of the export's SentencePiece model" in err


def prepared_with_checksums(directory: Path, dev: list, test: list) -> Path:
    directory.mkdir(parents=True)
    provenance = {"modules": {"src": {"versification": "KJV"}}, "dev_refs": dev, "test_refs": test}
    (directory / "manifest.json").write_text(json.dumps({"provenance": provenance}), encoding="utf-8")
    write_manifest(directory, ["manifest.json"])
    return directory


def test_verses_verifies_the_manifest_before_trusting_its_references(tmp_path):
    prepared = prepared_with_checksums(tmp_path / "p", ["Colossians 2:19"], ["Genesis 1:4"])
    assert verses.heldout_refs(prepared) == ({"Colossians 2:19", "Genesis 1:4"}, {"KJV"})
    manifest = prepared / "manifest.json"
    manifest.write_text(manifest.read_text().replace("Colossians 2:19", "Genesis 1:1"), encoding="utf-8")
    with pytest.raises(DataError, match="manifest.json: checksum mismatch"):
        verses.heldout_refs(prepared)


@pytest.mark.parametrize("provenance, fragment", [
    ({"dev_refs": 7, "test_refs": []}, "dev_refs must be a list of verse references"),
    ({"dev_refs": [], "test_refs": [1, 2, 3]}, "test_refs must be a list of verse references"),
    ([1, 2], "provenance must be a mapping, got list"),
    ({"dev_refs": [], "test_refs": [], "modules": [1]}, None),  # no versification: still usable
])
def test_verses_refuses_mistyped_references(tmp_path, monkeypatch, capsys, provenance, fragment):
    prepared = tmp_path / "p"
    prepared.mkdir()
    (prepared / "manifest.json").write_text(json.dumps({"provenance": provenance}), encoding="utf-8")
    write_manifest(prepared, ["manifest.json"])  # checksums that vouch for the mistyped manifest
    if fragment is None:
        assert verses.heldout_refs(prepared) == (set(), set())
        return
    code, _, err = cli_in_process(monkeypatch, capsys, "verses", "NoSuchModule", "--exclude", str(prepared),
                                  "-o", str(tmp_path / "out.txt"))
    assert fragment in one_line(code, err)


@pytest.mark.parametrize("line", ['["\\ud800"]', '["a \\udfff b"]', '["ok", "\\ud83d"]'])
def test_a_lone_surrogate_escape_in_a_constraint_is_one_line(line, tmp_path):
    with pytest.raises(DataError, match="lone surrogate escape"):
        parse_constraints(line, "c.jsonl: line 1")
    assert parse_constraints('["\\ud83d\\ude00"]', "x") == ("\U0001F600",)  # a whole pair is a character
    path = tmp_path / "c.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"c.jsonl: line 1: a phrase holds a lone surrogate"):
        GuideFiles(constraints=path).read()


def test_a_5000_digit_number_in_a_constraint_is_one_line():
    with pytest.raises(DataError, match="line 3: not a list of phrases"):
        parse_constraints("9" * 5000, "c.jsonl: line 3")
    with pytest.raises(DataError, match="must be a JSON list of strings"):
        parse_constraints(f'["a", {"9" * 4000}]', "c.jsonl: line 3")


def test_a_named_pipe_prefix_file_is_read_once(tmp_path):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("a\n\nb c\n", encoding="utf-8"))
    writer.start()
    guides = GuideFiles(prefix=fifo).read()
    writer.join(timeout=30)
    assert [guide.prefix for guide in guides] == ["a", "", "b c"]
