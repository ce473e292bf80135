"""``prepare`` end to end on a tiny generated corpus: layout, counts, round trips, stamps.

The corpus is a word-by-word English->Spanish toy with planted problems, so every cleaning
rule has an exact expected count.
"""
import gzip
import hashlib
import json
import random
import unicodedata
from pathlib import Path

import numpy as np
import pytest

import nmtkit.data.prepare as prep
from nmtkit.config import load_config
from nmtkit.data.ids import load_split
from nmtkit.data.vocab import Vocab
from nmtkit.workdir import WorkDir
from support.planted import EXPECTED, WORDS, recipe, run, splits, train_text, write_corpus  # noqa: F401 (fixtures)


def snapshot(root):
    """Modification times of every file but the lock (which records its latest holder's pid)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".nmtkit.lock"}


def test_layout_counts_and_manifest(recipe, tmp_path):
    summary, printed = run(recipe)
    out = tmp_path / "work" / "prepared"
    for name in ("train.en.gz", "train.es.gz", "dev.en", "dev.es", "test.en", "test.es", "spm.model",
                 "train.npz", "dev.npz", "test.npz", "manifest.json"):
        assert (out / name).is_file(), name
    assert not list(out.glob("train.prefilter.*")) and not (out / "train.en").exists()  # consumed; no plain copy
    assert (tmp_path / "work" / "config.yaml").is_file()
    assert summary["cleaning"] == {"read": 315, "dropped": EXPECTED, "kept": 301}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["pairs"] == 301
    assert manifest["splits"]["dev"]["files"]["dev.es"]["lines"] == 20
    assert manifest["vocab"]["size"] == {"src": 60, "tgt": 60}
    assert summary["steps"] == {"fetch": "done", "spm": "done", "encode": "done"}
    train = train_text(out, "en")
    assert manifest["splits"]["train"]["files"]["train.en.gz"] == {
        "lines": 301, "bytes": len(train.encode()), "sha256": hashlib.sha256(train.encode()).hexdigest()}
    for split in ("train", "dev", "test"):
        ids = load_split(out / f"{split}.npz")
        lines = (train if split == "train" else (out / f"{split}.en").read_text()).splitlines()
        assert len(ids) == len(lines) == manifest["splits"][split]["pairs"]
        assert int(ids.src_lengths().sum()) == manifest["tokens"][split]["src"]
    assert "too_long" in printed and "301" in printed and "vocab: unigram, joint, 60" in printed


def test_dev_and_test_are_copied_line_for_line(recipe, tmp_path, splits):
    run(recipe)
    out = tmp_path / "work" / "prepared"
    for split in ("dev", "test"):
        assert (out / f"{split}.en").read_text().splitlines() == [src for src, _ in splits[split]]


def test_round_trip_and_nfc(recipe, tmp_path):
    run(recipe)
    out = tmp_path / "work" / "prepared"
    vocab = Vocab(out / "spm.model")
    train = load_split(out / "train.npz")
    lines = train_text(out, "es").splitlines()
    assert "café cat" in train_text(out, "en")
    for i, line in enumerate(lines):
        assert unicodedata.is_normalized("NFC", line) and line == " ".join(line.split())
        assert vocab.decode(train.pair(i)[1]) == vocab.normalize(line) == line
    dev = load_split(out / "dev.npz")
    for i, line in enumerate((out / "dev.en").read_text(encoding="utf-8").splitlines()):
        assert vocab.decode(dev.pair(i)[0]) == vocab.normalize(line)


def test_separate_vocabularies_replace_the_joint_one(recipe, tmp_path):
    run(recipe)
    summary, _ = run(recipe, "vocab.joint=false", "model.tie_embeddings=decoder")
    out = tmp_path / "work" / "prepared"
    assert (out / "spm.src.model").is_file() and (out / "spm.tgt.model").is_file()
    assert not (out / "spm.model").exists()
    assert summary["steps"] == {"fetch": "done", "spm": "done", "encode": "done"}
    assert len(Vocab(out / "spm.src.model")) == len(Vocab(out / "spm.tgt.model")) == 60


def test_rerun_does_no_work(recipe, tmp_path, monkeypatch):
    import json

    run(recipe)
    before = snapshot(tmp_path / "work")
    for step in ("fetch", "spm", "encode"):  # each step's wall time is kept for benchmarks/scale.py
        seconds = json.loads((tmp_path / "work" / "prepared" / "stamps" / f"{step}.json").read_text())["seconds"]
        assert isinstance(seconds, float) and 0 <= seconds < 60
    calls = []
    for name in ("CorpusStream", "train_spm", "length_filter"):  # reading the source(s), SentencePiece, encoding
        monkeypatch.setattr(prep, name, lambda *a, _name=name, **k: calls.append(_name))
    summary, printed = run(recipe)
    assert calls == []
    assert summary["steps"] == {"fetch": "up to date", "spm": "up to date", "encode": "up to date"}
    assert snapshot(tmp_path / "work") == before
    assert summary["cleaning"]["dropped"] == EXPECTED  # the report survives in the stamps


def test_changed_config_redoes_only_what_depends_on_it(recipe, tmp_path):
    """SentencePiece and encoding read the fetched text, which encoding consumed: the source is
    read again before them (the same text, so the same fetch report), and deleted again after."""
    first, _ = run(recipe)
    out = tmp_path / "work" / "prepared"
    summary, _ = run(recipe, "vocab.size=50")
    assert summary["steps"] == {"fetch": "done", "spm": "done", "encode": "done"}
    assert summary["cleaning"]["read"] == first["cleaning"]["read"] and summary["vocab"]["size"]["src"] == 50
    assert not list(out.glob("train.prefilter.*"))
    summary, _ = run(recipe, "vocab.size=50", "data.clean.max_len=20")
    assert summary["steps"] == {"fetch": "done", "spm": "up to date", "encode": "done"}
    assert summary["cleaning"]["dropped"]["too_long"] > EXPECTED["too_long"]
    summary, _ = run(recipe, "vocab.size=50", "data.clean.max_len=20")
    assert summary["steps"] == {"fetch": "up to date", "spm": "up to date", "encode": "up to date"}
    summary, _ = run(recipe, "vocab.size=50", "data.clean.max_len=20", "data.max_train_pairs=100")
    assert summary["steps"]["fetch"] == "done" and summary["cleaning"]["read"] == 100


def test_changed_input_file_is_fetched_again(recipe, tmp_path):
    run(recipe)
    with open(tmp_path / "dev.en", "a") as handle, open(tmp_path / "dev.es", "a") as other:
        handle.write("one more\n")
        other.write("uno más\n")
    summary, _ = run(recipe)
    assert summary["steps"]["fetch"] == "done" and summary["splits"]["dev"]["pairs"] == 21


def test_interrupted_step_is_redone(recipe, tmp_path, monkeypatch):
    run(recipe)
    out = tmp_path / "work" / "prepared"

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if killed while writing the ids

    import nmtkit.data.ids as ids

    monkeypatch.setattr(ids.SplitWriter, "add", crash)
    with pytest.raises(KeyboardInterrupt):
        run(recipe, "data.clean.max_ratio=2.5")
    assert not (out / "stamps" / "encode.json").exists()  # no stamp: the step did not finish
    assert not list(out.glob(".*.tmp"))
    from nmtkit.data.ids import prepared_file
    from nmtkit.errors import DataError

    with pytest.raises(DataError, match="is incomplete: the last `nmtkit prepare` did not finish"):
        prepared_file(out / "train.npz")  # training must not read a half-updated directory
    monkeypatch.undo()
    summary, _ = run(recipe, "data.clean.max_ratio=2.5")
    assert summary["steps"] == {"fetch": "up to date", "spm": "up to date", "encode": "done"}


def test_deleted_stamp_is_redone(recipe, tmp_path):
    run(recipe)
    (tmp_path / "work" / "prepared" / "stamps" / "spm.json").unlink()
    summary, _ = run(recipe)
    assert summary["steps"]["spm"] == "done"


def test_leftover_temp_files_are_removed(recipe, tmp_path):
    """A killed run leaves temp files; its step has no stamp, so only the garbage is left to clear."""
    run(recipe)
    out = tmp_path / "work" / "prepared"
    leftovers = [out / ".train.en.abc123.tmp", out / "stamps" / ".encode.json.x1.tmp", out / "tmpk9_spm"]
    leftovers[0].write_text("half a file")
    leftovers[1].write_text("{")
    leftovers[2].mkdir()
    summary, _ = run(recipe)
    assert summary["steps"] == {"fetch": "up to date", "spm": "up to date", "encode": "up to date"}
    assert not any(path.exists() for path in leftovers)


def test_touched_output_is_rebuilt(recipe, tmp_path):
    run(recipe)
    out = tmp_path / "work" / "prepared"
    (out / "train.npz").write_bytes(b"garbage")
    summary, _ = run(recipe)
    assert summary["steps"] == {"fetch": "done", "spm": "up to date", "encode": "done"}
    assert len(load_split(out / "train.npz")) == 301


def test_prepared_dir(recipe):
    cfg = load_config(recipe)
    assert WorkDir.of(cfg).prepared == cfg.work_path / "prepared"


def test_parallel_encoding_matches_single_process(tmp_path, monkeypatch):
    files, _ = write_corpus(tmp_path)
    texts = [line for line in (tmp_path / "train.en").read_text().splitlines() if line.strip()]  # the source
    import sentencepiece as spm

    (tmp_path / "corpus.txt").write_text("\n".join(texts))
    spm.SentencePieceTrainer.Train(input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "m"),
                                   vocab_size=40, minloglevel=2, pad_id=0, unk_id=1, bos_id=2, eos_id=3)
    monkeypatch.setattr(prep.Encoder, "CHUNK_LINES", 37)
    models, pairs = (tmp_path / "m.model",) * 2, [(text, text[::-1]) for text in texts]
    lines = [[f"{text}\n".encode() for text in side] for side in zip(*pairs)]
    with prep.Encoder(1) as one, prep.Encoder(2) as two:
        single, parallel = (list(encoder.encode_pairs(models, lines)) for encoder in (one, two))
    assert len(single) == len(parallel) == -(-len(texts) // 37)  # chunks, in order
    assert [line for chunk in single for line in chunk.tgt_lines] == lines[1]
    for a, b in zip(single, parallel):
        assert (a.src_lines, a.tgt_lines) == (b.src_lines, b.tgt_lines) and all(np.array_equal(getattr(a, name), getattr(b, name))
                                          for name in ("src", "src_lengths", "tgt", "tgt_lengths"))
    vocab = Vocab(tmp_path / "m.model")
    flat = np.concatenate([chunk.tgt for chunk in single]).tolist()
    assert flat == [i for src, tgt in pairs for i in vocab.encode(tgt)]
    assert np.concatenate([chunk.src_lengths for chunk in single]).tolist() == [len(vocab.encode(t)) for t in texts]


def test_second_prepare_on_the_same_dir_is_refused(recipe, tmp_path):
    fcntl = pytest.importorskip("fcntl")
    from nmtkit.errors import NmtkitError

    out = tmp_path / "work" / "prepared"
    out.mkdir(parents=True)
    with open(out / ".nmtkit.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(NmtkitError, match="in use by another `nmtkit prepare`"):
            run(recipe)


def test_prepared_directory_stays_near_the_size_of_the_source_text(tmp_path):
    """No second copy of the training text: ids (2 bytes a piece, 16 a pair) and the kept text
    gzip-compressed come to at most 1.2x the text prepare reads, the SentencePiece model aside
    (~0.25 MB of normalisation tables whatever the corpus; noise at WMT sizes). Sentences of
    12-24 words at ~3.5 characters a piece, as an 8k vocabulary cuts the Bible (~4). A second
    run does nothing and leaves the size as it was."""
    rng = random.Random(3)
    files = {}
    for split, count in (("train", 2000), ("dev", 50), ("test", 50)):
        words = [[rng.choice(list(WORDS)) for _ in range(rng.randint(12, 24))] for _ in range(count)]
        files[split] = {}
        for lang, side in (("en", 0), ("es", 1)):
            files[split][lang] = str(tmp_path / f"{split}.{lang}")
            lines = [" ".join(sentence if side == 0 else [WORDS[word] for word in sentence]) for sentence in words]
            (tmp_path / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    recipe = tmp_path / "sized.yaml"
    recipe.write_text(json.dumps({"name": "sized", "workdir": str(tmp_path / "work"), "vocab": {"size": 48, "workers": 1},
                                  "data": {"source": "files", "files": files}}))
    out = tmp_path / "work" / "prepared"

    def sizes():
        prepared = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and not p.name.startswith("spm."))
        return prepared, sum(Path(path).stat().st_size for sides in files.values() for path in sides.values())

    run(recipe)
    prepared, source = sizes()
    assert prepared <= 1.2 * source
    summary, _ = run(recipe)
    assert summary["steps"] == {"fetch": "up to date", "spm": "up to date", "encode": "up to date"}
    assert sizes() == (prepared, source)


def test_consumed_outputs_are_recorded_absent_and_only_the_steps_own_are_deleted(tmp_path):
    from nmtkit.data.steps import consume, run_step

    runs = []

    def work():
        runs.append(1)
        for name in ("a", "b", "c"):
            (tmp_path / name).write_text(name)
        return {"made": 3}, ["a", "b", "c"]

    run_step(tmp_path, "step", {"key": 1}, work)
    (tmp_path / "mine").write_text("a user's file")
    assert consume(tmp_path, "step", ["a", "mine"]) is True
    assert not (tmp_path / "a").exists() and (tmp_path / "mine").is_file()
    assert run_step(tmp_path, "step", {"key": 1}, work) == ({"made": 3}, "up to date") and len(runs) == 1
    assert consume(tmp_path, "step", ["a"]) is False  # gone already
    (tmp_path / "c").write_text("rewritten since")
    assert consume(tmp_path, "step", ["c"]) is False and (tmp_path / "c").read_text() == "rewritten since"
    assert run_step(tmp_path, "step", {"key": 1}, work)[1] == "done" and len(runs) == 2  # c changed: redone
    assert run_step(tmp_path, "step", {"key": 1}, work, force=True)[1] == "done" and len(runs) == 3
    assert (tmp_path / "a").read_text() == "a"


def test_a_directory_of_the_older_layout_is_brought_to_the_new_one(recipe, tmp_path, monkeypatch):
    """Before, encode kept plain train.{src,tgt} and the fetched text stayed: the next prepare
    (encode's format changed) re-encodes, removes the plain copy and consumes the fetched text."""
    run(recipe)
    out = tmp_path / "work" / "prepared"
    (out / "train.en").write_text(train_text(out, "en"))  # as an older nmtkit left it
    monkeypatch.setattr(prep, "ENCODE_FORMAT", prep.ENCODE_FORMAT + 1)
    summary, _ = run(recipe)
    assert summary["steps"] == {"fetch": "done", "spm": "up to date", "encode": "done"}
    assert not (out / "train.en").exists() and not list(out.glob("train.prefilter.*"))
    assert (out / "train.en.gz").is_file()


def test_background_gzip_keeps_the_lines_in_order_and_writes_the_same_bytes_each_time(tmp_path, monkeypatch):
    import threading

    from nmtkit.data import textfiles

    monkeypatch.setattr(textfiles.BackgroundGzip, "BLOCK", 100)  # dozens of blocks handed to the thread
    pairs = [(f"source {i} ünï\u2028x", f"target {i}") for i in range(500)]
    report = textfiles.write_pairs(tmp_path, "a", ("en", "es"), pairs, compressed=True)
    text = "".join(f"source {i} ünï x\n" for i in range(500)).encode()  # a line break inside: a space
    assert gzip.decompress((tmp_path / "a.en.gz").read_bytes()) == text
    assert report["a.en.gz"] == {"lines": 500, "bytes": len(text), "sha256": hashlib.sha256(text).hexdigest()}
    textfiles.write_pairs(tmp_path, "b", ("en", "es"), pairs, compressed=True)
    assert (tmp_path / "a.en.gz").read_bytes() == (tmp_path / "b.en.gz").read_bytes()

    def failing():
        yield from pairs[:300]
        raise KeyboardInterrupt  # killed half way: no file, no thread left

    with pytest.raises(KeyboardInterrupt):
        textfiles.write_pairs(tmp_path, "c", ("en", "es"), failing(), compressed=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.en.gz", "a.es.gz", "b.en.gz", "b.es.gz"]
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("gzip")]


def test_text_written_in_blocks_is_written_line_by_line(tmp_path, monkeypatch):
    from nmtkit.data import textfiles

    monkeypatch.setattr(textfiles, "WRITE_PAIRS", 3)  # blocks with and without a line break inside
    pairs = [("a", "b"), ("c\r\nd", "e"), ("f", "g\u2028h"), ("i\x85", "ü"), ("k", "l"), ("m", "\ud800 n"), ("o", "p")]
    report = textfiles.write_pairs(tmp_path, "t", ("en", "es"), pairs)
    for side, lang in enumerate(("en", "es")):
        text = b"".join((textfiles._LINE_BREAKS.sub(" ", pair[side]) + "\n").encode("utf-8", errors="replace")
                        for pair in pairs)
        assert (tmp_path / f"t.{lang}").read_bytes() == text
        assert report[f"t.{lang}"] == {"lines": 7, "bytes": len(text), "sha256": hashlib.sha256(text).hexdigest()}


def test_without_dedup_the_summary_says_duplicates_were_not_checked(recipe):
    """clean.dedup=false turns off the duplicate and held-out filters: "0" would read as none found."""
    summary, printed = run(recipe, "data.clean.dedup=false")
    rows = [" ".join(line.split()) for line in printed.splitlines() if "dropped:" in line]
    assert any("dropped: heldout" in row and "not checked (clean.dedup=false)" in row for row in rows), printed
    assert any("dropped: duplicate" in row and "not checked" in row for row in rows)
    assert summary["settings"]["data"]["clean"]["dedup"] is False
    _, printed = run(recipe)
    assert "not checked" not in printed
