"""`nmtkit info` on metadata it did not expect: a value of the wrong kind in a run's data
manifest or a model's config.json is left out of the card with a warning naming it, and an
export that cannot say what model it is is one line; never a traceback."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import save_tiny_model, tiny_recipe
from nmtkit.storage.checksums import write_manifest
from support.cli import assert_error, cli_in_process


@pytest.fixture
def run_model(tmp_path, tiny_spm) -> Path:
    """best/ of a run in a work directory: the card reads the run's config, metrics and data manifest."""
    work = tmp_path / "work"
    best = save_tiny_model(work / "train" / "best", tiny_spm, seed=0)
    (work / "train" / "config.yaml").write_text(yaml.safe_dump(tiny_recipe(work)))
    (work / "train" / "metrics.jsonl").write_text('{"type": "train", "step": 10, "loss": 3.0, "lr": 0.001}\n')
    (work / "prepared").mkdir()
    return best


def manifest(run_model: Path, tokens) -> Path:
    path = run_model.parent.parent / "prepared" / "manifest.json"
    path.write_text(json.dumps({"source": "files", "splits": {"train": {"pairs": 7}}, "tokens": tokens}))
    return path


@pytest.mark.parametrize("tokens, why", [
    ({"train": {"source": 5}}, "tokens.train must give src and tgt counts, got {'source': 5}"),
    ({"train": 7}, "tokens.train must give src and tgt counts, got 7"),
    ([1, 2], "tokens must be a mapping, got [1, 2]"),
    ({"train": {"src": "[/x]"}}, "tokens.train must give src and tgt counts, got {'src': '[/x]'}"),  # not markup
    ({"train": {"src": "[bold]5", "tgt": 6}}, "tokens.train must give src and tgt counts, got {'src': '[bold]5', "
                                              "'tgt': 6}"),
], ids=["keys", "count", "list", "closing-tag", "style-tag"])
def test_a_manifest_of_the_wrong_shape_is_left_out_with_a_warning(run_model, monkeypatch, capsys, tokens, why):
    path = manifest(run_model, tokens)
    code, out, err = cli_in_process(monkeypatch, capsys, "info", str(run_model))
    assert code == 0 and "Traceback" not in err, err
    assert err.splitlines() == [f"warning: data left out: {path}: unexpected content (TypeError: {why})"]
    assert "model card" in out and "data: train" not in out
    code, out, _ = cli_in_process(monkeypatch, capsys, "info", str(run_model), "--json")
    assert code == 0 and "data" not in json.loads(out)
    manifest(run_model, {"train": {"src": 5, "tgt": 6}})  # as prepare writes it
    code, out, err = cli_in_process(monkeypatch, capsys, "info", str(run_model))
    assert code == 0 and "warning" not in err and "7 pairs, 5 / 6 tokens" in out


def test_a_warning_quoting_a_name_with_a_newline_stays_one_line(run_model, monkeypatch, capsys):
    """Every warning is one line, whatever it quotes: a split named with a newline in a manifest."""
    path = manifest(run_model, {})
    path.write_text(json.dumps({"source": "files", "splits": {"tr\nain": {"pairs": "x"}}}))
    code, out, err = cli_in_process(monkeypatch, capsys, "info", str(run_model))
    assert code == 0 and err.splitlines() == [
        f"warning: data left out: {path}: unexpected content (TypeError: splits.tr\\nain must give a count of pairs, "
        f"got {{'pairs': 'x'}})"]


@pytest.mark.parametrize("key, value, kind, shown", [
    ("step", {"score": 1}, "a count", "{'score': 1}"), ("dev_bleu", "high", "a number", "'high'"),
    ("averaged_from", "step_1", "a list of checkpoint names", "'step_1'"),
    ("dev_bleu", float("nan"), "a number", "nan"),  # JSON lets NaN in; the card's --json could not hold it
    ("dev_bleu", "a\nb", "a number", "'a\\nb'"),  # one line, not two
    ("step", "x[/]", "a count", "'x[/]'"),  # rich markup: shown as it is, not a MarkupError's traceback
    ("dev_loss", "é" * 200, "a number", "'" + "\\xe9" * 19 + "..."),  # bounded
], ids=["dict", "text", "name", "nan", "newline", "markup", "long"])
def test_a_saved_at_value_of_the_wrong_kind_is_left_out_with_a_warning(tmp_path, model_dir, monkeypatch, capsys,
                                                                       key, value, kind, shown):
    """An old or hand-edited config.json (its checksums rewritten to match): the value is shown
    as its repr, cut short, on the warning's one line."""
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    meta = json.loads((model / "config.json").read_text())
    meta.update({"dev_loss": 2.5, key: value})
    (model / "config.json").write_text(json.dumps(meta))
    write_manifest(model, [p.name for p in model.iterdir() if p.name != "checksums.json"])
    code, out, err = cli_in_process(monkeypatch, capsys, "info", str(model))
    assert code == 0 and "Traceback" not in err, err
    assert err.splitlines() == [f"warning: {model}: its {key} is not {kind} ({shown}): left out of the card"]
    card = json.loads(cli_in_process(monkeypatch, capsys, "info", str(model), "--json")[1])
    assert card["checkpoint"] == ({"dev_loss": 2.5} if key != "dev_loss" else {})


def test_an_export_that_cannot_say_what_model_it_is_is_one_line(tmp_path, tiny_spm, monkeypatch, capsys):
    """A CTranslate2 export's nmtkit.json without the model config, its source model gone."""
    export = tmp_path / "ct2"
    export.mkdir()
    shutil.copyfile(tiny_spm, export / "spm.model")
    (export / "nmtkit.json").write_text(json.dumps({"format": "ctranslate2", "spm": {"src": "spm.model",
                                                    "tgt": "spm.model"}, "source_model": str(tmp_path / "gone")}))
    code, _, err = cli_in_process(monkeypatch, capsys, "info", str(export))
    assert_error(code, err, 2, f"{export}: its nmtkit.json holds no model config and its source model "
                               f"{tmp_path / 'gone'} is gone: nothing tells what model it is; export the model again")
