"""prepare, train and run keep README's rule: exit 2 when the command line, the recipe or a
file the user named is wrong, 1 when the run itself fails; and -q prints nothing but
warnings and errors."""
from __future__ import annotations

import fcntl
import os
import sys

import pytest
import yaml

from conftest import reversal_pairs, tiny_recipe, write_prepared
from support.cli import assert_error, cli, run_cli

MODEL = dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1)


@pytest.fixture()
def files_recipe(tmp_path):
    """A `files` recipe over six small text files, and a function to write it with changes."""
    files = {}
    for split, n in (("train", 60), ("dev", 8), ("test", 8)):
        pairs = reversal_pairs(n, len(files), length=5)
        files[split] = {}
        for side, lang in enumerate(("src", "tgt")):
            path = tmp_path / f"{split}.{lang}"
            path.write_text("".join(pair[side] + "\n" for pair in pairs))
            files[split][lang] = str(path)

    def write(**sections) -> str:
        recipe = tiny_recipe(tmp_path / "work", model=MODEL, data={"files": files},
                             train={"max_steps": 4, "max_tokens": 200, "validate_every": 2, "save_every": 2})
        for key, values in sections.items():
            recipe[key] = {**recipe.get(key, {}), **values} if isinstance(values, dict) else values
        path = tmp_path / f"recipe{len(list(tmp_path.glob('recipe*.yaml')))}.yaml"  # each call its own file
        path.write_text(yaml.safe_dump(recipe))
        return str(path)

    return write


@pytest.mark.parametrize("command", ["prepare", "train", "run"])
def test_bad_input_exits_2(command, files_recipe, tmp_path, monkeypatch, capsys):
    recipe = files_recipe()
    cases = [  # (arguments, fragment of the one error line)
        ([str(tmp_path / "missing.yaml")], "recipe not found"),
        ([recipe, "train.lr=nan"], "train.lr must be a finite number"),
        ([recipe, "train.max_steps=0"], "train.max_steps must be in [1, 2**62], got 0"),  # was an IndexError in run
        ([recipe, "data.source=bible"], "data.source 'bible' is not one of"),
        ([files_recipe(workdir=str(tmp_path / "train.src"))],  # workdir is a file
         "run `nmtkit prepare`" if command == "train" else "train.src/prepared: Not a directory"),
    ]
    if command != "train":
        cases.append(([files_recipe(data={"files": {"train": {"src": "nope", "tgt": "nope"}}})],
                      "(data.files.train.src = 'nope', relative to the current directory"))
    if command == "train":
        cases.append(([recipe], "run `nmtkit prepare` on this recipe first"))
    for args, fragment in cases:
        code, err = cli(monkeypatch, capsys, "-q", command, *args)
        assert_error(code, err, 2, fragment)


@pytest.mark.parametrize("command", ["prepare", "run"])
def test_a_prepare_in_progress_exits_1(command, files_recipe, tmp_path, monkeypatch, capsys):
    prepared = tmp_path / "work" / "prepared"
    prepared.mkdir(parents=True)
    with open(prepared / ".nmtkit.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, err = cli(monkeypatch, capsys, "-q", command, files_recipe())
    assert_error(code, err, 1, "is in use by another `nmtkit prepare`")


def test_prepare_waits_for_trainings_reading_the_directory_and_they_for_it(files_recipe, tmp_path, monkeypatch,
                                                                           capsys):
    """A training holds prepared/ shared (a sweep's trainings share it): a `prepare` would rewrite
    the ids and SentencePiece models that each of its checkpoints copies."""
    from nmtkit.errors import NmtkitError
    from nmtkit.storage.files import exclusive

    write_prepared(tmp_path / "work", reversal_pairs(60, 0, length=5), reversal_pairs(8, 1, length=5))
    prepared = tmp_path / "work" / "prepared"
    with exclusive(prepared, "`nmtkit prepare`", shared=True), exclusive(prepared, "`nmtkit prepare`", shared=True):
        code, err = cli(monkeypatch, capsys, "-q", "prepare", files_recipe())  # two readers, no writer
        assert_error(code, err, 1, "is in use by another `nmtkit prepare` or a `nmtkit train` reading it")
    with exclusive(prepared, "another `nmtkit prepare`"):
        code, err = cli(monkeypatch, capsys, "-q", "train", files_recipe())
    assert_error(code, err, 1, f"{prepared} is in use by `nmtkit prepare` (pid {os.getpid()} on ")
    with exclusive(prepared, "another `nmtkit prepare`"):  # free again once the readers are gone
        pass


def test_train_missing_packages_exit_1_and_changed_models_or_damaged_checkpoints_exit_2(files_recipe, tmp_path, monkeypatch, capsys):
    write_prepared(tmp_path / "work", reversal_pairs(60, 0, length=5), reversal_pairs(8, 1, length=5))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    code, err = cli(monkeypatch, capsys, "-q", "train", files_recipe(), "train.tensorboard=true")
    assert_error(code, err, 1, "needs the tensorboard package")
    assert not (tmp_path / "work" / "train").exists()  # found before the model was built
    code, err = cli(monkeypatch, capsys, "-q", "train", files_recipe())
    assert code == 0 and err == "", err
    code, err = cli(monkeypatch, capsys, "-q", "train", files_recipe(), "train.max_steps=6", "model.ffn_dim=48")
    assert_error(code, err, 2, "model settings differ from the checkpoints")
    for ck in (tmp_path / "work" / "train" / "checkpoints").iterdir():
        (ck / "model.safetensors").write_bytes(b"damaged")
    code, err = cli(monkeypatch, capsys, "-q", "train", files_recipe(), "train.max_steps=6")
    assert_error(code, err, 2, "no readable checkpoint")  # damaged input files are bad input (README)


def test_quiet_train_prints_nothing_but_warnings(files_recipe, tmp_path):
    write_prepared(tmp_path / "work", reversal_pairs(60, 0, length=5), reversal_pairs(8, 1, length=5))
    out = run_cli("-q", "train", files_recipe())
    assert out.returncode == 0 and out.stdout == b"" and out.stderr == b"", out.stderr.decode()
    out = run_cli("-q", "train", files_recipe(), "train.max_steps=6", "train.save_every=1000")
    assert out.returncode == 0 and out.stdout == b""
    assert out.stderr.decode().splitlines() == ["warning: resuming with train.max_steps = 6 (was 4)",
                                                "warning: resuming with train.save_every = 1000 (was 2)"]
    loud = run_cli("train", files_recipe(), "train.max_steps=8")
    assert "parameters: total" in loud.stderr.decode()  # what -q hid
    dry = run_cli("-q", "train", files_recipe(), "--dry-run")
    assert "parameters: total" in dry.stderr.decode()  # the answer to --dry-run, even with -q


def test_a_model_too_big_for_the_memory_is_one_line_and_dry_run_still_answers(files_recipe, tmp_path, monkeypatch,
                                                                              capsys):
    """A size within the ranges may not fit this machine: exit 1 in one line naming the size (the
    allocator's failure is simulated); --dry-run counts on the meta device and still answers."""
    import torch

    from nmtkit.models.transformer import Transformer

    write_prepared(tmp_path / "work", reversal_pairs(60, 0, length=5), reversal_pairs(8, 1, length=5))
    built = Transformer.__init__

    def allocate(self, *args, **kwargs):
        if torch.empty(0).device.type != "meta":
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
        built(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "__init__", allocate)
    code, err = cli(monkeypatch, capsys, "-q", "train", files_recipe())
    assert_error(code, err, 1, "not enough memory to build the model (", " parameters, ",
                 "make model dimensions, layers or vocab.size smaller")
    code, err = cli(monkeypatch, capsys, "-q", "train", files_recipe(), "--dry-run")
    assert code == 0 and "parameters: total" in err, err


def test_train_refuses_data_or_vocab_settings_that_prepared_was_not_made_with(files_recipe, monkeypatch, capsys):
    """`train r.yaml vocab.size=N` on another prepare once trained the old vocabulary silently."""
    recipe = files_recipe()
    code, err = cli(monkeypatch, capsys, "-q", "prepare", recipe)
    assert code == 0, err
    size = yaml.safe_load(open(recipe))["vocab"]["size"]
    for overrides, change in ((["vocab.size=12"], f"vocab.size: {size} -> 12"),
                              (["data.clean.max_ratio=2.5"], "data.clean.max_ratio: 3.0 -> 2.5")):
        code, err = cli(monkeypatch, capsys, "-q", "train", recipe, *overrides)
        assert_error(code, err, 2, f"was made with other data or vocab settings than the recipe's: {change}; "
                                   f"run `nmtkit prepare` on this recipe first")
    code, err = cli(monkeypatch, capsys, "train", recipe, "vocab.size=12", "--dry-run")
    assert code == 0 and "was made with other data or vocab settings" in " ".join(err.split())  # said, not hidden
    code, err = cli(monkeypatch, capsys, "-q", "train", recipe, "vocab.workers=1", "train.max_steps=2")
    assert code == 0, err  # a speed setting is not a difference


def test_prepare_never_replaces_a_config_yaml_it_did_not_write(files_recipe, tmp_path, monkeypatch, capsys):
    """A recipe named config.yaml in its own workdir (``workdir: .``) was rewritten as a resolved
    dump, its comments lost; a config.yaml nmtkit wrote is still updated."""
    work = tmp_path / "work"
    work.mkdir()
    mine = work / "config.yaml"
    mine.write_text("# my recipe\n" + open(files_recipe()).read())
    code, err = cli(monkeypatch, capsys, "-q", "prepare", str(mine))
    assert_error(code, err, 2, f"{mine} exists and nmtkit did not write it")
    assert mine.read_text().startswith("# my recipe\n")
    other = files_recipe()
    mine.unlink()
    assert cli(monkeypatch, capsys, "-q", "prepare", other)[0] == 0
    saved = mine.read_text()
    assert cli(monkeypatch, capsys, "-q", "prepare", other, "data.clean.max_ratio=2.5")[0] == 0
    assert mine.read_text() != saved and "max_ratio: 2.5" in mine.read_text()
    # an older nmtkit's dump: no header, keys since added missing, keys since removed present
    older = yaml.safe_load(mine.read_text())
    for section, key in (("model", "key_dim"), ("vocab", "from"), ("model", "moe_experts")):
        older[section].pop(key)
    older["train"]["workers"] = 0
    mine.write_text(yaml.safe_dump(older, sort_keys=False))
    assert cli(monkeypatch, capsys, "-q", "prepare", other)[0] == 0
    assert mine.read_text().startswith("# The resolved recipe, written by nmtkit")


def test_settings_an_older_prepare_did_not_record_count_at_their_defaults():
    """A data or vocab key added to nmtkit later must not make every earlier prepare a difference."""
    from nmtkit.config import from_dict
    from nmtkit.data.identity import prepared_settings, settings_changes, with_defaults

    cfg = from_dict({"data": {"corpora": [{"name": "a", "source": "files", "files": {"train": {"en": "x", "es": "y"}}}]}})
    recorded = prepared_settings(cfg)
    del recorded["vocab"]["input_bytes"], recorded["data"]["clean"]["dedup"], recorded["data"]["corpora"][0]["tag"]
    assert settings_changes(with_defaults(recorded), prepared_settings(cfg)) == []
    recorded["vocab"]["size"] = 4000
    assert settings_changes(with_defaults(recorded), prepared_settings(cfg)) == ["vocab.size: 4000 -> 8000"]


def test_main_in_process_leaves_the_callers_sigterm_handler(tmp_path, monkeypatch, capsys):
    """The CLI turns SIGTERM into a clean exit 143 while it runs; called in-process (a script, a
    test) it leaves the caller's handler as it found it afterwards, default or the caller's own."""
    import signal

    def mine(signum, frame) -> None:
        pass

    before = signal.getsignal(signal.SIGTERM)
    try:
        for handler in (signal.SIG_DFL, mine):
            signal.signal(signal.SIGTERM, handler)
            code, err = cli(monkeypatch, capsys, "info", str(tmp_path / "missing"))
            assert code == 2 and "not found" in err, err
            assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, before)
