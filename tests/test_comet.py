"""COMET through `nmtkit score` and `nmtkit run`: with unbabel-comet installed, a tiny COMET model
built here in the package's own format (a regression metric over a 2-layer XLM-R encoder with a
SentencePiece vocabulary trained here) gives, through nmtkit, exactly what COMET's own
``predict`` gives, segment by segment, with a paired test; without the package, or without a
model directory, one line says what to install or fetch."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from support.cli import run_cli

HAS_COMET = importlib.util.find_spec("comet") is not None
SOURCES = ["el gato se sentó", "la casa es roja", "mañana llueve", "el perro come", "hola mundo"]
REFS = ["the cat sat down", "the house is red", "it rains tomorrow", "the dog eats", "hello world"]
HYPS = ["the cat sat", "the house is red", "tomorrow rain", "a dog eats", "hello world"]
BASE = ["cat", "house red", "rain", "dog", "hello"]


def build_tiny_comet(root: Path) -> Path:
    """A COMET regression model in the layout ``comet.download_model`` leaves (hparams.yaml,
    checkpoints/model.ckpt), its encoder a local directory: random weights, real code path."""
    import pytorch_lightning as pl
    import sentencepiece as spm
    import torch
    import yaml
    from comet.models import RegressionMetric
    from transformers import XLMRobertaConfig, XLMRobertaTokenizer

    root.mkdir(parents=True, exist_ok=True)
    text = root / "text.txt"
    text.write_text("".join(f"{s} {r} {h} {i}\n" for i in range(40) for s, r, h in zip(SOURCES, REFS, HYPS)),
                    encoding="utf-8")
    spm.SentencePieceTrainer.Train(input=str(text), model_prefix=str(root / "sp"), vocab_size=60, minloglevel=2)
    encoder = root / "encoder"
    tokenizer = XLMRobertaTokenizer(vocab_file=str(root / "sp.model"))
    tokenizer.save_pretrained(encoder)
    XLMRobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=130, pad_token_id=tokenizer.pad_token_id,
                     bos_token_id=0, eos_token_id=2).save_pretrained(encoder)
    torch.manual_seed(0)
    model = RegressionMetric(pretrained_model=str(encoder), hidden_sizes=[16], load_pretrained_weights=False,
                             local_files_only=True, layer="mix", pool="avg", dropout=0.0)
    model_dir = root / "tiny-comet"
    (model_dir / "checkpoints").mkdir(parents=True)
    hparams = dict(model.hparams)
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": hparams,
                "pytorch-lightning_version": pl.__version__}, model_dir / "checkpoints" / "model.ckpt")
    (model_dir / "hparams.yaml").write_text(yaml.safe_dump({"class_identifier": "regression_metric", **hparams}))
    return model_dir


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.fixture()
def files(tmp_path) -> dict[str, str]:
    return {"src": write(tmp_path / "src.txt", SOURCES), "ref": write(tmp_path / "ref.txt", REFS),
            "hyp": write(tmp_path / "hyp.txt", HYPS), "base": write(tmp_path / "base.txt", BASE)}


@pytest.mark.skipif(not HAS_COMET, reason="unbabel-comet is not installed (optional extra nmtkit[comet])")
def test_comet_scores_equal_comets_own_predict(files, tmp_path):
    from comet import load_from_checkpoint

    model_dir = build_tiny_comet(tmp_path / "comet")
    segments = tmp_path / "segments.jsonl"
    result = run_cli("score", "--json", "-r", files["ref"], "-i", files["hyp"], "-s", files["src"],
                     "--metrics", "bleu,comet", "--comet-model", str(model_dir), "--comet-batch-size", "2",
                     "--segments", str(segments), "--baseline", files["base"], "--resamples", "100")
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)

    reference = load_from_checkpoint(str(model_dir / "checkpoints" / "model.ckpt"), local_files_only=True)
    expected = reference.predict([{"src": s, "mt": h, "ref": r} for s, h, r in zip(SOURCES, HYPS, REFS)],
                                 batch_size=2, gpus=0, progress_bar=False)
    rows = [json.loads(line) for line in segments.read_text().splitlines()]
    assert [row["comet"] for row in rows] == pytest.approx(list(expected.scores), abs=1e-6)
    assert report["scores"]["comet"]["score"] == pytest.approx(expected.system_score, abs=1e-6)
    assert report["scores"]["comet"]["signature"].startswith("comet|model:tiny-comet|version:")
    comet = report["significance"]["metrics"]["comet"]
    assert comet["system"] == pytest.approx(expected.system_score, abs=1e-6)
    baseline = reference.predict([{"src": s, "mt": h, "ref": r} for s, h, r in zip(SOURCES, BASE, REFS)],
                                 batch_size=2, gpus=0, progress_bar=False)
    assert comet["baseline"] == pytest.approx(baseline.system_score, abs=1e-6)
    assert 0 < comet["p_value"] <= 1


@pytest.mark.skipif(HAS_COMET, reason="unbabel-comet is installed here")
def test_without_the_package_comet_is_one_line_naming_the_extra(files, tmp_path):
    model_dir = tmp_path / "some-comet"
    (model_dir / "checkpoints").mkdir(parents=True)
    (model_dir / "checkpoints" / "model.ckpt").write_bytes(b"not read: the package is missing")
    (model_dir / "hparams.yaml").write_text("class_identifier: regression_metric\n")
    result = run_cli("score", "-r", files["ref"], "-i", files["hyp"], "-s", files["src"], "--metrics", "comet",
                     "--comet-model", str(model_dir))
    err = result.stderr.decode().strip()
    assert result.returncode == 2 and err == "nmtkit: error: COMET needs the unbabel-comet package: " \
                                             "pip install 'nmtkit[comet]'", err


def test_a_missing_comet_model_directory_is_one_line(files, tmp_path):
    result = run_cli("score", "-r", files["ref"], "-i", files["hyp"], "-s", files["src"], "--metrics", "comet",
                     "--comet-model", str(tmp_path / "nowhere"))
    err = result.stderr.decode().strip()
    assert result.returncode == 2 and len(err.splitlines()) == 1, err
    assert f"no COMET model at {tmp_path / 'nowhere'}: expected a directory holding checkpoints/model.ckpt" in err


def test_a_recipe_naming_comet_needs_its_model(tmp_path):
    from nmtkit.config import load_config
    from nmtkit.errors import ConfigError

    overrides = ["data.source=sword"]
    with pytest.raises(ConfigError, match="eval.metrics names comet but eval.comet_model is empty"):
        load_config(None, [*overrides, "eval.metrics=bleu,comet"])
    with pytest.raises(ConfigError, match="eval.comet_model is set but eval.metrics does not name comet"):
        load_config(None, [*overrides, f"eval.comet_model={tmp_path}"])
    cfg = load_config(None, [*overrides, "eval.metrics=chrf++,comet", f"eval.comet_model={tmp_path}"])
    assert cfg.eval.metric_names() == ["bleu", "chrf++", "comet"]


@pytest.mark.skipif(not HAS_COMET, reason="unbabel-comet is not installed (optional extra nmtkit[comet])")
def test_run_scores_dev_and_test_with_comet_from_the_recipe(tmp_path):
    from comet import load_from_checkpoint
    from conftest import reversal_pairs, tiny_recipe

    from nmtkit.config import from_dict
    from nmtkit.runtime.console import get_console
    from nmtkit.pipeline import run_recipe

    model_dir = build_tiny_comet(tmp_path / "comet")
    files = {}
    for split, pairs in (("train", reversal_pairs(200, 0, length=5)), ("dev", reversal_pairs(6, 1, length=5)),
                         ("test", reversal_pairs(6, 2, length=5))):
        files[split] = {lang: write(tmp_path / f"{split}.{lang}", [pair[side] for pair in pairs])
                        for lang, side in (("src", 0), ("tgt", 1))}
    recipe = tiny_recipe(tmp_path / "work", data={"files": files}, train={"max_steps": 4, "save_every": 4,
                                                                          "validate_every": 4, "average_last": 1},
                         eval={"metrics": "bleu,comet", "comet_model": str(model_dir), "comet_batch_size": 4})
    results = run_recipe(from_dict(recipe), get_console(-1))
    scorer = load_from_checkpoint(str(model_dir / "checkpoints" / "model.ckpt"), local_files_only=True)
    for split in ("dev", "test"):
        hyps = (tmp_path / "work" / "results" / f"{split}.hyp").read_text().splitlines()
        sources = (tmp_path / f"{split}.src").read_text().splitlines()
        refs = (tmp_path / f"{split}.tgt").read_text().splitlines()
        expected = scorer.predict([{"src": s, "mt": h, "ref": r} for s, h, r in zip(sources, hyps, refs)],
                                  batch_size=4, gpus=0, progress_bar=False)
        assert results["splits"][split]["comet"]["score"] == pytest.approx(round(expected.system_score, 4), abs=1e-4)
    assert "| split | sentences | BLEU | COMET |" in (tmp_path / "work" / "results" / "results.md").read_text()
