"""The files a work directory holds besides models, checkpoints and prepared ids (those are in
test_safe_loading): a run's metrics.jsonl, config.yaml and data.json, prepare's step stamps,
the cached translations of ``nmtkit run``, a sweep's records and plan, and lock files. Each is
truncated, flipped, replaced by another file type and by a pickle: the reader gives one line,
or falls back as documented (a warning; a step or translation made again), never a traceback
and never a silently wrong result."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from conftest import MODEL, reversal_files, tiny_recipe
from support.cli import assert_one_line, cli
from support.damage import MUTATIONS, copy_work, mutate


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A work directory after ``nmtkit run`` of a tiny files recipe (recipe.yaml beside it)."""
    from nmtkit.config import from_dict
    from nmtkit.pipeline import run_recipe
    from nmtkit.runtime.console import get_console

    root = tmp_path_factory.mktemp("records")
    recipe = tiny_recipe(root / "work", model=MODEL, data={"files": reversal_files(root)},
                         train=dict(max_steps=4, save_every=2, validate_every=2, max_tokens=100, average_last=2))
    (root / "work").mkdir()
    (root / "work" / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    run_recipe(from_dict(recipe), get_console(-1))
    return root / "work"


def assert_fine_or_one_line(code: int, err: str, marker: Path) -> None:
    """Success (a fallback may have warned), or exactly one error line."""
    assert "Traceback" not in err, err
    if code != 0:
        assert_one_line(code, err, (1, 2), marker)
    assert not marker.exists()


def test_quiet_prepare_and_run_print_nothing_on_stderr(finished, tmp_path, monkeypatch, capsys):
    """-q for the two commands the option fuzz only sees failing."""
    _, recipe = copy_work(finished, tmp_path)
    assert cli(monkeypatch, capsys, "-q", "prepare", str(recipe)) == (0, "")
    assert cli(monkeypatch, capsys, "-q", "run", str(recipe)) == (0, "")


# --- RUN_DIR/metrics.jsonl: read by plot, info and sweep tables ---------------------------------

@pytest.mark.parametrize("how", [*MUTATIONS, "a record without a step"])
def test_a_damaged_metrics_log(finished, tmp_path, monkeypatch, capsys, how):
    """A cut last line is what a run still writing leaves: skipped, the rest plotted. Any other
    damage (here always before the last line) stops plot in one line naming the log, and info
    shows the card without training, saying why."""
    work, _ = copy_work(finished, tmp_path)
    metrics, marker = work / "train" / "metrics.jsonl", tmp_path / "ran"
    data = metrics.read_bytes()
    assert data[len(data) // 2:].count(b"\n") >= 2  # truncation cuts, and a flip hits, a line before the last
    if how == "a record without a step":
        lines = metrics.read_text().splitlines()
        metrics.write_text("\n".join([lines[0], '{"type": "train", "step": "4", "loss": 1.0}', *lines[1:]]) + "\n")
    else:
        mutate(metrics, how, marker)
    code, err = cli(monkeypatch, capsys, "plot", str(work / "train"), "-o", str(tmp_path / "c.png"), "--size",
                    "200x150")
    assert "Traceback" not in err and not marker.exists(), err
    if how == "truncated":
        assert code == 0 and (tmp_path / "c.png").exists(), err
    else:
        assert_one_line(code, err, (2,), marker)
        assert f"{metrics}" in err and not (tmp_path / "c.png").exists()
    code, err = cli(monkeypatch, capsys, "info", str(work / "train" / "best"))
    assert code == 0 and "Traceback" not in err, err
    left_out = f"training left out: {metrics}" in " ".join(err.split())
    assert left_out == (how != "truncated"), err


# --- RUN_DIR/config.yaml and RUN_DIR/data.json: read when a run resumes -------------------------

ALIASES = 'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8))


@pytest.mark.parametrize("how", [*MUTATIONS, "aliases", "deep"])
def test_a_damaged_run_config_is_not_compared(finished, tmp_path, monkeypatch, capsys, how):
    work, recipe = copy_work(finished, tmp_path)
    saved, marker = work / "train" / "config.yaml", tmp_path / "ran"
    if how == "aliases":  # 10**9 values once expanded
        saved.write_text(ALIASES)
    elif how == "deep":
        saved.write_text("model: " + "[" * 3000 + "]" * 3000 + "\n")
    else:
        mutate(saved, how, marker)
    code, err = cli(monkeypatch, capsys, "train", str(recipe), "train.max_steps=6")
    assert_fine_or_one_line(code, err, marker)
    text = " ".join(err.split())
    if code == 0 and how != "flipped":  # a flip may leave valid YAML: then it is compared as it reads
        assert f"warning: {saved} is damaged: settings are not compared with the previous session's" in text, err
    if code == 0:
        assert "resumed from step_00000004" in text


@pytest.mark.parametrize("how", MUTATIONS)
def test_a_damaged_data_record(finished, tmp_path, monkeypatch, capsys, how):
    """Damaged beyond reading: a warning, and the run resumes (recorded again); a flip that still
    reads as a record names other data: the one-line refusal that --restart answers."""
    work, recipe = copy_work(finished, tmp_path)
    record, marker = work / "train" / "data.json", tmp_path / "ran"
    intact = record.read_text()
    mutate(record, how, marker)
    code, err = cli(monkeypatch, capsys, "train", str(recipe), "train.max_steps=6")
    assert_fine_or_one_line(code, err, marker)
    if code == 0:
        assert f"warning: {record} is damaged" in " ".join(err.split()), err
        assert record.read_text() == intact
    else:
        assert code == 2 and "use --restart to start over" in err


# --- prepared/stamps/*.json: a skipped step's report goes into the manifest -----------------------

@pytest.mark.parametrize("how", [*MUTATIONS, "a digit in the report"])
@pytest.mark.parametrize("step", ["fetch", "spm", "encode"])
def test_a_damaged_stamp_makes_its_step_run_again(finished, tmp_path, monkeypatch, capsys, step, how):
    from nmtkit.data.ids import load_split

    work, recipe = copy_work(finished, tmp_path)
    prepared, marker = work / "prepared", tmp_path / "ran"
    stamp = prepared / "stamps" / f"{step}.json"
    manifest = json.loads((prepared / "manifest.json").read_text())
    ids = load_split(prepared / "train.npz")
    if how == "a digit in the report":  # still valid JSON, with a count that is not the data's
        text = stamp.read_text()
        position = next(i for i in range(text.index('"report"'), len(text)) if text[i].isdigit())
        stamp.write_text(text[:position] + str((int(text[position]) + 1) % 10) + text[position + 1:])
    else:
        mutate(stamp, how, marker)
    code, err = cli(monkeypatch, capsys, "prepare", str(recipe))
    assert code == 0 and "Traceback" not in err and not marker.exists(), err
    assert f"{step} done" in err, err  # made again, not taken from the damaged stamp
    again = json.loads((prepared / "manifest.json").read_text())
    if again == manifest:
        assert load_split(prepared / "train.npz").digest() == ids.digest()
        return
    # SentencePiece trained again on several threads need not give the same bytes: then the run
    # beside it no longer fits, and prepare says so (train refuses to resume it: test_integrity)
    assert step == "spm" and {**again, "vocab": None, "tokens": None} == {**manifest, "vocab": None, "tokens": None}
    assert "the data changed under the run" in " ".join(err.split()), err


# --- results/*.hyp: the translations ``nmtkit run`` caches ---------------------------------------

@pytest.mark.parametrize("how", MUTATIONS)
def test_a_damaged_cached_translation_is_made_again(finished, tmp_path, monkeypatch, capsys, how):
    work, recipe = copy_work(finished, tmp_path)
    hyp, marker = work / "results" / "test.hyp", tmp_path / "ran"
    intact = hyp.read_bytes()
    scores = json.loads((work / "results" / "results.json").read_text())["splits"]["test"]
    mutate(hyp, how, marker)
    code, err = cli(monkeypatch, capsys, "run", str(recipe))
    assert code == 0 and "Traceback" not in err and not marker.exists(), err
    assert "test: translated 6 sentences" in err and "dev: translations up to date" in err, err
    assert hyp.read_bytes() == intact
    again = json.loads((work / "results" / "results.json").read_text())["splits"]["test"]
    assert {m: again[m] for m in ("bleu", "chrf", "ter")} == {m: scores[m] for m in ("bleu", "chrf", "ter")}


@pytest.mark.parametrize("name", ["results.md", "results.json", "test.hyp", "dev.hyp.stamp", "."])
def test_run_refuses_result_files_it_did_not_write(tmp_path, monkeypatch, capsys, name):
    """A work directory may be the user's own (``workdir: .``): a results.md, results.json or
    translation of theirs in results/ was silently replaced. Refused in one line before any work."""
    from nmtkit.storage.files import atomic_write_text

    recipe = tiny_recipe(tmp_path / "work", model=MODEL, data={"files": reversal_files(tmp_path)})
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    mine = (tmp_path / "work" / "results" / name) if name != "." else tmp_path / "work" / "results"
    mine.parent.mkdir(parents=True)
    atomic_write_text(mine, "my notes\n")
    code, err = cli(monkeypatch, capsys, "run", str(tmp_path / "recipe.yaml"))
    assert_one_line(code, err, (2,), tmp_path / "ran")
    assert f"{mine} exists and nmtkit did not write it" in err, err
    assert mine.read_text() == "my notes\n" and not (tmp_path / "work" / "prepared").exists()


def test_a_results_directory_of_runs_own_is_recognised(finished, tmp_path):
    """run's results/ (a stamp or results.json of run's there) is run's, a file damaged there
    included (it is made again); a user's file of those names anywhere else is refused."""
    from nmtkit.config import load_config
    from nmtkit.errors import ConfigError
    from nmtkit.pipeline import refuse_foreign_results

    work, recipe = copy_work(finished, tmp_path)
    cfg, results = load_config(recipe), work / "results"
    refuse_foreign_results(cfg)  # as run left it
    (results / "results.md").write_text("my notes\n")
    (results / "test.hyp").write_text("edited\n")
    refuse_foreign_results(cfg)  # the directory is run's: a damaged file is made again
    (results / "dev.hyp.stamp").unlink()
    (results / "test.hyp.stamp").write_text("{}")
    refuse_foreign_results(cfg)  # run's results.json
    (results / "results.json").write_text(json.dumps({"splits": {}}))  # not run's: no model_dir
    with pytest.raises(ConfigError, match=r"results/results.json exists and nmtkit did not write it"):
        refuse_foreign_results(cfg)


class Killed(BaseException):
    """A kill: nothing catches it, nothing after it runs."""


def test_a_run_killed_between_a_translation_and_its_stamp_runs_again(finished, tmp_path, monkeypatch, capsys):
    """A first run killed after one of the two writes of a translation: with the translation
    first it left results/dev.hyp alone, which the rerun refused as the user's. The stamp goes
    first; the rerun takes results/ for run's and translates dev again (no translation there has
    the stamp's sha256)."""
    import nmtkit.pipeline as pipeline

    work, recipe = copy_work(finished, tmp_path)
    results = work / "results"
    intact = {name: (results / name).read_bytes() for name in ("dev.hyp", "test.hyp")}
    for path in results.iterdir():  # a first run: nothing of run's there yet
        path.unlink()
    written, reals = [], {name: getattr(pipeline, name, None) for name in ("atomic_write_text", "atomic_open")}

    def killed_after_one(real):  # the first file written, whichever way, then the kill
        def write(path, *args):
            if written:
                raise Killed
            written.append(Path(path).name)
            return real(path, *args)
        return write

    for name, real in reals.items():
        monkeypatch.setattr(pipeline, name, killed_after_one(real), raising=False)
    with pytest.raises(Killed):
        cli(monkeypatch, capsys, "run", str(recipe))
    assert written == ["dev.hyp.stamp"] and sorted(os.listdir(results)) == ["dev.hyp.stamp"]
    for name, real in reals.items():
        monkeypatch.setattr(pipeline, name, real, raising=False)
    code, err = cli(monkeypatch, capsys, "run", str(recipe))
    assert code == 0 and "dev: translated 6 sentences" in err and "test: translated 6 sentences" in err, err
    assert {name: (results / name).read_bytes() for name in intact} == intact
    assert json.loads((results / "results.json").read_text())["splits"].keys() == {"dev", "test"}


def test_results_of_an_older_version_with_plain_stamps_are_runs(finished, tmp_path, monkeypatch, capsys):
    """nmtkit before JSON stamps wrote the bare digest (16 hex digits) as SPLIT.hyp.stamp: such a
    results/ is run's (its translations are made again), not refused as the user's."""
    from nmtkit.config import load_config
    from nmtkit.pipeline import refuse_foreign_results

    work, recipe = copy_work(finished, tmp_path)
    results = work / "results"
    intact = (results / "test.hyp").read_bytes()
    for name in ("results.json", "results.md"):
        (results / name).unlink()
    for split in ("dev", "test"):
        (results / f"{split}.hyp.stamp").write_text("3f2a9c0d1e4b5a60")
    refuse_foreign_results(load_config(recipe))
    code, err = cli(monkeypatch, capsys, "run", str(recipe))
    assert code == 0 and "dev: translated 6 sentences" in err and "test: translated 6 sentences" in err, err
    assert (results / "test.hyp").read_bytes() == intact and (results / "results.json").is_file()


def test_another_test_set_of_as_many_lines_is_translated_anew(finished, tmp_path, monkeypatch, capsys):
    """The cache is keyed by the source text, not only its length: a different test set with the
    same number of lines is translated, never scored with the old one's translations."""
    work, recipe = copy_work(finished, tmp_path)
    data = yaml.safe_load(recipe.read_text())
    for lang in ("src", "tgt"):
        old = Path(data["data"]["files"]["test"][lang])
        new = tmp_path / f"other-test.{lang}"
        new.write_text("".join(line + "\n" for line in reversed(old.read_text().splitlines())))
        data["data"]["files"]["test"][lang] = str(new)
    recipe.write_text(yaml.safe_dump(data))
    code, err = cli(monkeypatch, capsys, "run", str(recipe))
    assert code == 0 and "Traceback" not in err, err
    assert "test: translated 6 sentences" in err and "dev: translations up to date" in err, err


def test_run_hands_trainings_freed_memory_back_before_it_translates(finished, tmp_path, monkeypatch, capsys):
    """Training's freed heap goes back to the kernel before translation starts (the search threads
    could not reuse it: runtime/allocator.py), after training, also when training had finished."""
    from nmtkit import pipeline
    from nmtkit.runtime import allocator
    from nmtkit.training import trainer

    work, recipe = copy_work(finished, tmp_path)
    order = []

    def logged(name, real):
        def call(*args, **kwargs):
            order.append(f"{name} starts")
            result = real(*args, **kwargs)
            order.append(f"{name} ends")
            return result
        return call

    for module, name in ((trainer, "train"), (allocator, "hand_back_freed_memory"), (pipeline, "choose_model")):
        monkeypatch.setattr(module, name, logged(name, getattr(module, name)))
    code, err = cli(monkeypatch, capsys, "run", str(recipe))
    assert code == 0, err
    assert order == ["train starts", "train ends", "hand_back_freed_memory starts", "hand_back_freed_memory ends",
                     "choose_model starts", "choose_model ends"]


# --- the recipe and the sweep file themselves ------------------------------------------------------

def loader_verdict(load, path: Path) -> tuple[int, str]:
    """What the loader itself says of a damaged file: (0, "") when what is left is still a valid
    recipe or sweep (a cut at a line end, a flip that stays valid text), else (2, its message)."""
    from nmtkit.errors import ConfigError

    try:
        load(path)
    except ConfigError as err:
        return 2, str(err)
    return 0, ""


@pytest.mark.parametrize("how", MUTATIONS)
def test_a_damaged_recipe_or_sweep_file(finished, tmp_path, monkeypatch, capsys, how):
    """A damaged recipe or sweep file is refused in one line with the loader's own message
    (exit 2) exactly when the loader refuses it; another file type and a pickle always are."""
    from nmtkit.config import load_config
    from nmtkit.sweep.spec import load_sweep

    work, recipe = copy_work(finished, tmp_path)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"recipe": str(recipe), "workdir": str(tmp_path / "sweep"),
                                     "variants": [{"name": "a"}, {"name": "b", "overrides": {"train.lr": 0.01}}]}))
    marker = tmp_path / "ran"
    for path, load, command in ((recipe, load_config, ("train", str(recipe), "--dry-run")),
                                (sweep, load_sweep, ("sweep", str(sweep), "--dry-run"))):
        mutate(path, how, marker)
        expected, message = loader_verdict(load, path)
        if how in ("another file type", "pickle"):
            assert expected == 2, message
        code, err = cli(monkeypatch, capsys, "-q", *command)
        assert "Traceback" not in err and not marker.exists(), err
        assert code == expected, err
        if expected:
            assert_one_line(code, err, (2,), marker)
            assert message in err, err


# --- lock files ---------------------------------------------------------------------------------

def test_a_lock_file_of_the_users_in_the_work_directory_is_left_alone(finished, tmp_path, monkeypatch, capsys):
    """A work directory may be the user's own: their `.lock` there is neither written nor taken
    as nmtkit's lock (nmtkit's is `.nmtkit.lock`)."""
    work, recipe = copy_work(finished, tmp_path)
    (work / ".lock").write_text("theirs\n")
    os.chmod(work / ".lock", 0o644)
    code, err = cli(monkeypatch, capsys, "train", str(recipe), "train.max_steps=6")
    assert code == 0, err
    assert (work / ".lock").read_text() == "theirs\n" and (work / ".nmtkit.lock").read_text() == ""


def test_a_lock_that_is_a_link_is_refused_and_its_target_kept(finished, tmp_path, monkeypatch, capsys):
    work, recipe = copy_work(finished, tmp_path)
    mine = tmp_path / "mine.txt"
    mine.write_text("my notes\n")
    (work / ".nmtkit.lock").unlink(missing_ok=True)
    (work / ".nmtkit.lock").symlink_to(mine)
    code, err = cli(monkeypatch, capsys, "train", str(recipe), "train.max_steps=6")
    assert_one_line(code, err, (2,), tmp_path / "ran")
    assert f"{work / '.nmtkit.lock'}" in err and mine.read_text() == "my notes\n"
