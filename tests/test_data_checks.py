"""What training refuses to guess about its data: a manifest that always records its settings
but lost them, a corpus tag that is also text of the data, and an epoch of weighted corpora
too small for one update (with advice that can help)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import tiny_recipe, two_corpora
from nmtkit.config import from_dict
from nmtkit.data.corpora import CorpusStream
from nmtkit.errors import DataError
from nmtkit.training.failures import too_few_batches
from nmtkit.training.startup import check_prepared_settings
from support.text_io import quiet_console


def test_a_manifest_that_lost_its_settings_is_an_error_not_an_old_manifest(tmp_path):
    cfg = from_dict(tiny_recipe(tmp_path))
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    manifest = prepared / "manifest.json"
    manifest.write_text(json.dumps({"format": 1, "source": "files"}))
    check_prepared_settings(cfg, prepared)  # an older nmtkit's manifest: nothing to check against
    for settings in ({}, None, "data"):
        record = {"format": 1, "manifest": 2, "source": "files", **({"settings": settings} if settings != {} else {})}
        manifest.write_text(json.dumps(record))
        with pytest.raises(DataError, match="its settings are missing or not a mapping"):
            check_prepared_settings(cfg, prepared)


@pytest.mark.parametrize("side, where", [("src", "train"), ("tgt", "train"), ("src", "dev"), ("tgt", "test")])
def test_a_corpus_tag_that_occurs_in_the_data_is_refused(tmp_path, side, where):
    recipe = two_corpora(tmp_path)
    files = recipe["data"]["corpora"][1]["files"][where]
    path = Path(files[side])
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[1] = f"{lines[1]} <2r>" if side == "src" else f"x<2r>y {lines[1]}"
    planted = tmp_path / f"planted.{side}"
    planted.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    recipe["data"]["corpora"][1]["files"][where] = {**files, side: str(planted)}
    recipe.pop("_sizes")
    stream = CorpusStream(from_dict(recipe).data) if where == "train" else None
    if stream is not None:
        with pytest.raises(DataError, match=r"the corpus tag '<2r>' occurs in the text of corpus copy"):
            list(stream.train())
    else:
        with pytest.raises(DataError, match=r"the corpus tag '<2r>' occurs in the text of corpus copy"):
            CorpusStream(from_dict(recipe).data)


def test_untouched_corpora_stream_with_their_tags(tmp_path):
    recipe = two_corpora(tmp_path)
    sizes = recipe.pop("_sizes")
    pairs = list(CorpusStream(from_dict(recipe).data).train())
    assert {src.split()[0] for src, _ in pairs} == {"<2r>", "<2c>"} and len(pairs) >= sum(sizes) - 3


def test_an_epoch_too_small_for_an_update_gives_advice_that_can_help():
    tiny = too_few_batches(0, 0, 2, 400, weighted=True)
    assert "epoch has only 0 (0 pairs)" in tiny and "raise the data.corpora weights" in tiny
    assert "max_tokens" not in tiny  # smaller batches cannot make pairs that are not there
    assert "max_tokens" not in too_few_batches(1, 1, 4, 400, weighted=False)
    assert "lower train.max_tokens (now 400)" in too_few_batches(1, 30, 2, 400, weighted=True)


def test_a_corpus_weighted_to_nothing_stops_training_with_the_weights_advice(tmp_path, monkeypatch, capsys):
    from support.cli import cli_in_process
    from nmtkit.data.prepare import prepare

    recipe = two_corpora(tmp_path)
    recipe.pop("_sizes")
    for corpus in recipe["data"]["corpora"]:
        corpus["weight"] = 0.000001
    recipe = {**tiny_recipe(Path(recipe["workdir"]), vocab={"size": 20}, model={"d_model": 16, "ffn_dim": 32},
                            train={"max_steps": 2, "update_freq": 2, "threads": 1}), "data": recipe["data"]}
    prepare(from_dict(recipe), quiet_console())
    manifest = json.loads((Path(recipe["workdir"]) / "prepared" / "manifest.json").read_text())
    assert manifest["manifest"] == 2 and isinstance(manifest["settings"], dict)  # what train checks against
    path = tmp_path / "r.yaml"
    path.write_text(json.dumps(recipe), encoding="utf-8")
    code, _, err = cli_in_process(monkeypatch, capsys, "train", str(path))
    assert code == 2 and err.splitlines()[-1].startswith("nmtkit: error: ") and "Traceback" not in err, err
    assert "epoch has only 0 (0 pairs)" in err and "raise the data.corpora weights" in err

