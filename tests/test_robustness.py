"""Every bad input gets one clear line and the right exit code; faults during training
(NaN/inf, out of memory, a full disk, a damaged checkpoint) stop cleanly and never cost the
last good checkpoint. Faults are injected from the outside by monkeypatching; the package
carries no test hooks. Commands run in this process through ``nmtkit.cli.main``, the entry
point the installed ``nmtkit`` script calls, so they see the same exit codes and stderr.
"""
from __future__ import annotations

import errno
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

from conftest import recipe_in, reversal_pairs, write_prepared
from support.cli import assert_error, cli, run_cli


# --- recipes -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("task")
    write_prepared(workdir, reversal_pairs(200, 0, length=6), reversal_pairs(20, 1, length=6))
    return workdir / "prepared"


BAD_RECIPES = [  # (recipe text or None for a missing file, overrides, fragment of the message)
    (None, [], "recipe not found"),
    ("train: {max_steps: [1\n", [], "not a valid YAML recipe"),
    ("- a list\n- not a mapping\n", [], "a recipe must be a mapping of sections"),
    ("train: 5\n", [], "train: expected a mapping, got 5"),
    ("train: false\n", [], "train: expected a mapping, got False"),
    ("data: {clean: false}\n", [], "data.clean: expected a mapping, got False"),
    ("", ["data.clean=0"], "data.clean: expected a mapping, got 0"),
    ("data: {clean: []}\n", [], "data.clean: expected a mapping, got []"),
    ("train: {learning_rate: 1}\n", [], "unknown config key train.learning_rate; valid keys under train:"),
    ("modle: {}\n", [], "unknown config key modle"),
    ("", ["model.d_model=30", "model.heads=4"], "model.d_model (30) must be divisible by model.heads (4)"),
    ("", ["model.heads=0"], "model.heads must be in [1, 1024], got 0"),
    ("", ["train.lr=-0.1"], "train.lr must be in (0, 100], got -0.1"),
    ("", ["train.save_every=0"], "train.save_every must be in [1, 2**62], got 0"),
    ("", ["train.betas=[0.9]"], "train.betas must be two numbers in [0, 1), got [0.9]"),
    ("", ["train.seed=-1"], "train.seed must be in [0, 2**63-1], got -1"),
    ("", ["model.dropout=1.5"], "model.dropout must be in [0, 1), got 1.5"),
    ("", ["train.max_steps=many"], "train.max_steps: expected an integer, got 'many'"),
    ("", ["train.max_steps"], "is not of the form key=value"),
    ("", ["model.arch=lstm"], "model.arch: 'lstm' is not one of transformer, rnn"),
]


@pytest.mark.parametrize("text, overrides, fragment", BAD_RECIPES)
def test_bad_recipes_are_one_line_with_exit_2(tmp_path, monkeypatch, capsys, text, overrides, fragment):
    path = tmp_path / "recipe.yaml"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    code, err = cli(monkeypatch, capsys, "train", str(path), *overrides, *(["data.source=files"] if text == "" else []))
    assert err.count("\n") == 1  # nothing but the error line
    assert_error(code, err, 2, fragment)


def test_debug_shows_the_traceback(tmp_path):
    result = run_cli("--debug", "train", str(tmp_path / "missing.yaml"))
    err = result.stderr.decode()
    assert result.returncode != 0
    assert "Traceback" in err and "ConfigError: recipe not found" in err


def test_bad_prepare_inputs(tmp_path, monkeypatch, capsys):
    def write(name: str, data: bytes) -> str:
        (tmp_path / name).write_bytes(data)
        return str(tmp_path / name)

    good = {split: {lang: write(f"{split}.{lang}", b"".join(b"word %d %s\n" % (i, lang.encode()) for i in range(9)))
                    for lang in ("en", "es")} for split in ("train", "dev", "test")}
    cases = [  # (split, en bytes, es bytes, fragment)
        ("train", bytes(range(256)) * 4, bytes(range(256)) * 4, "bad.train.en: line 2 is not valid UTF-8 (byte 117)"),
        ("train", b"\x00" * 50 + b"\n", b"\x00\n", "SentencePiece training failed"),
        ("dev", b"one\ntwo\n", b"one\n", "dev.en has 2 lines but"),
        ("test", b"", b"x\n", "file is empty"),
        ("train", b"\n \n\t\n", b"\n\n\n", "no training pairs left after cleaning"),
    ]
    for split, src, tgt, fragment in cases:
        files = json.loads(json.dumps(good))
        files[split] = {"en": write(f"bad.{split}.en", src), "es": write(f"bad.{split}.es", tgt)}
        recipe = tmp_path / "prepare.yaml"
        recipe.write_text(yaml.safe_dump({"workdir": str(tmp_path / "work"), "vocab": {"size": 30},
                                          "data": {"source": "files", "src_lang": "en", "tgt_lang": "es",
                                                   "files": files}}))
        code, err = cli(monkeypatch, capsys, "-q", "prepare", str(recipe))
        assert_error(code, err, 2, fragment)


def test_score_rejects_mismatched_and_undecodable_files(tmp_path, monkeypatch, capsys):
    (tmp_path / "hyp").write_text("a b\nc d\n")
    (tmp_path / "ref").write_text("a b\n")
    (tmp_path / "bad").write_bytes(b"a b\nc \xe2\x82 d\n")
    code, err = cli(monkeypatch, capsys, "score", "-r", str(tmp_path / "ref"), "-i", str(tmp_path / "hyp"))
    assert_error(code, err, 2, "line counts differ", "hyp has 2 lines but", "ref has 1 line")
    code, err = cli(monkeypatch, capsys, "score", "-r", str(tmp_path / "bad"), "-i", str(tmp_path / "hyp"))
    assert_error(code, err, 2, "bad: line 2 is not valid UTF-8")


# --- atomic files ----------------------------------------------------------------------------------

DIRECT_WRITE = re.compile(r"(?<![\w.])open\([^)]*[\"'][wax]b?\+?[\"']|\.write_(text|bytes)\(|\bsave_file\(|"
                          r"\bnp\.save|torch\.save\(|\.savefig\(")
ALLOWED_DIRECT_WRITES = {  # (module, text on the line): why a direct write is safe there
    ("nmtkit/modeldir.py", "save_file(weights, filename"): "write_weights passes a temp_beside name, then renames",
    ("nmtkit/data/ids.py", "open(part, \"wb\")"): "SplitWriter's parts: temp_beside names, removed once the "
                                                   ".npz is assembled (through atomic_open)",
    ("nmtkit/viz/figure.py", "fig.savefig(handle"): "the handle is atomic_open's",
    ("nmtkit/runlog.py", "open(self.path, \"a\""): "appends; resume truncates after the checkpoint",
    ("nmtkit/data/vocab.py", "open(corpus, \"w\""): "scratch text in a TemporaryDirectory",
    ("nmtkit/data/sources/sword.py", "nmtkitkeys.conf\").write_text("): "scratch config in a TemporaryDirectory",
    ("nmtkit/sweep/runner.py", "open(log, \"a\""): "a variant's log, appended to by each attempt; results never read it",
}


def test_outputs_are_written_to_a_temp_name_and_renamed():
    """An audit: every direct write in the package is one of the known safe ones above;
    anything else must go through nmtkit.storage.files.atomic_open (temp name, fsync, rename)."""
    root = Path(__file__).resolve().parent.parent
    found = []
    for path in sorted((root / "nmtkit").rglob("*.py")):
        module = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if DIRECT_WRITE.search(line) and not any(module == allowed and text in line
                                                     for allowed, text in ALLOWED_DIRECT_WRITES):
                found.append(f"{module}:{number}: {line.strip()}")
    assert not found, found


def test_atomic_open_names_the_file_when_a_write_fails(tmp_path):
    from nmtkit.storage.files import atomic_open

    target = tmp_path / "out.txt"
    target.write_text("previous\n")
    with pytest.raises(OSError) as failed:
        with atomic_open(target) as handle:
            handle.write("half")
            raise OSError(errno.ENOSPC, "No space left on device")  # what a write to a full disk raises
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(target)
    assert target.read_text() == "previous\n" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


@pytest.mark.parametrize("directory", [False, True])
def test_a_signal_just_after_the_temp_appears_leaves_nothing(tmp_path, monkeypatch, directory):
    """A SIGTERM or Ctrl-C that arrives right after the temporary file is created (a script
    may signal as soon as it sees it) -- before any block code runs -- removes it all the same."""
    from nmtkit.storage import files

    real_create = files._create

    def signalled_once_created(tmp, as_directory):
        real_create(tmp, as_directory)
        assert tmp.exists() and tmp.is_dir() == as_directory
        raise KeyboardInterrupt  # what the handler raises at the next bytecode

    monkeypatch.setattr(files, "_create", signalled_once_created)
    target = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        with files.temp_beside(target, directory=directory):
            pytest.fail("the block must not run")
    if not directory:
        with pytest.raises(KeyboardInterrupt):
            with files.atomic_open(target):
                pytest.fail("the block must not run")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(files, "_create", real_create)
    with files.temp_beside(target, directory=directory) as tmp:  # and without the signal: made, named as ours
        assert tmp.is_dir() == directory and tmp.name.startswith(".out.nmtkit-") and tmp.name.endswith(".tmp")
        assert tmp.stat().st_mode & 0o777 == (0o777 if directory else 0o666) & ~files.UMASK
        os.rename(tmp, target)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_split_writer_that_fails_to_start_leaves_no_parts(tmp_path, monkeypatch):
    """prepare's id writer makes one part file per array before any id is written: a failure
    while making them (too many open files, a signal) removes the ones already made."""
    import numpy as np

    from nmtkit.data.ids import SplitWriter, load_split
    from nmtkit.storage import files

    real_create, made = files._create, []

    def the_third_fails(tmp, directory):
        if len(made) == 2:
            raise OSError(errno.EMFILE, "Too many open files")
        real_create(tmp, directory)
        made.append(tmp)

    monkeypatch.setattr(files, "_create", the_third_fails)
    with pytest.raises(OSError):
        SplitWriter(tmp_path / "train.npz", (100, 100))
    assert len(made) == 2 and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(files, "_create", real_create)
    with SplitWriter(tmp_path / "train.npz", (100, 100)) as writer:
        writer.add(np.array([1, 2, 3, 7]), np.array([3, 1]), np.array([4, 5]), np.array([1, 1]))
    assert [p.name for p in tmp_path.iterdir()] == ["train.npz"]  # the parts went once assembled
    split = load_split(tmp_path / "train.npz")
    assert split.src.tolist() == [1, 2, 3, 7] and split.src_offsets.tolist() == [0, 3, 4]
    assert split.tgt.tolist() == [4, 5] and split.tgt_offsets.tolist() == [0, 1, 2]


def test_a_replaced_file_keeps_its_permissions(tmp_path):
    from nmtkit.storage.files import UMASK, atomic_write_text

    private, fresh = tmp_path / "private.txt", tmp_path / "fresh.txt"
    private.write_text("old\n")
    private.chmod(0o600)
    atomic_write_text(private, "new\n")
    atomic_write_text(fresh, "new\n")
    assert private.read_text() == "new\n" and private.stat().st_mode & 0o777 == 0o600
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~UMASK


def test_a_read_only_output_is_refused(tmp_path, monkeypatch):
    from nmtkit.errors import ConfigError
    from nmtkit.storage import outputs

    locked = tmp_path / "locked.txt"
    locked.write_text("keep\n")
    locked.chmod(0o444)
    if os.geteuid() == 0:  # root may write a read-only file (as a shell redirect may): ask as a user would
        monkeypatch.setattr(outputs.os, "access", lambda path, mode: not (mode & os.W_OK and Path(path) == locked))
    with pytest.raises(ConfigError, match="is read-only: nmtkit will not replace it"):
        outputs.check_output_file(locked)
    assert outputs.check_output_file(tmp_path / "new.txt") == tmp_path / "new.txt"


def test_a_kill_inside_replace_directory_never_costs_the_old_copy(tmp_path, monkeypatch):
    """With the user's own ``.out.old`` in the way, the old copy is parked under a name that
    the next write's stale-temp cleaning leaves alone, even after its process has died."""
    from nmtkit.storage import files

    monkeypatch.setattr(files, "_exchange", lambda a, b: False)  # the two-rename path, where renameat2 is missing
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.txt").write_text("old model\n")
    theirs = tmp_path / ".out.old"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("keep me\n")
    new = files._temp_name(out)  # a temporary directory of this process, as temp_beside makes
    new.mkdir()
    (new / "model.txt").write_text("new model\n")
    real_replace, calls = os.replace, []

    def killed_after_the_first_rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies between the two renames
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", killed_after_the_first_rename)
    with pytest.raises(KeyboardInterrupt):
        files.replace_directory(new, out)
    monkeypatch.setattr(files.os, "replace", real_replace)
    parked = Path(calls[0][1])
    assert parked.parent == tmp_path and parked.name.startswith(".out.nmtkit-old-") and not out.exists()
    monkeypatch.setattr(files, "_running", lambda pid: False)  # every writer is dead now
    files.remove_stale_temps(out)
    files.remove_stale_temps(parked)
    assert (parked / "model.txt").read_text() == "old model\n"
    assert (theirs / "notes.txt").read_text() == "keep me\n"
    # without the interruption the parked copy is removed once the new one is in place
    (new / "model.txt").write_text("newer model\n")
    real_replace(parked, out)
    files.replace_directory(new, out)
    assert (out / "model.txt").read_text() == "newer model\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.old", "out"]
    # in a run directory, a resuming trainer moves such a parked best/ back
    from nmtkit.training.checkpoint import tidy_run_dir

    run = tmp_path / "run"
    (run / ".best.nmtkit-old-x1y2").mkdir(parents=True)
    (run / ".best.nmtkit-old-x1y2" / "model.txt").write_text("best model\n")
    tidy_run_dir(run)
    assert (run / "best" / "model.txt").read_text() == "best model\n" and sorted(p.name for p in run.iterdir()) == ["best"]


def test_model_dirs_and_checkpoints_get_the_usual_permissions(tmp_path, prepared, monkeypatch, capsys):
    from nmtkit.storage.files import UMASK

    recipe = recipe_in(tmp_path, prepared, max_steps=2, save_every=2, validate_every=2)
    assert cli(monkeypatch, capsys, "-q", "train", str(recipe))[0] == 0
    for directory in (tmp_path / "train" / "best", tmp_path / "train" / "checkpoints" / "step_00000002"):
        assert directory.stat().st_mode & 0o777 == 0o777 & ~UMASK, directory
        for path in directory.iterdir():
            assert path.stat().st_mode & 0o777 == 0o666 & ~UMASK, path


# --- damaged checkpoints -------------------------------------------------------------------------

def test_damaged_checkpoints_are_named_and_train_falls_back(tmp_path, prepared, monkeypatch, capsys):
    from nmtkit.training.checkpoint import checkpoint_dirs, load_checkpoint

    recipe = recipe_in(tmp_path, prepared, max_steps=6, save_every=2, keep_last=5)
    assert cli(monkeypatch, capsys, "-q", "train", str(recipe))[0] == 0
    step2, step4, step6 = checkpoint_dirs(tmp_path / "train")
    weights = step6 / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # truncated
    (step4 / "trainer.json").write_text('{"trainer": {"step": ')  # torn JSON
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(step6), "-i", str(recipe))
    assert_error(code, err, 2, f"{weights}: checksum mismatch (truncated or corrupt file)")  # bad input

    (tmp_path / "train" / "config.yaml").write_text("model: [")  # the record of the previous settings
    code, err = cli(monkeypatch, capsys, "train", str(recipe), "train.max_steps=8")
    lines = err.splitlines()
    assert code == 0 and "Traceback" not in err
    assert (f"warning: skipping damaged checkpoint step_00000006: {weights}: checksum mismatch (truncated or "
            f"corrupt file)") in lines
    assert f"warning: skipping damaged checkpoint step_00000004: {step4 / 'trainer.json'}: checksum mismatch " \
           f"(truncated or corrupt file)" in lines
    assert f"warning: {tmp_path / 'train' / 'config.yaml'} is damaged: settings are not compared with the " \
           f"previous session's" in lines
    assert "resumed from step_00000002" in " ".join(err.split())
    assert load_checkpoint(tmp_path / "train" / "checkpoints" / "step_00000008").trainer.step == 8

    for path in checkpoint_dirs(tmp_path / "train"):
        (path / "trainer.safetensors").write_bytes(b"\x00" * 16)
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe), "train.max_steps=10")
    assert_error(code, err, 2, "no readable checkpoint in", "--restart")


# --- numerical faults, out of memory, a full disk -------------------------------------------------

def poison_loss(monkeypatch, bad_call, value: float) -> None:
    """Make the trainer's loss ``value`` (nan or inf) on the training micro-batches where
    ``bad_call(n)`` is true (n counts from 1); gradients become non-finite."""
    import nmtkit.training.loss as loss_module

    real = loss_module.projected_smoothed_loss
    calls = [0]

    def loss(*args):
        calls[0] += 1
        result, nll = real(*args)
        return (result * value if bad_call(calls[0]) else result), nll

    monkeypatch.setattr(loss_module, "projected_smoothed_loss", loss)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_an_isolated_non_finite_step_is_skipped_and_counted(tmp_path, prepared, monkeypatch, capsys, value):
    from nmtkit.training.checkpoint import latest_checkpoint

    recipe = recipe_in(tmp_path, prepared, max_steps=8, save_every=4)
    poison_loss(monkeypatch, lambda n: n in (3, 6), value)
    code, err = cli(monkeypatch, capsys, "train", str(recipe))
    assert code == 0, err
    assert " ".join(err.split()).count("update skipped (1 in a row)") == 2
    ck = latest_checkpoint(tmp_path / "train")
    assert ck.trainer.step == 8 and ck.trainer.skipped_steps == 2
    assert all(torch.isfinite(w).all() for w in ck.weights.values())


def test_consecutive_non_finite_steps_stop_with_the_last_checkpoint_intact(tmp_path, prepared, monkeypatch, capsys):
    from nmtkit.training.checkpoint import checkpoint_dirs, load_checkpoint

    recipe = recipe_in(tmp_path, prepared, max_steps=20, save_every=3, max_bad_steps=4)
    poison_loss(monkeypatch, lambda n: n > 7, float("nan"))
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe))
    last = tmp_path / "train" / "checkpoints" / "step_00000006"
    assert_error(code, err, 1, "4 consecutive non-finite updates", f"the last good checkpoint, {last}, is intact")
    assert checkpoint_dirs(tmp_path / "train")[-1] == last
    ck = load_checkpoint(last)
    assert ck.trainer.step == 6 and all(torch.isfinite(w).all() for w in ck.weights.values())

    poison_loss(monkeypatch, lambda n: True, float("nan"))
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe), "--restart")
    assert_error(code, err, 1, "4 consecutive non-finite updates; no checkpoint was written yet")


OUT_OF_MEMORY = [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to "
                 "allocate 8589934592 bytes"),
    MemoryError(),
]


@pytest.mark.parametrize("error", OUT_OF_MEMORY, ids=["cuda", "cpu", "python"])
def test_out_of_memory_names_the_batch_and_the_setting(tmp_path, prepared, monkeypatch, capsys, error):
    from nmtkit.models.transformer import Transformer
    from nmtkit.training.checkpoint import checkpoint_dirs, load_checkpoint

    recipe = recipe_in(tmp_path, prepared, max_steps=10, save_every=2)
    real, calls = Transformer.features, [0]  # what training (and the dev loss) runs before the output layer

    def features(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 5:
            raise error
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "features", features)
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe))
    line = assert_error(code, err, 1, "out of memory at update 5 on a batch of ", " sentences (",
                        "target tokens with padding); lower train.max_tokens (now 200)")
    sentences = int(line.split("batch of ")[1].split()[0])
    assert 1 <= sentences <= 200
    assert [p.name for p in checkpoint_dirs(tmp_path / "train")] == ["step_00000002", "step_00000004"]
    load_checkpoint(tmp_path / "train" / "checkpoints" / "step_00000004")


def test_other_runtime_errors_stay_tracebacks(tmp_path, prepared, monkeypatch, capsys):
    from nmtkit.models.transformer import Transformer

    recipe = recipe_in(tmp_path, prepared, max_steps=4)

    def features(self, *args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")  # a bug, not the user's

    monkeypatch.setattr(Transformer, "features", features)
    monkeypatch.setattr(sys, "argv", ["nmtkit", "-q", "train", str(recipe)])
    from nmtkit.cli import main

    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        main()


def full_disk(monkeypatch, step: int, file_name: str) -> None:
    """The disk fills up half way through ``file_name`` of checkpoint ``step`` (as safetensors
    reports it: its own error type, "os error 28") or, for trainer.json, as a plain OSError."""
    import safetensors.torch
    from safetensors import SafetensorError

    import nmtkit.training.checkpoint as checkpoint_module

    def in_target(path: Path) -> bool:
        return path.parent.name.startswith(f".step_{step:08d}.") and path.name.startswith(f".{file_name}.")

    real_save, real_text = safetensors.torch.save_file, checkpoint_module.atomic_write_text

    def save_file(tensors, filename, metadata=None):
        if not in_target(Path(filename)):
            return real_save(tensors, filename, metadata=metadata)
        data = safetensors.torch.save(tensors, metadata=metadata)
        Path(filename).write_bytes(data[: len(data) // 2])
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    def atomic_write_text(path, text):
        if Path(path).name == file_name and Path(path).parent.name.startswith(f".step_{step:08d}."):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_text(path, text)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    monkeypatch.setattr(checkpoint_module, "atomic_write_text", atomic_write_text)


@pytest.mark.parametrize("file_name", ["model.safetensors", "trainer.safetensors", "trainer.json"])
def test_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path, prepared, monkeypatch, capsys, file_name):
    from nmtkit.training.checkpoint import checkpoint_dirs, latest_checkpoint

    recipe = recipe_in(tmp_path, prepared, max_steps=10, save_every=2)
    full_disk(monkeypatch, 6, file_name)
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe))
    target = tmp_path / "train" / "checkpoints" / "step_00000006"
    assert_error(code, err, 1, f"cannot write {target}: No space left on device; nothing was replaced")
    root = tmp_path / "train" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_00000002", "step_00000004"]  # no temp left behind
    assert latest_checkpoint(tmp_path / "train").trainer.step == 4

    monkeypatch.undo()  # space again: the run resumes from step 4 and finishes
    code, err = cli(monkeypatch, capsys, "-q", "train", str(recipe))
    assert code == 0, err
    assert [p.name for p in checkpoint_dirs(tmp_path / "train")][-1] == "step_00000010"


def test_cli_reports_a_full_disk_outside_checkpoints_in_one_line(monkeypatch, capsys, tmp_path):
    import nmtkit.scoring.report as report

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out.json"))

    monkeypatch.setattr(report, "score_command", full)
    code, err = cli(monkeypatch, capsys, "score", "-r", "x", "-i", "y")
    assert_error(code, err, 1, f"{tmp_path / 'out.json'}: No space left on device")


@pytest.mark.parametrize("code, text", [(errno.EPERM, "Operation not permitted"), (errno.EIO, "Input/output error"),
                                        (errno.EINVAL, "Invalid argument")])
def test_any_os_error_naming_a_file_is_one_line(monkeypatch, capsys, tmp_path, code, text):
    """A file another user owns in a sticky /tmp (EPERM on the final rename), a failing disk, a name
    the file system refuses: one line naming the file, exit 1, not a traceback."""
    import nmtkit.scoring.report as report

    def refused(*args, **kwargs):
        raise OSError(code, text, str(tmp_path / "out.json"))

    monkeypatch.setattr(report, "score_command", refused)
    status, err = cli(monkeypatch, capsys, "score", "-r", "x", "-i", "y")
    assert_error(status, err, 1, f"{tmp_path / 'out.json'}: {text}")


def test_an_os_error_without_a_file_stays_a_traceback():
    """No file named: nothing the user can act on, so it is treated as a bug (kept for the report)."""
    from nmtkit.errors import user_os_error

    assert user_os_error(OSError(errno.EIO, "Input/output error")) is None
    assert user_os_error(OSError(errno.EPERM, "Operation not permitted")) == ("Operation not permitted", 1)


def test_no_partial_output_when_translate_fails_midway(tmp_path, tiny_spm):
    """Bad bytes on stdin's 10,001st line: the first chunk is translated, the error names
    the line, and the output file never appears (stdin is not scanned ahead like a file)."""
    from conftest import save_tiny_model

    model = save_tiny_model(tmp_path / "model", tiny_spm, seed=0)
    out = tmp_path / "out" / "hyp.txt"
    result = run_cli("translate", "-m", str(model), "-o", str(out), "-b", "1", "--max-len-b", "1", "--max-len-a", "0",
                     input=b"the cat\n" * 10_000 + b"the \xc0 dog\n")
    assert_error(result.returncode, result.stderr.decode(), 2, "<stdin>: line 10001 is not valid UTF-8 (byte 4)")
    assert not out.exists() and (not out.parent.exists() or not any(out.parent.iterdir()))


# --- translate on any text -----------------------------------------------------------------------

# a fuzz corpus of lines that have broken translation front ends: controls, NUL, bidi, emoji,
# combining marks, every character str.splitlines() splits on, BOMs, very long and blank lines
NASTY_LINES = [
    "", " ", "   \t  ", "\x00", "a\x00b\x00", "\x01\x02\x7f\x1b[31mred\x1b[0m", "\u202eevil\u202c", "\u200f\u200e\u061c",
    "שלום עולם", "مرحبا بالعالم", "😀 🇫🇷 👩‍👩‍👧 🏳️‍🌈", "e\u0301\u0301\u0301\u0301 a\u0308", "\u0300 starts combining",
    "\u2028", "a\u2029b", "x\x85y", "\x0b\x0c\x1c\x1d\x1e", "\ufeffthe cat", "\ud7ff\ue000\U0010ffff\ufffd",
    "z" * 10_000, "the cat " * 1250, "\r", "a\rb", "tab\there", "\u200b\u200c\u200d\u2060", "Ｔｈｅ　ｃａｔ",
    "ﬁ ﬂ Å Ω K", "<s> </s> <unk> <pad> ▁", "\\n \\t %s {0} ${x}",
]
FAST = dict(beam_size=2, max_len_a=0.0, max_len_b=3, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tiny_spm):
    from conftest import save_tiny_model

    from nmtkit.modeldir import load_model_dir

    model_dir = save_tiny_model(tmp_path_factory.mktemp("model") / "model", tiny_spm, seed=0)
    return model_dir, [load_model_dir(model_dir)]


def assert_one_line_each(outputs: list[str], inputs: list[str]) -> None:
    assert len(outputs) == len(inputs)
    for text, line in zip(outputs, inputs):
        assert "\t" not in text and len(text.splitlines()) <= 1, (line[:50], text)  # one line for every reader
        if not line.strip():
            assert text == ""


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)  # every Unicode scalar value
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(NASTY_LINES), ANY_TEXT), min_size=1, max_size=6))
def test_translate_lines_gives_one_line_per_line_on_any_text(tiny_model, lines):
    from nmtkit.decoding.translate import TranslateOptions, translate_lines

    assert_one_line_each(translate_lines(tiny_model[1], lines, TranslateOptions(**FAST)), lines)


def file_lines(content: bytes) -> list[bytes]:
    """The lines a reader that splits on \\n only sees (a missing final newline still ends a line)."""
    lines = content.split(b"\n")
    return lines[:-1] if lines[-1] == b"" else lines


LINE_BYTES = st.one_of(st.sampled_from([line.encode("utf-8") for line in NASTY_LINES if "\n" not in line]),
                       st.binary(max_size=20), ANY_TEXT.map(lambda s: s.encode("utf-8")))


@FUZZ
@given(st.lists(LINE_BYTES, max_size=6), st.sampled_from([b"", b"\n", b"\r\n"]), st.sampled_from(["strict", "replace"]))
def test_translate_file_on_any_bytes(tiny_model, tmp_path_factory, lines, ending, errors):
    """One output line per input line (CRLF, a missing final newline, U+2028 and NUL inside
    lines included); invalid UTF-8 is replaced, or is an error naming its first line that
    leaves no output file."""
    from nmtkit.decoding.translate import TranslateOptions, translate_lines
    from nmtkit.errors import DataError
    from nmtkit.runtime.console import NmtConsole
    from nmtkit.translate_files import translate_file

    model_dir, loaded = tiny_model
    content = b"\n".join(lines) + (ending if lines else b"")
    work = tmp_path_factory.mktemp("fuzz")
    (work / "in.txt").write_bytes(content)
    out = work / "out" / "hyp.txt"
    options = TranslateOptions(**FAST, errors=errors)
    raw_lines = file_lines(content)
    bad = [i for i, raw in enumerate(raw_lines, 1) if not _is_utf8(raw)]
    if errors == "strict" and bad:
        with pytest.raises(DataError, match=f"in.txt: line {bad[0]} is not valid UTF-8"):
            translate_file([str(model_dir)], work / "in.txt", out, options, NmtConsole(verbosity=-1))
        assert not out.exists()
        return
    translate_file([str(model_dir)], work / "in.txt", out, options, NmtConsole(verbosity=-1))
    written = out.read_bytes()
    assert written.count(b"\n") == len(raw_lines) and (not written or written.endswith(b"\n"))
    texts = [raw.decode("utf-8", errors="replace").rstrip("\r") for raw in raw_lines]
    got = written.decode("utf-8").split("\n")[:-1]
    assert_one_line_each(got, texts)
    assert got == translate_lines(loaded, texts, options)  # the file path adds nothing and loses nothing


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_nasty_lines_through_the_cli(tiny_model, tmp_path):
    """The corpus as one file, CRLF endings and no final newline, through ``nmtkit translate``."""
    model_dir, loaded = tiny_model
    lines = [line for line in NASTY_LINES if "\n" not in line and not line.endswith("\r")]
    (tmp_path / "in.txt").write_bytes("\r\n".join(lines).encode("utf-8"))
    result = run_cli("translate", "-m", str(model_dir), "-i", str(tmp_path / "in.txt"), "-b", "2", "--max-len-a", "0",
                     "--max-len-b", "3", "--dtype", "float32")  # FAST's dtype (auto is bf16 on bf16 CPUs)
    assert result.returncode == 0, result.stderr.decode()
    got = result.stdout.decode("utf-8").split("\n")
    assert got[-1] == "" and len(got) - 1 == len(lines)
    from nmtkit.decoding.translate import TranslateOptions, translate_lines

    assert got[:-1] == translate_lines(loaded, lines, TranslateOptions(**FAST))
