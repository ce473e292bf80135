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


@pytest.mark.parametrize("tokens, why", [({"train": {"source": 5}}, "tokens.train must give src and tgt counts"),
                                         ({"train": 7}, "tokens.train must give src and tgt counts"),
                                         ([1, 2], "tokens must be a mapping")])
def test_a_manifest_of_the_wrong_shape_is_left_out_with_a_warning(run_model, monkeypatch, capsys, tokens, why):
    path = manifest(run_model, tokens)
    code, out, err = cli_in_process(monkeypatch, capsys, "info", str(run_model))
    assert code == 0 and "Traceback" not in err, err
    assert f"warning: data left out: {path}: unexpected content (TypeError: {why}" in " ".join(err.split())
    assert "model card" in out and "data: train" not in out
    code, out, _ = cli_in_process(monkeypatch, capsys, "info", str(run_model), "--json")
    assert code == 0 and "data" not in json.loads(out)
    manifest(run_model, {"train": {"src": 5, "tgt": 6}})  # as prepare writes it
    code, out, err = cli_in_process(monkeypatch, capsys, "info", str(run_model))
    assert code == 0 and "warning" not in err and "7 pairs, 5 / 6 tokens" in out


@pytest.mark.parametrize("key, value, kind", [("step", {"score": 1}, "a count"), ("dev_bleu", "high", "a number"),
                                              ("averaged_from", "step_1", "a list of checkpoint names")])
def test_a_saved_at_value_of_the_wrong_kind_is_left_out_with_a_warning(tmp_path, model_dir, monkeypatch, capsys,
                                                                       key, value, kind):
    """An old or hand-edited config.json (its checksums rewritten to match)."""
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    meta = json.loads((model / "config.json").read_text())
    meta.update({key: value, "dev_loss": 2.5})
    (model / "config.json").write_text(json.dumps(meta))
    write_manifest(model, [p.name for p in model.iterdir() if p.name != "checksums.json"])
    code, out, err = cli_in_process(monkeypatch, capsys, "info", str(model))
    assert code == 0 and "Traceback" not in err, err
    assert f"warning: {model}: its {key} is not {kind} ({value}): left out of the card" in " ".join(err.split())
    card = json.loads(cli_in_process(monkeypatch, capsys, "info", str(model), "--json")[1])
    assert card["checkpoint"] == {"dev_loss": 2.5}


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
