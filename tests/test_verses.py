"""``nmtkit verses``: a SWORD Bible one verse a line, without a prepared corpus's held-out verses.

The selection tests use a stand-in module (``sword.module_texts`` patched); one test reads the
installed WEB module and skips without it.
"""
import json
import os
from pathlib import Path

import pytest

from nmtkit.data import verses
from nmtkit.data.sources import sword
from nmtkit.errors import ConfigError
from tests.test_sources_sword import SWORD, needs_modules
from support.cli import cli_in_process


class FakeModule:
    def versification(self):
        return "KJV"


TEXTS = {("Genesis", 1, 1): "In the beginning.", ("Genesis", 1, 2): "", ("Genesis", 1, 3): None,
         ("Genesis", 1, 4): "Light.", ("Matthew", 1, 1): "The book.", ("Matthew", 1, 2): "Abraham."}


@pytest.fixture
def fake_module(monkeypatch):
    monkeypatch.setattr(sword, "module_texts", lambda path, name, setting: (FakeModule(), dict(TEXTS)))


def write_manifest(directory: Path, provenance: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "manifest.json").write_text(json.dumps({"provenance": provenance}))
    return directory


def bible_provenance(dev, test, versification="KJV"):
    return {"modules": {"src": {"versification": versification}}, "dev_refs": dev, "test_refs": test}


def test_heldout_refs_of_one_and_of_several_corpora(tmp_path):
    one = write_manifest(tmp_path / "one", bible_provenance(["Genesis 1:1"], ["Matthew 1:2"]))
    assert verses.heldout_refs(one) == ({"Genesis 1:1", "Matthew 1:2"}, {"KJV"})
    several = write_manifest(tmp_path / "several", {
        "en-es": bible_provenance(["Genesis 1:1"], [], "NRSVA"),
        "es-en": bible_provenance([], ["Genesis 1:4"]),
        "local": {"files": {"train": "x"}}})
    assert verses.heldout_refs(several) == ({"Genesis 1:1", "Genesis 1:4"}, {"KJV", "NRSVA"})
    with pytest.raises(ConfigError, match="no manifest.json"):
        verses.heldout_refs(tmp_path / "nowhere")
    files_only = write_manifest(tmp_path / "files", {"files": {"train": "x"}})
    with pytest.raises(ConfigError, match="no sword corpus"):
        verses.heldout_refs(files_only)


def test_selection_leaves_out_held_out_empty_and_linked_verses(tmp_path, fake_module):
    prepared = write_manifest(tmp_path / "p", bible_provenance(["Genesis 1:4"], ["Matthew 1:1"]))
    refs, lines, report = verses.select_verses(SWORD, "X", [prepared])
    assert refs == ["Genesis 1:1", "Matthew 1:2"] and lines == ["In the beginning.", "Abraham."]
    assert report["dropped"] == {"empty": 1, "linked": 1}
    assert (report["verses"], report["written"], report["excluded"], report["notes"]) == (4, 2, 2, [])
    refs, lines, _ = verses.select_verses(SWORD, "X", [], testament="new")
    assert refs == ["Matthew 1:1", "Matthew 1:2"]
    other = write_manifest(tmp_path / "o", bible_provenance(["Genesis 1:1"], [], "NRSVA"))
    *_, report = verses.select_verses(SWORD, "X", [other])
    assert report["written"] == 3 and "NRSVA versification" in report["notes"][0]


def test_export_writes_texts_and_references_line_by_line(tmp_path, fake_module, monkeypatch, capsys):
    prepared = write_manifest(tmp_path / "p", bible_provenance(["Genesis 1:4"], []))
    out, refs = tmp_path / "mono.en", tmp_path / "mono.refs"
    code, stdout, stderr = cli_in_process(monkeypatch, capsys, "verses", "X", "--exclude", str(prepared),
                                          "-o", str(out), "--refs", str(refs))
    assert code == 0 and stdout == ""
    assert out.read_text(encoding="utf-8").splitlines() == ["In the beginning.", "The book.", "Abraham."]
    assert refs.read_text(encoding="utf-8").splitlines() == ["Genesis 1:1", "Matthew 1:1", "Matthew 1:2"]
    assert "3 verses of X written (1 held-out verses left out, 1 empty, 1 linked skipped)" in stderr
    code, stdout, _ = cli_in_process(monkeypatch, capsys, "verses", "X", "--testament", "old")
    assert code == 0 and stdout == "In the beginning.\nLight.\n"  # no -o: stdout carries only the text


def test_a_testament_is_counted_on_its_own(fake_module):
    """--testament new reported the whole Bible's empty and linked verses (all in Genesis here)."""
    _, _, new = verses.select_verses(SWORD, "X", [], testament="new")
    _, _, old = verses.select_verses(SWORD, "X", [], testament="old")
    _, _, every = verses.select_verses(SWORD, "X", [], testament="all")
    assert (new["dropped"], new["verses"]) == ({"empty": 0, "linked": 0}, 2)
    assert (old["dropped"], old["verses"]) == ({"empty": 1, "linked": 1}, 2)
    assert (every["dropped"], every["verses"]) == ({"empty": 1, "linked": 1}, 4)


def test_refs_on_stdout_and_refs_onto_the_text(tmp_path, fake_module, monkeypatch, capsys):
    """``-`` is stdout for --refs as for -o, so the two cannot both be; --refs naming the file
    -o writes (by another path or a hard link too) would be overwritten by the text."""
    out = tmp_path / "mono.en"
    code, stdout, _ = cli_in_process(monkeypatch, capsys, "verses", "X", "--testament", "new", "-o", str(out),
                                     "--refs", "-")
    assert code == 0 and stdout == "Matthew 1:1\nMatthew 1:2\n" and not (tmp_path / "-").exists()
    assert out.read_text(encoding="utf-8") == "The book.\nAbraham.\n"
    (tmp_path / "v").mkdir()
    os.link(out, tmp_path / "v" / "linked.en")
    for args in (["--refs", "-"], ["-o", "-", "--refs", "-"], ["-o", str(out), "--refs", str(out)],
                 ["-o", str(out), "--refs", f"{tmp_path}/v/../mono.en"],
                 ["-o", str(out), "--refs", str(tmp_path / "v" / "linked.en")]):
        code, stdout, stderr = cli_in_process(monkeypatch, capsys, "verses", "X", *args)
        assert code == 2 and stdout == "" and len(stderr.strip().splitlines()) == 1, (args, stderr)
        assert ("--refs -: the verses already go to stdout" if args[-1] == "-" else "is the file -o writes") \
            in stderr, stderr
    assert out.read_text(encoding="utf-8") == "The book.\nAbraham.\n"


@pytest.mark.parametrize("args, message", [
    (["--testament", "both"], "--testament both: choose all, old or new"),
    (["--exclude", "nowhere"], "--exclude nowhere: no manifest.json there"),
    (["-o", "."], "is a directory"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, fake_module, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = cli_in_process(monkeypatch, capsys, "verses", "X", *args)
    assert code == 2 and stdout == "" and message in stderr and len(stderr.strip().splitlines()) == 1


def test_a_missing_module_names_the_option(tmp_path, monkeypatch, capsys):
    (tmp_path / "mods.d").mkdir()
    code, _, stderr = cli_in_process(monkeypatch, capsys, "verses", "engKJV2006eb", "--sword-path", str(tmp_path))
    assert code == 2 and "engKJV2006eb not found" in stderr and "sword-text-kjv" in stderr
    assert "or set --sword-path" in stderr and "data.sword_path" not in stderr


@needs_modules
def test_the_web_without_the_quickstarts_held_out_verses(tmp_path, monkeypatch):
    from nmtkit.config import DataConfig
    from nmtkit.data.sources import read_corpus

    corpus = read_corpus(DataConfig(source="sword", dev_size=50, test_size=100))
    prepared = write_manifest(tmp_path / "p", corpus.provenance)
    refs, lines, report = verses.select_verses(SWORD, "engWEB2015eb", [prepared])
    assert report["excluded"] == 150 and report["written"] == report["verses"] - 150
    held = set(corpus.provenance["dev_refs"]) | set(corpus.provenance["test_refs"])
    assert not held & set(refs) and len(refs) == len(lines) == len(set(refs))
    assert lines[refs.index("Genesis 1:1")] == "In the beginning, God created the heavens and the earth."
