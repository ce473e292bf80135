"""Loading never runs code: weights come only from safetensors, configs from JSON, ids from
``.npz`` without pickles. A crafted pickle whose unpickling would create a marker file is put
where nmtkit expects each kind of file; it must be refused with one line, and the marker
must not appear."""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import reversal_pairs, tiny_recipe, write_prepared
from test_robustness import cli

PACKAGE = Path(__file__).resolve().parent.parent / "nmtkit"
UNSAFE = {  # what must not appear in the package: each of these can run code from a file
    "torch.load": re.compile(r"\btorch\.(jit\.)?load\("),
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


class _Payload:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def malicious_pickle(marker: Path) -> bytes:
    return pickle.dumps(_Payload(marker))


def malicious_torch_file(marker: Path) -> bytes:
    """What ``torch.save`` writes (a zip around a pickle); ``torch.load(weights_only=False)`` runs it."""
    buffer = io.BytesIO()
    torch.save({"weight": _Payload(marker)}, buffer)
    return buffer.getvalue()


def malicious_npz(marker: Path) -> bytes:
    """A real ``.npz`` whose arrays are pickled objects."""
    buffer = io.BytesIO()
    objects = np.empty(1, dtype=object)
    objects[0] = _Payload(marker)
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
    from nmtkit.console import get_console
    from nmtkit.training.trainer import train

    workdir = tmp_path_factory.mktemp("trained")
    write_prepared(workdir, reversal_pairs(100, 0, length=5), reversal_pairs(10, 1, length=5))
    recipe = tiny_recipe(workdir, model=dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1),
                         train=dict(max_steps=2, save_every=2, validate_every=2, max_tokens=200))
    (workdir / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    train(from_dict(recipe), get_console(-1))
    return workdir


def plant(path: Path, data: bytes, checksum_in: Path | None = None, key: str = "") -> None:
    """Replace ``path`` by ``data``; with ``checksum_in``, also forge the recorded sha256, as an
    attacker who controls the whole directory would."""
    path.write_bytes(data)
    if checksum_in is not None:
        meta = json.loads(checksum_in.read_text())
        meta[key] = hashlib.sha256(data).hexdigest()
        checksum_in.write_text(json.dumps(meta))


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
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(model), "-i", str(trained / "recipe.yaml"))
    assert code in (1, 2) and err.count("\n") == 1 and "Traceback" not in err and fragment in err
    assert not marker.exists()
