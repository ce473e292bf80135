"""Back-translation and distillation end to end through the CLI, as README documents them:
translate a corpus with one model, train another on the result."""
from __future__ import annotations

import gzip
from pathlib import Path

import yaml

from conftest import reversal_pairs, sequences, train_tiny, write_pairs
from support.cli import cli_in_process


def nmtkit(monkeypatch, capsys, *args: str) -> str:
    code, out, err = cli_in_process(monkeypatch, capsys, *args)
    assert code == 0, err
    return out


def recipe_file(root: Path, name: str, data: dict, **sections) -> Path:
    recipe = {"name": name, "workdir": str(root / name), "data": {"src_lang": "src", "tgt_lang": "tgt", **data},
              "vocab": {"size": 16, "workers": 1},
              "model": {"d_model": 32, "ffn_dim": 64, "heads": 2, "encoder_layers": 1, "decoder_layers": 2,
                        "dropout": 0.0, "max_positions": 64},
              "train": {"max_tokens": 400, "max_steps": 4, "warmup": 2, "lr": 3e-3, "log_every": 2,
                        "validate_every": 4, "save_every": 2, "dtype": "float32", "average_last": 2},
              "decode": {"beam_size": 2, "max_len_b": 12}}
    for key, values in sections.items():
        recipe[key] = {**recipe[key], **values}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def heldout(root: Path) -> dict:
    pairs = reversal_pairs(12, 7, length=6)
    return {"dev": write_pairs(root, "dev", pairs[:6]), "test": write_pairs(root, "test", pairs[6:])}


def test_back_translation_sampled_tagged_and_trained_on(tmp_path, reversal_spm, monkeypatch, capsys):
    reverse = train_tiny(reversal_spm, tmp_path / "reverse", steps=60)
    mono = tmp_path / "mono.tgt"
    mono.write_text("".join(s + "\n" for s in sequences(30, 5, length=6)), encoding="utf-8")
    sampled = [tmp_path / f"bt{seed}.src" for seed in (1, 1, 2)]
    for seed, out in zip((1, 1, 2), sampled):
        nmtkit(monkeypatch, capsys, "translate", "-m", str(reverse), "-i", str(mono), "-o", str(out),
               "--sample", "--topk", "3", "--seed", str(seed))
    lines = sampled[0].read_text(encoding="utf-8").splitlines()
    assert len(lines) == 30 and sampled[0].read_bytes() == sampled[1].read_bytes()  # seeded: reproducible
    assert sampled[2].read_bytes() != sampled[0].read_bytes()

    real = write_pairs(tmp_path, "real", reversal_pairs(60, 3, length=6))
    corpora = [{"name": "real", "source": "files", "files": {"train": real, **heldout(tmp_path)}},
               {"name": "bt", "source": "files", "tag": "<bt>",
                "files": {"train": {"src": str(sampled[0]), "tgt": str(mono)}}}]
    recipe = recipe_file(tmp_path, "forward", {"corpora": corpora})
    nmtkit(monkeypatch, capsys, "run", str(recipe))
    prepared = tmp_path / "forward" / "prepared"
    trained_on = gzip.decompress((prepared / "train.src.gz").read_bytes()).decode().splitlines()
    bt_lines = [line[len("<bt> "):] for line in trained_on if line.startswith("<bt> ")]
    import json

    kept = {c["name"]: c["kept"] for c in json.loads((prepared / "manifest.json").read_text())["corpora"]}
    assert len(bt_lines) == kept["bt"] > 0 and set(bt_lines) <= set(lines)  # every kept synthetic pair, tagged
    assert len(trained_on) == kept["bt"] + kept["real"]
    from nmtkit.data.vocab import Vocab

    vocab = Vocab(prepared / "spm.model")
    assert "<bt>" in vocab.pieces(vocab.encode("<bt> a b")) and vocab.is_reserved("<bt>")  # one piece, never split
    results = (tmp_path / "forward" / "results" / "test.hyp").read_text(encoding="utf-8").splitlines()
    assert len(results) == 6


def test_distillation_student_trains_on_teacher_translations_with_its_vocabulary(tmp_path, monkeypatch, capsys):
    files = {"train": write_pairs(tmp_path, "train", reversal_pairs(80, 3, length=6)), **heldout(tmp_path)}
    teacher_recipe = recipe_file(tmp_path, "teacher", {"source": "files", "files": files})
    nmtkit(monkeypatch, capsys, "run", str(teacher_recipe))
    teacher = tmp_path / "teacher"
    sources = tmp_path / "distill.src"
    sources.write_bytes(gzip.decompress((teacher / "prepared" / "train.src.gz").read_bytes()))
    translations = tmp_path / "distill.tgt"
    nmtkit(monkeypatch, capsys, "translate", "-m", str(teacher / "train" / "averaged"), "-i", str(sources),
           "-o", str(translations))
    assert len(translations.read_text(encoding="utf-8").splitlines()) == len(sources.read_text().splitlines())

    student_files = {"train": {"src": str(sources), "tgt": str(translations)}, **heldout(tmp_path)}
    student_recipe = recipe_file(tmp_path, "student", {"source": "files", "files": student_files},
                                 vocab={"from": str(teacher / "prepared")}, model={"decoder_layers": 1})
    nmtkit(monkeypatch, capsys, "run", str(student_recipe))
    student = tmp_path / "student"
    assert (student / "prepared" / "spm.model").read_bytes() == (teacher / "prepared" / "spm.model").read_bytes()
    import numpy as np

    for split in ("dev", "test"):  # the same pieces: ids identical to the teacher's encoding
        with np.load(student / "prepared" / f"{split}.npz") as got, np.load(teacher / "prepared" / f"{split}.npz") as want:
            assert all(np.array_equal(got[key], want[key]) for key in want.files)
    import json

    size = {who: json.loads((tmp_path / who / "results" / "results.json").read_text())["parameters"]
            for who in ("teacher", "student")}
    assert size["student"] < size["teacher"]
