"""Loading never runs code: weights come only from safetensors, configs from JSON, ids from
``.npz`` without pickles. A crafted pickle whose unpickling would create a marker file is put
where nmtkit expects each kind of file; it must be refused with one line, and the marker
must not appear."""
from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import reversal_files, reversal_pairs, tiny_recipe, write_prepared
from support.cli import assert_one_line, cli
from support.damage import MUTATIONS, Payload, copy_work, malicious_pickle, mutate

PACKAGE = Path(__file__).resolve().parent.parent / "nmtkit"
UNSAFE = {  # what must not appear in the package: each of these can run code from a file
    # torch.load only as weights_only=True (plain tensors; MarianMT's pytorch_model.bin), on the call's line
    "torch.load": re.compile(r"\btorch\.load\((?![^\n]*weights_only=True)|\btorch\.jit\.load\("),
    "weights_only=False": re.compile(r"weights_only\s*=\s*False"),
    "pickle-like modules": re.compile(r"^\s*(import|from)\s+(pickle|cPickle|dill|cloudpickle|joblib|marshal|shelve)\b",
                                      re.M),
    "allow_pickle=True": re.compile(r"allow_pickle\s*=\s*True"),
    "np.load without allow_pickle=False": re.compile(r"\b(np|numpy)\.load\((?![^)\n]*allow_pickle=False)"),
    "yaml.load": re.compile(r"\byaml\.(load|unsafe_load|full_load)\(|Loader\s*=\s*yaml\.(Unsafe|Full)?Loader"),
    "eval/exec": re.compile(r"(?<![\w.])(eval|exec)\("),
}


def test_the_package_has_no_code_running_loaders():
    found = [f"{path.relative_to(PACKAGE.parent)}: {what}" for path in sorted(PACKAGE.rglob("*.py"))
             for what, pattern in UNSAFE.items() if pattern.search(path.read_text(encoding="utf-8"))]
    assert not found, found


def malicious_torch_file(marker: Path) -> bytes:
    """What ``torch.save`` writes (a zip around a pickle); ``torch.load(weights_only=False)`` runs it."""
    buffer = io.BytesIO()
    torch.save({"weight": Payload(marker)}, buffer)
    return buffer.getvalue()


def malicious_npz(marker: Path) -> bytes:
    """A real ``.npz`` whose arrays are pickled objects."""
    buffer = io.BytesIO()
    objects = np.empty(1, dtype=object)
    objects[0] = Payload(marker)
    np.savez(buffer, src=objects, src_offsets=objects, tgt=objects, tgt_offsets=objects)
    return buffer.getvalue()


def test_the_payloads_are_live(tmp_path):
    """Control: each crafted file does run its command when loaded the unsafe way."""
    for name, make, unsafe_load in (
            ("pickle", malicious_pickle, lambda data: pickle.loads(data)),
            ("torch", malicious_torch_file, lambda data: torch.load(io.BytesIO(data), weights_only=False)),
            ("npz", malicious_npz, lambda data: np.load(io.BytesIO(data), allow_pickle=True)["src"])):
        marker = tmp_path / f"ran-{name}"
        unsafe_load(make(marker))
        assert marker.exists(), name


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A workdir with prepared data, a checkpoint and best/ after two steps."""
    from nmtkit.config import from_dict
    from nmtkit.runtime.console import get_console
    from nmtkit.training.trainer import train

    workdir = tmp_path_factory.mktemp("trained")
    write_prepared(workdir, reversal_pairs(100, 0, length=5), reversal_pairs(10, 1, length=5))
    recipe = tiny_recipe(workdir, model=dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1),
                         train=dict(max_steps=2, save_every=2, validate_every=2, max_tokens=200))
    (workdir / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    train(from_dict(recipe), get_console(-1))
    return workdir


def plant(path: Path, data: bytes, checksum_in: Path | None = None, key: str = "") -> None:
    """Replace ``path`` by ``data``; with ``checksum_in``, also forge the recorded sha256 there and
    in the directory's checksums.json, as an attacker who controls the whole directory would."""
    path.write_bytes(data)
    if checksum_in is not None:
        meta = json.loads(checksum_in.read_text())
        meta[key] = hashlib.sha256(data).hexdigest()
        checksum_in.write_text(json.dumps(meta))
        forge_manifest(path.parent)


def forge_manifest(directory: Path) -> None:
    """Rewrite ``directory``'s checksums.json so that it vouches for the files as they are now."""
    from nmtkit.storage.checksums import MANIFEST, write_manifest

    write_manifest(directory, json.loads((directory / MANIFEST).read_text())["files"])


MAKERS = {"pickle": malicious_pickle, "torch.save": malicious_torch_file}


@pytest.mark.parametrize("kind", MAKERS)
def test_model_weights_that_are_pickles_are_refused(trained, tmp_path, monkeypatch, capsys, kind):
    model = tmp_path / "model"
    shutil.copytree(trained / "train" / "best", model)
    marker = tmp_path / "ran"
    plant(model / "model.safetensors", MAKERS[kind](marker), model / "config.json", "weights_sha256")
    (tmp_path / "in.txt").write_text("a b c\n")
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(model), "-i", str(tmp_path / "in.txt"))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"nmtkit: error: {model / 'model.safetensors'}: not a readable safetensors file")
    assert not marker.exists()


@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("file_name, checksum_key", [("model.safetensors", "weights_sha256"),
                                                      ("trainer.safetensors", "sha256")])
def test_checkpoint_tensors_that_are_pickles_are_refused(trained, tmp_path, monkeypatch, capsys, kind, file_name,
                                                         checksum_key):
    from nmtkit.errors import CheckpointError
    from nmtkit.training.checkpoint import load_checkpoint

    shutil.copytree(trained, tmp_path / "work")
    checkpoint = tmp_path / "work" / "train" / "checkpoints" / "step_00000002"
    marker = tmp_path / "ran"
    json_file = "config.json" if file_name == "model.safetensors" else "trainer.json"
    plant(checkpoint / file_name, MAKERS[kind](marker), checkpoint / json_file, checksum_key)
    with pytest.raises(CheckpointError, match=f"{file_name}: not a readable safetensors file"):
        load_checkpoint(checkpoint)
    recipe = tmp_path / "work" / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace(str(trained), str(tmp_path / "work")))
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe), "train.max_steps=4")
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("nmtkit: error: no readable checkpoint in")
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["pickle", "npz of objects"])
def test_prepared_ids_that_hold_pickles_are_refused(trained, tmp_path, monkeypatch, capsys, kind):
    shutil.copytree(trained / "prepared", tmp_path / "work" / "prepared")
    marker = tmp_path / "ran"
    (tmp_path / "work" / "prepared" / "train.npz").write_bytes(
        malicious_pickle(marker) if kind == "pickle" else malicious_npz(marker))
    assert kind == "pickle" or zipfile.is_zipfile(tmp_path / "work" / "prepared" / "train.npz")
    recipe = yaml.safe_load((trained / "recipe.yaml").read_text())
    recipe["workdir"] = str(tmp_path / "work")
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    code, err = cli(monkeypatch, capsys, "-q", "train", str(tmp_path / "recipe.yaml"))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"nmtkit: error: {tmp_path / 'work' / 'prepared' / 'train.npz'}: corrupt prepared data")
    assert not marker.exists()


@pytest.mark.parametrize("file_name, fragment", [("config.json", "corrupt model config"),
                                                  ("spm.model", "not a valid SentencePiece model")])
def test_configs_and_vocabularies_that_are_pickles_are_refused(trained, tmp_path, monkeypatch, capsys, file_name,
                                                               fragment):
    model = tmp_path / "model"
    shutil.copytree(trained / "train" / "best", model)
    marker = tmp_path / "ran"
    (model / file_name).write_bytes(malicious_pickle(marker))
    forge_manifest(model)
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(model), "-i", str(trained / "recipe.yaml"))
    assert code in (1, 2) and err.count("\n") == 1 and "Traceback" not in err and fragment in err
    assert not marker.exists()


# --- every file nmtkit reads: truncated, flipped, another file type, a pickle ----------------------


def without_manifest(directory: Path, meta_file: str = "config.json") -> None:
    """Make ``directory`` look as an older nmtkit wrote it: no checksums.json, and no mention of one."""
    (directory / "checksums.json").unlink()
    meta = json.loads((directory / meta_file).read_text())
    del meta["checksums"]
    (directory / meta_file).write_text(json.dumps(meta))


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("file_name", ["config.json", "model.safetensors", "spm.model", "checksums.json"])
def test_every_file_of_a_model_directory(trained, tmp_path, monkeypatch, capsys, file_name, how):
    """A model directory: the damaged file is named in one line, before anything reads it."""
    model = tmp_path / "model"
    shutil.copytree(trained / "train" / "best", model)
    marker = tmp_path / "ran"
    mutate(model / file_name, how, marker)
    (tmp_path / "in.txt").write_text("a b c\n")
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(model), "-i", str(tmp_path / "in.txt"))
    assert_one_line(code, err, (2,), marker)
    assert str(model / file_name) in err


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("file_name", ["config.json", "model.safetensors", "spm.model"])
def test_every_file_of_an_older_model_directory(trained, tmp_path, monkeypatch, capsys, file_name, how):
    """A directory from before checksums.json still loads, and its damaged files are still caught
    by the older checks (the weights' sha256, the config's rules, SentencePiece's parser): a
    one-line error, or for a SentencePiece model whose flipped bytes still parse, a translation."""
    model = tmp_path / "model"
    shutil.copytree(trained / "train" / "best", model)
    without_manifest(model)
    (tmp_path / "in.txt").write_text("a b c\n")
    assert cli(monkeypatch, capsys, "translate", "-m", str(model), "-i", str(tmp_path / "in.txt"))[0] == 0
    marker = tmp_path / "ran"
    mutate(model / file_name, how, marker)
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(model), "-i", str(tmp_path / "in.txt"))
    if code == 0:
        assert (file_name, how) == ("spm.model", "flipped") and not marker.exists()
        return
    assert_one_line(code, err, (1, 2), marker)


def model_config(model: Path) -> dict:
    return json.loads((model / "config.json").read_text())


BAD_CONFIGS = [  # (change to the saved model config, fragment of the one-line error)
    (lambda meta: meta["model"].pop("d_model"), "the config expects"),  # the default (512) does not fit the weights
    (lambda meta: meta["model"].update(heads=0), "model.heads must be in [1, 1024], got 0"),
    (lambda meta: meta["model"].update(d_model=-16), "model.d_model must be in [1, 65536], got -16"),
    (lambda meta: meta["model"].update(d_model=17), "model.d_model (17) must be divisible by model.heads (2)"),
    (lambda meta: meta["model"].update(dropout="x"), "model.dropout: expected a number, got 'x'"),
    (lambda meta: meta["model"].update(depth=3), "unknown config key model.depth"),
    (lambda meta: meta.pop("model"), "not an nmtkit model config"),
    (lambda meta: meta.update(spm={"src": "../../etc/passwd", "tgt": "spm.model"}), "spm must name the src and tgt"),
    (lambda meta: meta.update(spm="spm.model"), "spm must name the src and tgt"),
]


@pytest.mark.parametrize("change, fragment", BAD_CONFIGS)
def test_a_model_config_is_held_to_the_recipe_rules(trained, tmp_path, monkeypatch, capsys, change, fragment):
    """What a config.json means is checked on load as a recipe is, even when checksums.json vouches for it
    (a hand-edited directory whose manifest was rewritten)."""
    model = tmp_path / "model"
    shutil.copytree(trained / "train" / "best", model)
    meta = model_config(model)
    change(meta)
    (model / "config.json").write_text(json.dumps(meta))
    forge_manifest(model)
    (tmp_path / "in.txt").write_text("a b c\n")
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(model), "-i", str(tmp_path / "in.txt"))
    assert_one_line(code, err, (2,), tmp_path / "ran")
    assert fragment in err


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"model": {}, "pad": "' + "x" * (2 << 20) + '"}'],
                         ids=["deep", "huge"])
def test_deep_or_huge_json_configs_are_one_line(trained, tmp_path, monkeypatch, capsys, text):
    model = tmp_path / "model"
    shutil.copytree(trained / "train" / "best", model)
    (model / "config.json").write_text(text)
    forge_manifest(model)
    (tmp_path / "in.txt").write_text("a b c\n")
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(model), "-i", str(tmp_path / "in.txt"))
    assert_one_line(code, err, (2,), tmp_path / "ran")
    assert f"{model / 'config.json'}: " in err


def test_a_missing_manifest_is_noticed(trained, tmp_path, monkeypatch, capsys):
    """Deleting checksums.json does not turn the checks off: config.json says there is one."""
    model = tmp_path / "model"
    shutil.copytree(trained / "train" / "best", model)
    (model / "checksums.json").unlink()
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(model), "-i", str(trained / "recipe.yaml"))
    assert_one_line(code, err, (2,), tmp_path / "ran")
    assert f"{model / 'checksums.json'}: missing (config.json says the directory has one)" in err


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory) -> Path:
    """A workdir whose run holds step_2 and step_4."""
    from nmtkit.config import from_dict
    from nmtkit.runtime.console import get_console
    from nmtkit.training.trainer import train

    workdir = tmp_path_factory.mktemp("two")
    write_prepared(workdir, reversal_pairs(60, 0, length=4), reversal_pairs(4, 1, length=4))
    recipe = tiny_recipe(workdir, model=dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1),
                         train=dict(max_steps=4, save_every=2, validate_every=100, max_tokens=100, keep_last=5))
    (workdir / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    train(from_dict(recipe), get_console(-1))
    return workdir


def resume_falls_back(monkeypatch, capsys, work: Path, recipe: Path, *fragments: str) -> None:
    """``train`` skips the damaged step_4 with a warning naming it, resumes from step_2 and
    writes a sound step_4 again."""
    from nmtkit.training.checkpoint import load_checkpoint

    code, err = cli(monkeypatch, capsys, "train", str(recipe))
    assert code == 0 and "Traceback" not in err, err
    text = " ".join(err.split())
    assert "warning: skipping damaged checkpoint step_00000004: " in text, err
    for fragment in fragments:
        assert fragment in text, err
    assert "resumed from step_00000002" in text
    assert load_checkpoint(work / "train" / "checkpoints" / "step_00000004").trainer.step == 4


CHECKPOINT_FILES = ["config.json", "model.safetensors", "spm.model", "trainer.json", "trainer.safetensors",
                    "checksums.json"]


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("file_name", CHECKPOINT_FILES)
def test_every_file_of_a_checkpoint(two_checkpoints, tmp_path, monkeypatch, capsys, file_name, how):
    work, recipe = copy_work(two_checkpoints, tmp_path)
    marker = tmp_path / "ran"
    mutate(work / "train" / "checkpoints" / "step_00000004" / file_name, how, marker)
    resume_falls_back(monkeypatch, capsys, work, recipe, file_name)
    assert not marker.exists()


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("file_name", ["trainer.json", "trainer.safetensors"])
def test_trainer_files_of_an_older_checkpoint(two_checkpoints, tmp_path, monkeypatch, capsys, file_name, how):
    """Without checksums.json, the trainer state's own checks catch the damage."""
    work, recipe = copy_work(two_checkpoints, tmp_path)
    step4 = work / "train" / "checkpoints" / "step_00000004"
    without_manifest(step4)
    marker = tmp_path / "ran"
    mutate(step4 / file_name, how, marker)
    if (file_name, how) == ("trainer.json", "flipped"):  # a flip inside a value may still parse: make it a key
        (step4 / "trainer.json").write_text((step4 / "trainer.json").read_text(errors="replace")
                                            .replace('"batch_in_epoch"', '"batch_in_epocl"'))
    resume_falls_back(monkeypatch, capsys, work, recipe, file_name)
    assert not marker.exists()


def edit_trainer_json(step: Path, edit) -> None:
    payload = json.loads((step / "trainer.json").read_text())
    edit(payload)
    (step / "trainer.json").write_text(json.dumps(payload))
    forge_manifest(step)


BAD_TRAINER_STATES = [  # (edit of trainer.json that checksums.json vouches for, fragment of the warning)
    (lambda p: p["trainer"].update(batch_in_epoch=p["trainer"]["epoch_batches"] + 1), "past the end of its epoch"),
    (lambda p: p["trainer"].update(step=-4), "step must be a non-negative integer, got -4"),
    (lambda p: p["trainer"].update(step="4"), "step must be a non-negative integer, got '4'"),
    (lambda p: p["trainer"].pop("batch_in_epoch"), "step, epoch and batch_in_epoch are required"),
    (lambda p: p["trainer"].update(best_score=float("nan")), "best_score must be a number or null"),
    (lambda p: p["trainer"].update(surprise=1), "unexpected keyword argument 'surprise'"),
    (lambda p: p["optimizer"]["param_groups"][0].update(params=[0]), "does not match the model's parameters"),
    (lambda p: p.pop("optimizer"), "unexpected trainer state (KeyError"),
    (lambda p: p["optimizer"]["param_groups"][0].update(lr="fast"), "optimizer setting lr must be a non-negative"),
    (lambda p: p["optimizer"]["param_groups"][0].update(eps=-1e-8), "optimizer setting eps must be a non-negative"),
    (lambda p: p["optimizer"]["scalars"].update({"0.step": "4"}), "optimizer scalar 0.step must be a non-negative"),
    (lambda p: p["optimizer"]["scalars"].update({"0.step": -4}), "optimizer scalar 0.step must be a non-negative"),
    (lambda p: p["trainer"].update(step=2), "step 2 disagrees with the directory name step_00000004"),
]


@pytest.mark.parametrize("edit, fragment", BAD_TRAINER_STATES)
def test_trainer_state_contents_are_checked(two_checkpoints, tmp_path, monkeypatch, capsys, edit, fragment):
    """A trainer.json that parses but cannot be this run's state (a wrong data position, a negative
    step, a foreign optimizer) is damaged: resume falls back to the previous checkpoint."""
    work, recipe = copy_work(two_checkpoints, tmp_path)
    edit_trainer_json(work / "train" / "checkpoints" / "step_00000004", edit)
    resume_falls_back(monkeypatch, capsys, work, recipe, fragment)


@pytest.mark.parametrize("tensor, replacement, fragment", [
    ("rng.torch", lambda t: t[:100], "no valid random number generator state"),
    ("opt.0.exp_avg", lambda t: torch.zeros(3, 3), "optimizer state 0.exp_avg has shape (3, 3)"),
    ("opt.0.step", lambda t: -t, "optimizer state 0.step must be one non-negative number"),
])
def test_trainer_tensors_are_checked(two_checkpoints, tmp_path, monkeypatch, capsys, tensor, replacement, fragment):
    from safetensors.torch import load_file, save_file

    work, recipe = copy_work(two_checkpoints, tmp_path)
    step4 = work / "train" / "checkpoints" / "step_00000004"
    tensors = load_file(str(step4 / "trainer.safetensors"))
    tensors[tensor] = replacement(tensors[tensor]).contiguous()
    save_file(tensors, str(step4 / "trainer.safetensors"))
    forge_manifest(step4)
    resume_falls_back(monkeypatch, capsys, work, recipe, fragment)


@pytest.fixture(scope="module")
def prepared_by_prepare(tmp_path_factory) -> Path:
    """A workdir prepared by ``nmtkit prepare`` itself (so prepared/ has its checksums.json)."""
    from nmtkit.config import from_dict
    from nmtkit.data.prepare import prepare
    from nmtkit.runtime.console import get_console

    root = tmp_path_factory.mktemp("prep")
    files = reversal_files(root)
    workdir = root / "work"
    recipe = tiny_recipe(workdir, data={"files": files},
                         model=dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1),
                         train=dict(max_steps=1, validate_every=100, max_tokens=100))
    (workdir).mkdir()
    (workdir / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    prepare(from_dict(recipe), get_console(-1))
    assert (workdir / "prepared" / "checksums.json").is_file()
    return workdir


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("file_name", ["spm.model", "train.npz", "dev.npz", "dev.tgt", "checksums.json"])
def test_every_file_of_a_prepared_directory(prepared_by_prepare, tmp_path, monkeypatch, capsys, file_name, how):
    work, recipe = copy_work(prepared_by_prepare, tmp_path)
    marker = tmp_path / "ran"
    mutate(work / "prepared" / file_name, how, marker)
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe))
    assert_one_line(code, err, (2,), marker)
    assert str(work / "prepared" / file_name) in err
    assert not (work / "train" / "checkpoints").exists()


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("file_name", ["train.npz", "dev.npz"])
def test_ids_of_an_older_prepared_directory(prepared_by_prepare, tmp_path, monkeypatch, capsys, file_name, how):
    """Without checksums.json, the .npz layout checks catch the damage (or, for a flip inside
    the ids, the vocabulary range check or nothing: flipped ids that stay in range are ids)."""
    work, recipe = copy_work(prepared_by_prepare, tmp_path)
    (work / "prepared" / "checksums.json").unlink()
    marker = tmp_path / "ran"
    mutate(work / "prepared" / file_name, how, marker)
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe))
    if code == 0:
        assert how == "flipped"
        return
    assert_one_line(code, err, (2,), marker)
    assert f"{work / 'prepared' / file_name}: corrupt prepared data" in err


@pytest.mark.parametrize("arrays, fragment", [
    (dict(src=[0, 1, 99], src_offsets=[0, 3], tgt=[5], tgt_offsets=[0, 1]),
     "src token id 99 is outside the vocabulary of 16 pieces"),
    (dict(src=[5], src_offsets=[0, 1], tgt=[-1], tgt_offsets=[0, 1]), "tgt token id -1 is outside the vocabulary"),
    (dict(src=[5, 6], src_offsets=[0, 3], tgt=[5], tgt_offsets=[0, 1]), "src_offsets do not index the 2 src ids"),
    (dict(src=[5, 6], src_offsets=[0, 2], tgt=[5], tgt_offsets=[0, 1, 1]), "1 source vs 2 target sentences"),
    (dict(src=[0.5], src_offsets=[0, 1], tgt=[5], tgt_offsets=[0, 1]), "expected flat integer arrays"),
    (dict(src=[5], src_offsets=[0, 1], tgt=[5]), "tgt_offsets"),
])
def test_prepared_ids_are_validated(prepared_by_prepare, tmp_path, monkeypatch, capsys, arrays, fragment):
    work, recipe = copy_work(prepared_by_prepare, tmp_path)
    path = work / "prepared" / "train.npz"
    np.savez(path, **{name: np.array(values) for name, values in arrays.items()})
    forge_manifest(work / "prepared")
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe))
    assert_one_line(code, err, (2,), tmp_path / "ran")
    assert f"{path}: corrupt prepared data" in err and fragment in err


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> Path:
    pytest.importorskip("ctranslate2")
    from nmtkit.ctranslate2.export import export_ctranslate2

    return export_ctranslate2(trained / "train" / "best", tmp_path_factory.mktemp("ct2") / "ct2")


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("file_name", ["model.bin", "config.json", "shared_vocabulary.json", "nmtkit.json",
                                       "spm.model", "checksums.json"])
def test_every_file_of_a_ctranslate2_export(exported, tmp_path, monkeypatch, capsys, file_name, how):
    export = tmp_path / "ct2"
    shutil.copytree(exported, export)
    (tmp_path / "in.txt").write_text("a b c\n")
    args = ("translate", "-m", str(export), "--engine", "ctranslate2", "-i", str(tmp_path / "in.txt"))
    assert cli(monkeypatch, capsys, *args)[0] == 0
    marker = tmp_path / "ran"
    mutate(export / file_name, how, marker)
    code, err = cli(monkeypatch, capsys, *args)
    assert_one_line(code, err, (2,), marker)
    assert str(export / file_name) in err


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("file_name", ["model.bin", "config.json", "nmtkit.json"])
def test_every_file_of_an_older_ctranslate2_export(exported, tmp_path, monkeypatch, capsys, file_name, how):
    """Without checksums.json: a one-line error from our checks or CTranslate2's loader, or (for a
    flip inside the weights, which no format check can see) a translation."""
    export = tmp_path / "ct2"
    shutil.copytree(exported, export)
    without_manifest(export, "nmtkit.json")
    marker = tmp_path / "ran"
    mutate(export / file_name, how, marker)
    (tmp_path / "in.txt").write_text("a b c\n")
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(export), "--engine", "ctranslate2",
                    "-i", str(tmp_path / "in.txt"))
    if code == 0:
        assert (file_name, how) == ("model.bin", "flipped") and not marker.exists()
        return
    assert_one_line(code, err, (1, 2), marker)


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("file_name", ["config.yaml", "manifest.json"])
def test_info_leaves_out_what_is_damaged_beside_a_model(trained, tmp_path, monkeypatch, capsys, file_name, how):
    """``info`` reads the run's config.yaml and the data's manifest.json beside the model: damaged,
    they are left out of the card with a warning naming them; the card still prints."""
    work = tmp_path / "work"
    shutil.copytree(trained, work)
    path = work / ("train" if file_name == "config.yaml" else "prepared") / file_name
    if not path.exists():  # write_prepared makes no manifest (nor checksums.json): a small one as prepare's
        path.write_text(json.dumps({"source": "files", "splits": {"train": {"pairs": 100}}}))
    marker = tmp_path / "ran"
    mutate(path, how, marker)
    monkeypatch.setattr(sys, "argv", ["nmtkit", "info", str(work / "train" / "best"), "--json"])
    from nmtkit.cli import main

    with pytest.raises(SystemExit) as stopped:
        main()
    captured = capsys.readouterr()
    assert (stopped.value.code or 0) == 0 and "Traceback" not in captured.err, captured.err
    card = json.loads(captured.out)
    assert card["architecture"]["arch"] == "transformer" and not marker.exists()
    left_out = "recipe" if file_name == "config.yaml" else "data"
    if left_out in card:  # a cut or flip of the YAML that still parses and passes the recipe rules is a recipe
        assert how == "flipped" or (how, file_name) == ("truncated", "config.yaml")
    else:
        assert f"left out: {path}" in " ".join(captured.err.split()), captured.err
