"""nmtkit touches only what it made: `train` refuses a run directory it did not create, the
start-up tidy and the checkpoint pruning remove only nmtkit's own leftovers of dead processes,
and a directory replaced by two renames (average, export, best/) comes back whole after a kill."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import recipe_in, reversal_pairs, write_prepared
from nmtkit.storage.checksums import write_manifest
from nmtkit.storage.files import _HOST, parked_name, replace_directory, sibling_name
from support.cli import assert_error, cli


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("task")
    write_prepared(workdir, reversal_pairs(120, 0, length=5), reversal_pairs(10, 1, length=5))
    return workdir / "prepared"


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` and a file's bytes (None: a directory)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def dead_pid() -> int:
    """The pid of a process that has exited (as a killed nmtkit's is)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --- train refuses a run directory it did not make --------------------------------------------

def test_train_refuses_a_train_directory_it_did_not_make(tmp_path, prepared, monkeypatch, capsys):
    recipe = recipe_in(tmp_path, prepared, max_steps=2, save_every=2)
    run = tmp_path / "train"
    (run / "best").mkdir(parents=True)
    (run / "best" / "notes.txt").write_text("my notes\n")
    for name in ("config.yaml", "metrics.jsonl", ".cache.tmp"):
        (run / name).write_text(f"the user's {name}\n")
    before = tree(run)
    for extra in ((), ("--restart",)):
        code, err = cli(monkeypatch, capsys, "train", str(recipe), *extra)
        assert_error(code, err, 2, f"{run} exists and nmtkit did not write it (it is where nmtkit keeps the "
                                   f"training run); move it, or choose another workdir")
        assert tree(run) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("train.old")]


def test_train_refuses_a_best_directory_that_is_not_a_model(tmp_path, prepared, monkeypatch, capsys):
    recipe = recipe_in(tmp_path, prepared, max_steps=2, save_every=2, validate_every=2)
    assert cli(monkeypatch, capsys, "-q", "train", str(recipe))[0] == 0
    best = tmp_path / "train" / "best"
    (best / "notes.txt").write_text("my notes\n")
    before = tree(tmp_path / "train")
    code, err = cli(monkeypatch, capsys, "train", str(recipe), "train.max_steps=4")
    assert_error(code, err, 2, f"{best} holds notes.txt, which is not part of a model directory: nmtkit keeps the "
                               f"run's best model there and replaces it at each better validation; move it away")
    assert tree(tmp_path / "train") == before


def test_run_refuses_a_train_directory_it_did_not_make(tmp_path, monkeypatch, capsys):
    """`nmtkit run` checks train/ before any work: refused before prepare writes prepared/."""
    import yaml

    from conftest import MODEL, tiny_recipe

    text = tmp_path / "text"
    text.mkdir()
    files: dict = {}
    for split, seed in (("train", 0), ("dev", 1), ("test", 2)):
        pairs = reversal_pairs(60 if split == "train" else 6, seed, 5)
        for lang, side in (("src", 0), ("tgt", 1)):
            (text / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
            files.setdefault(split, {})[lang] = str(text / f"{split}.{lang}")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(tmp_path / "work", model=MODEL, data={"files": files},
                                                 train={"max_tokens": 200, "max_steps": 2})))
    (tmp_path / "work" / "train").mkdir(parents=True)
    (tmp_path / "work" / "train" / "metrics.jsonl").write_text("mine\n")
    code, err = cli(monkeypatch, capsys, "run", str(recipe))
    assert_error(code, err, 2, f"{tmp_path / 'work' / 'train'} exists and nmtkit did not write it")
    assert not (tmp_path / "work" / "prepared").exists()
    assert (tmp_path / "work" / "train" / "metrics.jsonl").read_text() == "mine\n"
    assert sorted(p.name for p in (tmp_path / "work" / "train").iterdir()) == ["metrics.jsonl"]


# --- the start-up tidy and pruning remove only nmtkit's own leftovers ---------------------------

def fake_checkpoint(path: Path, step: int) -> Path:
    """A directory as save_checkpoint writes one (its checksums.json lists trainer.json)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"step": step}))
    (path / "trainer.json").write_text(json.dumps({"trainer": {"step": step}}))
    write_manifest(path, ["config.json", "trainer.json"])
    return path


def test_tidy_and_prune_remove_only_what_dead_nmtkit_processes_left(tmp_path):
    from nmtkit.training.checkpoint import checkpoint_dirs, prune_checkpoints, tidy_run_dir

    run, dead = tmp_path / "train", dead_pid()
    ckpts = run / "checkpoints"
    for step in (10, 20, 30):
        fake_checkpoint(ckpts / f"step_{step:08d}", step)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        leftovers = [run / f"{sibling_name(run / 'metrics.jsonl', _HOST)}-{dead}-0123456789ab.tmp",
                     ckpts / f"{sibling_name(ckpts / 'step_00000040', _HOST)}-{dead}-0123456789ab.tmp",
                     ckpts / ".step_00000005.deleting"]  # an nmtkit before 2026-12 hid a pruned checkpoint so
        for path in leftovers:
            path.mkdir() if "step" in path.name else path.write_text("half\n")
        parked = run / f"{sibling_name(run / 'best', 'old-' + _HOST)}-{dead}-0123456789ab"
        parked.mkdir()
        (parked / "model.safetensors").write_text("the old best\n")
        users = {run / ".best.mybackup": None, ckpts / ".step_00000030.keep": None, run / ".my-notes.tmp": "notes",
                 run / ".best.old": None, ckpts / "step_1": None, ckpts / "step_00000001": None,
                 run / f"{sibling_name(run / 'config.yaml', _HOST)}-{live.pid}-0123456789ab.tmp": "live",
                 run / f"{sibling_name(run / 'averaged', 'old-' + _HOST)}-{live.pid}-0123456789ab": None}
        for path, text in users.items():
            if text is None:
                path.mkdir()
                (path / "README").write_text("mine\n")
            else:
                path.write_text(text)
        before = {path: tree(path) if path.is_dir() else path.read_text() for path in users}
        tidy_run_dir(run)
        prune_checkpoints(run, keep_last=1, protect=())
    finally:
        live.kill()
        live.wait()
    assert {path: tree(path) if path.is_dir() else path.read_text() for path in users} == before
    assert not any(os.path.lexists(path) for path in leftovers) and not parked.exists()
    assert (run / "best" / "model.safetensors").read_text() == "the old best\n"  # moved back whole
    # pruned: the old checkpoints, not the user's step_00000001 that sorts before them
    assert [p.name for p in checkpoint_dirs(run)] == ["step_00000001", "step_00000030"]
    assert sorted(p.name for p in ckpts.iterdir()) == [".step_00000030.keep", "step_00000001", "step_00000030",
                                                        "step_1"]


def test_an_older_nmtkits_parked_copies_go_back_only_when_complete_and_missing(tmp_path, model_dir):
    """An nmtkit before the swap parked best/ and a checkpoint it replaced as .best.old and
    .step_N.old and promised a resumed run moves them back: after a kill between its two
    renames, best/ stayed missing. Only a complete copy goes back, only where nothing is."""
    from nmtkit.training.checkpoint import TRAINER_JSON, TRAINER_TENSORS, tidy_run_dir

    run = tmp_path / "train"
    ckpts = run / "checkpoints"

    def parked(path: Path, trainer: tuple[str, ...] = (TRAINER_JSON, TRAINER_TENSORS)) -> Path:
        shutil.copytree(model_dir, path)
        for name in trainer:
            (path / name).write_text("{}\n")
        write_manifest(path, [p.name for p in path.iterdir() if p.name != "checksums.json"])
        return path

    back = {run / ".best.old": run / "best", ckpts / ".step_00000010.old": ckpts / "step_00000010"}
    parked(run / ".best.old", ())
    parked(ckpts / ".step_00000010.old")
    expected = {target: tree(path) for path, target in back.items()}
    stay = [parked(run / ".averaged.old", ()),  # never an older nmtkit's promise
            parked(ckpts / ".step_00000020.old", (TRAINER_JSON,)),  # incomplete
            parked(ckpts / ".step_00000030.old"), parked(ckpts / "step_00000030"),  # its place is taken
            parked(run / ".best.nmtkit-notes.old", ())]
    (run / ".best.old" / "notes.txt").write_text("mine\n")  # not a model directory: the user's
    kept = {path: tree(path) for path in stay}
    kept[run / ".best.old"] = tree(run / ".best.old")
    tidy_run_dir(run)
    assert {path: tree(path) for path in kept} == kept and not (run / "best").exists()
    (run / ".best.old" / "notes.txt").unlink()
    del kept[run / ".best.old"]
    tidy_run_dir(run)
    assert {target: tree(target) for target in back.values()} == expected
    assert {path: tree(path) for path in kept} == kept and not any(os.path.lexists(path) for path in back)


def test_a_finder_file_in_best_is_no_reason_to_refuse_and_restart_skips_the_check(tmp_path, prepared, monkeypatch,
                                                                                  capsys):
    """best/ is checked so that nmtkit never replaces a directory of the user's; macOS's Finder
    leaves a .DS_Store in any folder it shows, and --restart moves the whole run aside anyway."""
    recipe = recipe_in(tmp_path, prepared, max_steps=2, save_every=2, validate_every=2)
    assert cli(monkeypatch, capsys, "-q", "train", str(recipe))[0] == 0
    best = tmp_path / "train" / "best"
    (best / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    assert cli(monkeypatch, capsys, "-q", "train", str(recipe), "train.max_steps=4")[0] == 0
    (best / "notes.txt").write_text("my notes\n")
    notes = tree(best)
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe), "--restart")
    assert code == 0, err
    [backup] = [p for p in tmp_path.iterdir() if p.name.startswith("train.old-")]
    assert tree(backup / "best") == notes


# --- a directory replaced by two renames survives a kill between them ------------------------

KILL_INSIDE = """
import os, signal, sys
from pathlib import Path
import nmtkit.storage.files as files
if sys.argv[3] == "two-renames":
    files._exchange = lambda a, b: False  # as on a kernel, file system or sandbox without RENAME_EXCHANGE
    real = os.replace
    def replace(src, dst):
        real(src, dst)
        if ".nmtkit-old-" in Path(dst).name:  # between the two renames
            os.kill(os.getpid(), signal.SIGKILL)
    os.replace = replace
else:
    real = files._exchange
    def exchange(a, b):
        real(a, b)  # one syscall, which no kill splits: killed as soon as it returns, the old copy still there
        os.kill(os.getpid(), signal.SIGKILL)
    files._exchange = exchange
files.replace_directory(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def model_like(path: Path, text: str) -> Path:
    path.mkdir()
    (path / "weights").write_text(text)
    return path


@pytest.mark.parametrize("how", ["exchange", "two-renames"])
def test_a_replaced_directory_is_never_lost(tmp_path, monkeypatch, how):
    """A kill inside replace_directory leaves one complete copy, old or new, where a reader finds
    it (the swap) or where the next write takes it back (parked between two renames)."""
    import nmtkit.storage.files as files

    if how == "exchange" and not files._exchange(model_like(tmp_path / "a", "a"), model_like(tmp_path / "b", "b")):
        pytest.skip("this file system cannot swap two directories in one rename")
    for probe in ("a", "b"):
        shutil.rmtree(tmp_path / probe, ignore_errors=True)
    out = model_like(tmp_path / "averaged", "first")
    (tmp_path / ".averaged.old").mkdir()  # the user's: never ours to touch
    killed = subprocess.run([sys.executable, "-c", KILL_INSIDE, str(model_like(tmp_path / "new", "second")),
                             str(out), how], capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    parked = [p for p in tmp_path.iterdir() if p.name.startswith(".averaged.nmtkit-old-")]
    if how == "exchange":  # swapped: the new copy in place, the old one under the name the new one had
        assert (out / "weights").read_text() == "second" and (tmp_path / "new" / "weights").read_text() == "first"
        assert parked == []
    else:
        assert not out.exists() and len(parked) == 1 and (parked[0] / "weights").read_text() == "first"
    replace_directory(model_like(tmp_path / "third", "third"), out)  # the next write: a parked copy taken back
    assert (out / "weights").read_text() == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".averaged.old", "averaged", "new"]
    assert parked_name(out).startswith(f".averaged.nmtkit-old-{_HOST}-{os.getpid()}-")


def test_a_sandbox_that_refuses_renameat2_gets_two_renames(tmp_path, monkeypatch):
    """seccomp filters answer a syscall they do not allow with EPERM: that is a kernel that cannot
    swap, not a failed write."""
    import errno

    import nmtkit.storage.files as files

    monkeypatch.setattr(files, "_renameat2", lambda: (lambda *args: -1, lambda: errno.EPERM))
    out = model_like(tmp_path / "averaged", "first")
    replace_directory(model_like(tmp_path / "new", "second"), out)
    assert (out / "weights").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["averaged"]
