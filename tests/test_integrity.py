"""A run is used by one ``nmtkit train`` at a time, and resumes only on the data it started on."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import MODEL, recipe_in, reversal_pairs, tiny_recipe, write_prepared
from support.cli import assert_error, cli


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("task")
    write_prepared(workdir, reversal_pairs(120, 0, length=5), reversal_pairs(10, 1, length=5))
    return workdir / "prepared"


# --- one trainer per run -------------------------------------------------------------------------

def hold_lock(directory: Path) -> subprocess.Popen:
    """Another process holding ``directory``'s lock as ``nmtkit train`` does, until its stdin closes."""
    code = ("import sys; from pathlib import Path; from nmtkit.storage.files import exclusive\n"
            f"with exclusive(Path({str(directory)!r}), 'another `nmtkit train`'):\n"
            "    print('held', flush=True); sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert holder.stdout.readline() == b"held\n"
    return holder


def test_a_second_train_on_the_same_run_is_refused_naming_the_holder(tmp_path, prepared, monkeypatch, capsys):
    pytest.importorskip("fcntl")
    recipe = recipe_in(tmp_path, prepared, max_steps=2, save_every=2)
    holder = hold_lock(tmp_path)
    try:
        code, err = cli(monkeypatch, capsys, "train", str(recipe))
    finally:
        holder.stdin.close()
        holder.wait()
    assert_error(code, err, 1, f"{tmp_path} is in use by another `nmtkit train` "
                               f"(pid {holder.pid} on {socket.gethostname()}); wait for it to finish")
    assert not (tmp_path / "train").exists()  # refused before touching the run
    code, err = cli(monkeypatch, capsys, "train", str(recipe), "--restart")  # --restart waits its turn too
    assert code == 0, err


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, prepared, monkeypatch, capsys):
    recipe = recipe_in(tmp_path, prepared, max_steps=2, save_every=2)
    holder = hold_lock(tmp_path)
    holder.kill()  # killed while holding it: the file stays, naming a dead pid
    holder.wait()
    assert (tmp_path / ".nmtkit.lock").read_text() == f"pid {holder.pid} on {socket.gethostname()}\n"
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe))
    assert code == 0, err
    assert (tmp_path / "train" / "checkpoints" / "step_00000002").is_dir()
    assert (tmp_path / ".nmtkit.lock").read_text() == ""  # a finished holder is no longer named in a refusal


# --- a run resumes only on the data it started on -------------------------------------------------

def files_recipe(tmp_path: Path, train_pairs: list[tuple[str, str]]) -> Path:
    """A `source: files` recipe over text files holding ``train_pairs`` (rewritten on each call)."""
    text = tmp_path / "text"
    text.mkdir(exist_ok=True)
    files: dict = {}
    for split, pairs in (("train", train_pairs), ("dev", reversal_pairs(10, 1, 5)), ("test", reversal_pairs(10, 2, 5))):
        for lang, side in (("src", 0), ("tgt", 1)):
            (text / f"{split}.{lang}").write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
            files.setdefault(split, {})[lang] = str(text / f"{split}.{lang}")
    recipe = tiny_recipe(tmp_path / "work", model=MODEL, data={"files": files},
                         train={"max_tokens": 200, "max_steps": 2, "save_every": 2, "validate_every": 100})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def test_train_refuses_to_resume_on_re_prepared_data(tmp_path, monkeypatch, capsys):
    recipe = files_recipe(tmp_path, reversal_pairs(120, 0, 5))
    assert cli(monkeypatch, capsys, "-q", "prepare", str(recipe))[0] == 0
    assert cli(monkeypatch, capsys, "-q", "train", str(recipe))[0] == 0
    run_dir = tmp_path / "work" / "train"
    recorded = json.loads((run_dir / "data.json").read_text())
    assert recorded["train"]["pairs"] == 120 and list(recorded["spm"]) == ["spm.model"]

    # more lines, with new pieces: SentencePiece is retrained and the ids change
    recipe = files_recipe(tmp_path, reversal_pairs(120, 0, 5) +
                          [(f"{w}{w} {w}", f"{w} {w}{w}") for w in "abcdefghij"])
    code, err = cli(monkeypatch, capsys, "prepare", str(recipe))
    assert code == 0, err
    warning = " ".join(line for line in err.splitlines() if line.startswith("warning:"))
    assert f"warning: the data changed under the run in {run_dir} (SentencePiece model spm.model was " \
           f"retrained; train.npz has other counts (pairs 120 -> 130" in warning
    assert "`nmtkit train` will not resume it; `nmtkit train --restart` starts over" in warning

    code, err = cli(monkeypatch, capsys, "train", str(recipe), "train.max_steps=4")
    assert_error(code, err, 2, f"the prepared data changed since the run in {run_dir} started "
                               f"(SentencePiece model spm.model was retrained; train.npz has other counts "
                               f"(pairs 120 -> 130", "use --restart to start over")
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000002"]  # untouched

    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe), "train.max_steps=4", "--restart")
    assert code == 0, err
    assert json.loads((run_dir / "data.json").read_text())["train"]["pairs"] == 130
    moved = [p for p in (tmp_path / "work").iterdir() if p.name.startswith("train.old-")]
    assert len(moved) == 1 and (moved[0] / "checkpoints" / "step_00000002").is_dir()  # kept, not deleted
    import nmtkit.training.trainer as trainer

    monkeypatch.setattr(trainer.time, "strftime", lambda *args: "20260101-000000")  # two restarts in one second
    for _ in range(2):  # each restart keeps the run before it
        code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe), "train.max_steps=2", "--restart")
        assert code == 0, err
    moved = [p for p in (tmp_path / "work").iterdir() if p.name.startswith("train.old-")]
    assert len(moved) == 3 and all((p / "checkpoints").is_dir() for p in moved)
    assert (tmp_path / "work" / "train.old-20260101-000000-2").is_dir()


def test_the_same_data_prepared_again_resumes(tmp_path, monkeypatch, capsys):
    """Re-encoding identical data rewrites train.npz (new zip times) but not the ids: no warning, resume."""
    recipe = files_recipe(tmp_path, reversal_pairs(120, 0, 5))
    assert cli(monkeypatch, capsys, "-q", "prepare", str(recipe))[0] == 0
    assert cli(monkeypatch, capsys, "-q", "train", str(recipe))[0] == 0
    (tmp_path / "work" / "prepared" / "stamps" / "encode.json").unlink()  # force the encode step to run again
    code, err = cli(monkeypatch, capsys, "prepare", str(recipe))
    assert code == 0 and "encode done" in err and "warning" not in err, err
    code, err = cli(monkeypatch, capsys, "train", str(recipe), "train.max_steps=4")
    assert code == 0 and "resumed from step_00000002" in " ".join(err.split()), err


def test_changes_name_what_differs():
    import numpy as np

    from nmtkit.data.identity import changes
    from nmtkit.data.ids import ParallelIds

    def ids(first: int) -> ParallelIds:
        return ParallelIds(np.array([first, 5, 6], np.int32), np.array([0, 1, 3]), np.array([7, 8], np.int32),
                           np.array([0, 1, 2]))

    def ident(train: ParallelIds, spm: dict) -> dict:
        return {"spm": spm, "train": {"sha256": train.digest(), "pairs": len(train), "src_tokens": len(train.src),
                                      "tgt_tokens": len(train.tgt)}}

    same = ident(ids(4), {"spm.model": "x"})
    assert changes(same, ident(ids(4), {"spm.model": "x"})) == []
    assert changes(same, ident(ids(9), {"spm.model": "x"})) == ["train.npz holds other token ids (same counts)"]
    assert changes(same, ident(ids(4), {"spm.src.model": "x", "spm.tgt.model": "y"})) == [
        "SentencePiece model spm.model is gone", "SentencePiece model spm.src.model is new",
        "SentencePiece model spm.tgt.model is new"]


def test_a_damaged_data_record_is_said_and_rewritten(tmp_path, prepared, monkeypatch, capsys):
    recipe = recipe_in(tmp_path, prepared, max_steps=2, save_every=2)
    assert cli(monkeypatch, capsys, "-q", "train", str(recipe))[0] == 0
    record = tmp_path / "train" / "data.json"
    intact = record.read_text()
    record.write_text(intact[:40])
    code, err = cli(monkeypatch, capsys, "train", str(recipe), "train.max_steps=4")
    assert code == 0, err
    assert f"warning: {record} is damaged: the prepared data is not compared with what the run started on" in \
        " ".join(err.split())
    assert record.read_text() == intact  # recorded again from the data the run resumed on


def test_a_changed_vocabulary_is_named_as_such_not_as_damaged_checkpoints(tmp_path, monkeypatch, capsys):
    """`run` with another vocab.size re-prepares, then its training finds the data changed before
    it reads any checkpoint (they are sound, only of another shape); without the data record
    the shapes say it, as a settings change. Each refusal names a command that exists."""
    recipe = files_recipe(tmp_path, reversal_pairs(120, 0, 5))
    assert cli(monkeypatch, capsys, "-q", "run", str(recipe))[0] == 0
    run_dir = tmp_path / "work" / "train"
    code, err = cli(monkeypatch, capsys, "run", str(recipe), "vocab.size=20")
    assert_error(code, err, 2, f"the prepared data changed since the run in {run_dir} started (SentencePiece model "
                               f"spm.model was retrained", "use --restart to start over (`nmtkit train RECIPE "
                               f"--restart`: the old run is moved aside, not deleted)")
    assert "damaged" not in err
    (run_dir / "data.json").unlink()  # a run of an nmtkit that kept no data record
    code, err = cli(monkeypatch, capsys, "train", str(recipe), "vocab.size=20", "train.max_steps=4")
    assert_error(code, err, 2, f"{run_dir / 'checkpoints' / 'step_00000002'}: ", "the model or vocabulary settings "
                               f"changed since the run in {run_dir} started; use --restart to train a new model "
                               f"(`nmtkit train RECIPE --restart`)")
    assert "damaged" not in err
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000002"]
