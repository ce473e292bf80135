"""``prepare`` end to end on a tiny generated corpus: layout, counts, round trips, stamps.

The corpus is a word-by-word English->Spanish toy with planted problems, so every cleaning
rule has an exact expected count.
"""
import io
import json
import random
import unicodedata

import numpy as np
import pytest

import nmtkit.data.prepare as prep
from nmtkit.config import load_config
from nmtkit.console import NmtConsole
from nmtkit.data.ids import load_split
from nmtkit.data.vocab import Vocab
from nmtkit.workdir import WorkDir

WORDS = {"the": "el", "cat": "gato", "dog": "perro", "red": "rojo", "big": "grande", "small": "pequeño",
         "sees": "ve", "eats": "come", "house": "casa", "bird": "pájaro", "green": "verde", "runs": "corre"}
EXPECTED = {"empty": 3, "duplicate": 4, "heldout": 2, "too_long": 2, "ratio": 3}


def sentence(rng, number):
    words = [rng.choice(list(WORDS)) for _ in range(rng.randint(3, 7))]
    return f"{' '.join(words)} {number}", f"{' '.join(WORDS[w] for w in words)} {number}"


def write_corpus(root):
    """300 unique train pairs plus planted problems; 20 dev and 20 test pairs."""
    rng = random.Random(7)
    train = [sentence(rng, i) for i in range(300)]
    dev, test = [sentence(rng, 1000 + i) for i in range(20)], [sentence(rng, 2000 + i) for i in range(20)]
    planted = [
        ("", "vacío"), ("nothing", "  "), ("\t", "\u00a0"),  # empty x3
        train[0], (train[1][0].replace(" ", "  "), train[1][1]), train[2], train[0],  # duplicate x4
        dev[0], (" " + test[3][0], test[3][1] + " "),  # heldout x2
        (" ".join(["cat"] * 150), " ".join(["gato"] * 150)),  # too_long x2 (over max_len 120)
        ("dog " * 10 + "x", " ".join(["perro"] * 200)),
        ("cat", " ".join(["gato"] * 40)), ("dog", "perro " * 30 + "y"), ("red bird " * 20, "rojo"),  # ratio x3
        ("cafe\u0301 cat", "cafe\u0301 gato"),  # NFD: kept, written as NFC
    ]
    splits = {"train": train + planted, "dev": dev, "test": test}
    files = {}
    for split, pairs in splits.items():
        files[split] = {}
        for lang, side in (("en", 0), ("es", 1)):
            path = root / f"{split}.{lang}"
            path.write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
            files[split][lang] = str(path)
    return files, splits


@pytest.fixture
def splits(tmp_path):
    return write_corpus(tmp_path)[1]


@pytest.fixture
def recipe(tmp_path, splits):
    files = {split: {lang: str(tmp_path / f"{split}.{lang}") for lang in ("en", "es")} for split in splits}
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps({
        "name": "tiny", "workdir": str(tmp_path / "work"),
        "data": {"source": "files", "files": files, "clean": {"max_len": 120, "max_ratio": 3.0}},
        "vocab": {"size": 60, "workers": 1},
    }))
    return path


def run(recipe, *overrides):
    console = NmtConsole(0, file=io.StringIO(), width=120)
    summary = prep.prepare(load_config(recipe, list(overrides)), console)
    return summary, console.file.getvalue()


def snapshot(root):
    """Modification times of every file but the lock (which records its latest holder's pid)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_layout_counts_and_manifest(recipe, tmp_path):
    summary, printed = run(recipe)
    out = tmp_path / "work" / "prepared"
    for name in ("train.en", "train.es", "dev.en", "dev.es", "test.en", "test.es", "spm.model",
                 "train.npz", "dev.npz", "test.npz", "manifest.json"):
        assert (out / name).is_file(), name
    assert (tmp_path / "work" / "config.yaml").is_file()
    assert summary["cleaning"] == {"read": 315, "dropped": EXPECTED, "kept": 301}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["pairs"] == 301
    assert manifest["splits"]["dev"]["files"]["dev.es"]["lines"] == 20
    assert manifest["vocab"]["size"] == {"src": 60, "tgt": 60}
    assert summary["steps"] == {"fetch": "done", "spm": "done", "encode": "done"}
    for split in ("train", "dev", "test"):
        ids = load_split(out / f"{split}.npz")
        lines = (out / f"{split}.en").read_text().splitlines()
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
    lines = (out / "train.es").read_text(encoding="utf-8").splitlines()
    assert "café cat" in (out / "train.en").read_text(encoding="utf-8")
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
    assert summary["steps"] == {"fetch": "up to date", "spm": "done", "encode": "done"}
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
    run(recipe)
    out = tmp_path / "work" / "prepared"
    fetched = snapshot(out)["train.prefilter.en"]
    summary, _ = run(recipe, "vocab.size=50")
    assert summary["steps"] == {"fetch": "up to date", "spm": "done", "encode": "done"}
    assert snapshot(out)["train.prefilter.en"] == fetched
    summary, _ = run(recipe, "vocab.size=50", "data.clean.max_len=20")
    assert summary["steps"] == {"fetch": "up to date", "spm": "up to date", "encode": "done"}
    assert summary["cleaning"]["dropped"]["too_long"] > EXPECTED["too_long"]
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
    assert summary["steps"] == {"fetch": "up to date", "spm": "up to date", "encode": "done"}
    assert len(load_split(out / "train.npz")) == 301


def test_prepared_dir(recipe):
    cfg = load_config(recipe)
    assert WorkDir.of(cfg).prepared == cfg.work_path / "prepared"


def test_parallel_encoding_matches_single_process(tmp_path, monkeypatch):
    files, _ = write_corpus(tmp_path)
    texts = [line for line in (tmp_path / "train.en").read_text().splitlines() if line.strip()]
    import sentencepiece as spm

    (tmp_path / "corpus.txt").write_text("\n".join(texts))
    spm.SentencePieceTrainer.Train(input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "m"),
                                   vocab_size=40, minloglevel=2, pad_id=0, unk_id=1, bos_id=2, eos_id=3)
    monkeypatch.setattr(prep.Encoder, "CHUNK_LINES", 37)
    models, pairs = (tmp_path / "m.model",) * 2, [(text, text[::-1]) for text in texts]
    with prep.Encoder(1) as one, prep.Encoder(2) as two:
        single, parallel = (list(encoder.encode_pairs(models, pairs)) for encoder in (one, two))
    assert len(single) == len(parallel) == -(-len(texts) // 37)  # chunks, in order
    for a, b in zip(single, parallel):
        assert a.pairs == b.pairs and all(np.array_equal(getattr(a, name), getattr(b, name))
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
    with open(out / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(NmtkitError, match="in use by another `nmtkit prepare`"):
            run(recipe)
