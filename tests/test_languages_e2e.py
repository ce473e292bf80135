"""Other scripts end to end: byte fallback carries characters no training text showed through
prepare -> train -> translate as themselves (never as <unk>), prepare counts unknown pieces per
split, and a task written in Greek and Chinese trains, translates and is scored with the Chinese
tokenizer, dev BLEU during training the same way as test."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from conftest import reversal_pairs, tiny_recipe
from support.cli import run_cli

from nmtkit.config import from_dict
from nmtkit.runtime.console import get_console
from nmtkit.scoring.metrics import corpus_scores

# never in any training text: Devanagari (a block no training character comes from), CJK, emoji
UNSEEN = ["न म स", "क ख", "中 文", "你 好", "😀 🎉", "🙂"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _new_script_pool(rng: random.Random) -> list[str]:
    """Characters of many scripts (2-, 3- and 4-byte UTF-8) for the copy task, none of UNSEEN's
    and none from the Devanagari block: every byte value occurs, in many combinations."""
    banned = set("".join(UNSEEN))

    def usable(code: int) -> bool:
        char = chr(code)
        return char.isprintable() and not char.isspace() and char not in banned and not 0x0900 <= code <= 0x097F

    pool = [chr(c) for c in range(0x00A1, 0x0800) if usable(c)]
    pool += [chr(c) for c in rng.sample(range(0x0800, 0xD7FF), 3000) if usable(c)]
    return pool + [chr(c) for c in range(0x1F300, 0x1F650) if usable(c)]


def _write_copy_task(root: Path, name: str, make, train: int) -> dict:
    """A copy task (target = source) as files; returns data.files for a recipe."""
    files = {}
    for split, count in (("train", train), ("dev", 20), ("test", 20)):
        lines = [make() for _ in range(count)]
        files[split] = {}
        for lang in ("src", "tgt"):
            path = root / f"{name}.{split}.{lang}"
            path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            files[split][lang] = str(path)
    return files


MODEL = {"d_model": 32, "ffn_dim": 64, "heads": 2, "encoder_layers": 1, "decoder_layers": 1, "dropout": 0.0,
         "max_positions": 64}


def _recipe(root: Path, name: str, files: dict, vocab: dict, steps: int) -> dict:
    return {"name": name, "workdir": str(root / name),
            "data": {"source": "files", "src_lang": "src", "tgt_lang": "tgt", "files": files},
            "vocab": {"workers": 1, **vocab}, "model": MODEL,
            "train": {"max_tokens": 1000, "max_steps": steps, "schedule": "inverse_sqrt", "lr": 0.008, "warmup": 100,
                      "label_smoothing": 0.0, "log_every": steps, "validate_every": steps, "save_every": steps,
                      "dtype": "float32", "seed": 1, "best_metric": "loss"},
            "decode": {"beam_size": 1, "max_len_b": 30}}


def _prepare(recipe: dict) -> dict:
    from nmtkit.data.prepare import prepare

    return prepare(from_dict(recipe), get_console(-1))


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> dict:
    """Latin text prepared with byte fallback (the vocabulary a model of one script has), and a
    copy task in many other scripts prepared with that vocabulary (vocab.from), as when a model
    is fine-tuned on a new script."""
    root = tmp_path_factory.mktemp("scripts")
    rng = random.Random(0)

    def latin() -> str:
        return " ".join("".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 6)))
                        for _ in range(rng.randint(2, 5)))

    pool = _new_script_pool(rng)
    latin_files = _write_copy_task(root, "latin", latin, 2000)
    other_files = _write_copy_task(root, "other", lambda: " ".join(rng.choice(pool) for _ in range(rng.randint(1, 3))),
                                   8000)
    latin_recipe = _recipe(root, "latin", latin_files, {"size": 300, "byte_fallback": True}, 1)
    _prepare(latin_recipe)
    other = _recipe(root, "other", other_files, {"size": 300, "from": str(root / "latin" / "prepared")}, 800)
    return {"root": root, "latin": latin_recipe, "other": other, "other_files": other_files,
            "latin_files": latin_files, "manifest": _prepare(other)}


def test_unseen_characters_are_bytes_not_unknown_pieces(scripts):
    from nmtkit.data.vocab import Vocab

    vocab = Vocab(Path(scripts["latin"]["workdir"]) / "prepared" / "spm.model")
    assert vocab.byte_fallback and len(vocab) == 300
    for line in UNSEEN:
        ids = vocab.encode(line)
        assert 1 not in ids and vocab.decode(ids) == line  # <unk> is id 1
        assert sum(vocab.sp.IsByte(i) for i in ids) == len(line.replace(" ", "").encode("utf-8"))
    manifest = scripts["manifest"]
    assert manifest["vocab"]["byte_fallback"] is True
    assert manifest["unknown"] == {split: {"src": 0, "tgt": 0} for split in ("train", "dev", "test")}


def test_without_byte_fallback_prepare_counts_the_unknown_pieces_per_split(scripts):
    root = scripts["root"]
    latin = _recipe(root, "latin-nobytes", scripts["latin_files"], {"size": 40, "byte_fallback": False}, 1)
    _prepare(latin)
    other = _recipe(root, "other-nobytes", scripts["other_files"],
                    {"size": 40, "from": str(root / "latin-nobytes" / "prepared")}, 1)
    result = run_cli("prepare", _write_yaml(root / "other-nobytes.yaml", other))
    assert result.returncode == 0, result.stderr.decode()
    manifest = json.loads((root / "other-nobytes" / "prepared" / "manifest.json").read_text())
    assert manifest["vocab"]["byte_fallback"] is False
    for split in ("train", "dev", "test"):
        text = Path(scripts["other_files"][split]["src"]).read_text(encoding="utf-8")
        characters = sum(1 for char in text if not char.isspace())  # each unseen character is one <unk>
        assert 0 < manifest["unknown"][split]["src"] <= characters
    shown = result.stderr.decode()
    counts = ", ".join(f"{split} {manifest['unknown'][split]['src']:,} src / {manifest['unknown'][split]['tgt']:,} tgt"
                       for split in ("train", "dev", "test"))
    assert f"unknown pieces (<unk>): {counts}" in " ".join(shown.split())


def _write_yaml(path: Path, recipe: dict) -> str:
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True), encoding="utf-8")
    return str(path)


def test_unseen_characters_come_out_as_themselves_after_training(scripts, tmp_path):
    from nmtkit.training.trainer import train

    run_dir = train(from_dict(scripts["other"]), get_console(-1))
    source = tmp_path / "unseen.txt"
    source.write_text("".join(line + "\n" for line in UNSEEN), encoding="utf-8")
    result = run_cli("translate", "-m", str(run_dir / "best"), "-i", str(source), "--device", "cpu",
                     "--dtype", "float32")
    assert result.returncode == 0, result.stderr.decode()
    outputs = result.stdout.decode("utf-8").splitlines()
    assert len(outputs) == len(UNSEEN) and not any("⁇" in line for line in outputs)
    for line, output in zip(UNSEEN, outputs):  # each character, copied through its UTF-8 bytes
        assert all(char in output for char in line.split()), (line, output)
    assert sum(output == line for line, output in zip(UNSEEN, outputs)) >= len(UNSEEN) - 1, outputs


# --- a task in Greek and Chinese, scored with the Chinese tokenizer ---------------------------------

GREEK = dict(zip("abcdefghij", "αβγδεζηθικ"))
CHINESE = dict(zip("abcdefghij", "甲乙丙丁戊己庚辛壬癸"))


def _written(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Reversal with the source in Greek letters (spaced) and the target in Chinese characters
    (unspaced, as Chinese is written): only a tokenizer that splits Chinese sees its words."""
    return [(" ".join(GREEK[s] for s in src.split()), "".join(CHINESE[t] for t in tgt.split())) for src, tgt in pairs]


def test_a_chinese_target_is_trained_and_scored_with_the_chinese_tokenizer(tmp_path):
    from nmtkit.pipeline import run_recipe
    from nmtkit.runlog import read_metrics

    files = {}
    for split, pairs in (("train", reversal_pairs(1500, 0, length=5)), ("dev", reversal_pairs(30, 1, length=5)),
                         ("test", reversal_pairs(30, 2, length=5))):
        files[split] = {}
        for lang, side in (("el", 0), ("zh", 1)):
            path = tmp_path / f"{split}.{lang}"
            path.write_text("".join(pair[side] + "\n" for pair in _written(pairs)), encoding="utf-8")
            files[split][lang] = str(path)
    recipe = tiny_recipe(tmp_path / "work", data={"src_lang": "el", "tgt_lang": "zh", "files": files},
                         vocab={"size": 40, "workers": 1}, model=MODEL,
                         train={"max_steps": 150, "max_tokens": 600, "validate_every": 150, "save_every": 150,
                                "log_every": 150, "best_metric": "bleu", "dev_bleu_beam": 1, "average_last": 1},
                         decode={"beam_size": 1, "max_len_b": 12}, eval={"metrics": "bleu,chrf++"})
    results = run_recipe(from_dict(recipe), get_console(-1))

    work = tmp_path / "work"
    for split in ("dev", "test"):
        hyps = (work / "results" / f"{split}.hyp").read_text(encoding="utf-8").splitlines()
        refs = (tmp_path / f"{split}.zh").read_text(encoding="utf-8").splitlines()
        expected = corpus_scores(hyps, [refs], ["bleu", "chrf++"], tokenize="zh")
        scored = results["splits"][split]
        assert set(scored) == {"sentences", "translate_seconds", "bleu", "chrf++"}
        assert "tok:zh" in scored["bleu"]["signature"]
        assert scored["bleu"]["score"] == round(expected["bleu"]["score"], 2)
        assert scored["chrf++"]["score"] == round(expected["chrf++"]["score"], 2)
        unspaced = corpus_scores(hyps, [refs], ["bleu"], tokenize="13a")["bleu"]["score"]
        assert expected["bleu"]["score"] > 20 and unspaced < expected["bleu"]["score"] / 2
    # dev BLEU during training: the same tokenizer, the same number as `run` gives the best model's dev
    dev_bleu = [record["dev_bleu"] for record in read_metrics(work / "train") if "dev_bleu" in record][-1]
    dev_hyps = (work / "results" / "dev.hyp").read_text(encoding="utf-8").splitlines()
    dev_refs = (tmp_path / "dev.zh").read_text(encoding="utf-8").splitlines()
    assert dev_bleu == round(corpus_scores(dev_hyps, [dev_refs], ["bleu"], tokenize="zh")["bleu"]["score"], 4)
    assert "| split | sentences | BLEU | chrF++ |" in (work / "results" / "results.md").read_text(encoding="utf-8")
