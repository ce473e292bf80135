"""``nmtkit sweep`` on a tiny generated task: variants sharing one prepare, the results table and
its p-values, skipping finished variants, ``--only``, a kill mid-sweep and its resume,
``--dry-run`` and one-line errors for bad sweep files. The first sweep, the killed one and the
one-line errors run the real command line; the other sweeps run ``main`` in this process (their
runs are still `nmtkit run` children), which spares each a start-up and torch's import."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import tiny_recipe
from support.sweeps import ENV, results_of, sweep_cli, sweep_here, without_timing, write_sweep, write_task


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A whole two-variant sweep, run once."""
    root = tmp_path_factory.mktemp("sweep")
    write_task(root)
    sweep = write_sweep(root, "pair")
    result = sweep_cli(sweep)
    assert result.returncode == 0, result.stderr
    return root, sweep, root / "pair", result


def test_two_variants_share_one_prepare(finished):
    _, _, sweep_dir, _ = finished
    shared = list((sweep_dir / "prepared").iterdir())
    assert len(shared) == 1
    for name in ("baseline", "fast"):
        assert (sweep_dir / "variants" / name / "prepared").resolve() == shared[0].resolve()
    logs = [(sweep_dir / "variants" / name / "run.log").read_text() for name in ("baseline", "fast")]
    assert "fetch done, spm done, encode done" in logs[0]
    assert "fetch up to date, spm up to date, encode up to date" in logs[1]


def test_results_columns_and_p_values(finished):
    from nmtkit.config import load_config
    from nmtkit.models.build import build_model, parameter_table
    from nmtkit.scoring.significance import paired_test
    from nmtkit.storage.files import read_lines

    root, _, sweep_dir, result = finished
    results = results_of(sweep_dir)
    rows = {row["name"]: row for row in results["variants"]}
    assert list(rows) == ["baseline", "fast"] and results["baseline"] == "baseline"
    assert rows["fast"]["settings"] == ["train.lr=0.01"] and rows["baseline"]["settings"] == []
    refs = read_lines(sweep_dir / "prepared" / os.listdir(sweep_dir / "prepared")[0] / "test.tgt")
    hyps = {name: read_lines(sweep_dir / "variants" / name / "results" / "test.hyp") for name in rows}
    for name, row in rows.items():
        assert row["status"] == "done"
        own = json.loads((sweep_dir / "variants" / name / "results" / "results.json").read_text())
        assert row["test_bleu"] == own["splits"]["test"]["bleu"]["score"]
        assert row["test_chrf"] == own["splits"]["test"]["chrf"]["score"]
        assert row["test_ter"] == own["splits"]["test"]["ter"]["score"]
        assert row["dev_bleu"] == own["splits"]["dev"]["bleu"]["score"]
        metrics = [json.loads(line) for line in (sweep_dir / "variants" / name / "train" / "metrics.jsonl").open()]
        assert row["dev_loss"] == [m["dev_loss"] for m in metrics if m["type"] == "valid"][-1]
        cfg = load_config(root / "base.yaml", [f"train.lr={0.01 if name == 'fast' else 0.003}"])
        assert row["parameters"] == row["active_parameters"] == parameter_table(build_model(cfg.model, 16, 16))["total"]
        for key in ("train_tok_s", "train_minutes", "decode_sent_s", "peak_rss_mib"):
            assert row[key] is not None and row[key] >= 0, key
        assert row["peak_rss_mib"] > 50  # a Python process with torch loaded
    assert rows["baseline"]["p_value"] is None
    expected = paired_test(hyps["fast"], hyps["baseline"], [refs], metrics=("bleu",), resamples=1000)
    assert rows["fast"]["p_value"] == round(expected["bleu"].p_value, 4)
    assert hyps["fast"] != hyps["baseline"]
    table = (sweep_dir / "results.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| variant"))
    assert header.split(" | ")[1:4] == ["test BLEU", "p", "chrF"]
    for column in ("dev BLEU", "dev loss", "params", "active", "train tok/s", "train min", "decode sent/s",
                   "peak RSS MiB", "settings"):
        assert column in header
    assert f"| fast | {rows['fast']['test_bleu']:.2f} | {rows['fast']['p_value']:.3f} |" in table
    assert "test BLEU" in result.stderr  # the summary table


@pytest.mark.parametrize("name", ["results/results.json", "sweep-run.json", "../../sweep.json"])
def test_damaged_sweep_records_read_as_pending_or_are_one_line(finished, monkeypatch, capsys, name):
    """A variant's results.json or sweep-run.json damaged any way: the variant reads as pending (it
    runs again) or, where the damage left a sound record, as it was; the table is still written.
    A damaged sweep.json is a one-line error for `nmtkit plot`. The files are put back after."""
    from support.cli import cli
    from support.damage import MUTATIONS, mutate

    from nmtkit.models.build import parameter_counts
    from nmtkit.sweep.record import variant_status
    from nmtkit.sweep.results import write_results
    from nmtkit.sweep.spec import load_sweep

    _, sweep_file, sweep_dir, _ = finished
    path = sweep_dir / "variants" / "fast" / name
    intact, results = path.read_bytes(), (sweep_dir / "results.json").read_bytes()
    plan = load_sweep(sweep_file)
    fast = plan.variants[1]
    try:
        for how in (*MUTATIONS, "wrong types"):
            if how == "wrong types":
                path.write_text(json.dumps({"config": fast.config_key, "status": "done", "sessions": "2",
                                            "peak_rss_mib": "x", "splits": {"dev": 1, "test": []},
                                            "variants": [{"name": 3}]}))
            else:
                mutate(path, how, sweep_dir / "ran")
            if name.endswith("sweep.json"):
                code, err = cli(monkeypatch, capsys, "plot", str(sweep_dir), "-o", str(sweep_dir / "c.png"))
                assert code == 2 and err.startswith("nmtkit: error: ") and err.count("\n") == 1, err
                assert f"{path.resolve()}" in err or f"{path}" in err
            else:
                assert variant_status(plan, fast) in ("pending", "done")
                counts = {v.name: parameter_counts(v.config.model, 16, 16) for v in plan.variants}
                rows = write_results(plan, counts)["variants"]
                assert rows[1]["status"] == variant_status(plan, fast) and rows[0]["status"] == "done"
            path.write_bytes(intact)
    finally:
        path.write_bytes(intact)
        (sweep_dir / "results.json").write_bytes(results)
    assert not (sweep_dir / "ran").exists()


def test_finished_variants_are_skipped(finished):
    _, sweep, sweep_dir, _ = finished
    before = results_of(sweep_dir)
    checkpoints = sorted(p.name for p in (sweep_dir / "variants" / "fast" / "train" / "checkpoints").iterdir())
    result = sweep_here(sweep)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("finished earlier with these settings, skipped") == 2
    assert results_of(sweep_dir) == before
    assert sorted(p.name for p in (sweep_dir / "variants" / "fast" / "train" / "checkpoints").iterdir()) == checkpoints


def test_a_finished_variant_whose_translation_went_missing_runs_again(finished):
    """One variant's test.hyp missing or edited after it finished stopped every rerun of the
    sweep at its p-value ("file not found", exit 2, later variants never run): the variant is
    pending instead, and the rerun translates it again (without training) while the others are
    skipped."""
    from nmtkit.models.build import parameter_counts
    from nmtkit.sweep.record import variant_status
    from nmtkit.sweep.results import write_results
    from nmtkit.sweep.spec import load_sweep

    _, sweep_file, sweep_dir, _ = finished
    hyp = sweep_dir / "variants" / "baseline" / "results" / "test.hyp"
    intact, before = hyp.read_bytes(), results_of(sweep_dir)
    plan = load_sweep(sweep_file)
    counts = {v.name: parameter_counts(v.config.model, 16, 16) for v in plan.variants}
    for damage in (lambda: hyp.write_bytes(intact[:-3]), hyp.unlink):
        damage()
        assert variant_status(plan, plan.variants[0]) == "pending"
        rows = write_results(plan, counts)["variants"]
        assert [row["status"] for row in rows] == ["pending", "done"] and rows[1]["p_value"] is None
    result = sweep_here(sweep_file)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("finished earlier with these settings, skipped") == 1
    log = (sweep_dir / "variants" / "baseline" / "run.log").read_text()
    assert "training already finished" in log and "test: translated 40 sentences" in log
    assert hyp.read_bytes() == intact
    assert without_timing(results_of(sweep_dir)) == without_timing(before)


def test_a_test_set_gone_missing_costs_the_p_value_not_the_table(finished):
    from nmtkit.models.build import parameter_counts
    from nmtkit.sweep.results import write_results
    from nmtkit.sweep.spec import load_sweep

    _, sweep_file, sweep_dir, _ = finished
    [prepared] = (sweep_dir / "prepared").iterdir()
    plan = load_sweep(sweep_file)
    counts = {v.name: parameter_counts(v.config.model, 16, 16) for v in plan.variants}
    (prepared / "test.tgt").rename(prepared / "test.tgt.away")
    try:
        rows = write_results(plan, counts)["variants"]
    finally:
        (prepared / "test.tgt.away").rename(prepared / "test.tgt")
    assert [row["status"] for row in rows] == ["done", "done"] and rows[1]["p_value"] is None
    assert rows[1]["p_value_note"].startswith("no p-value: file not found") and "test.tgt" in rows[1]["p_value_note"]
    assert write_results(plan, counts)["variants"][1]["p_value"] == results_of(sweep_dir)["variants"][1]["p_value"]


def test_limits_lowered_below_a_finished_run_and_its_best_checkpoint_settings_are_changes(finished, tmp_path):
    """A sweep counted a finished run as done after train.max_steps went from 12 to 6 (reporting
    12 steps as 6) or train.best_metric to bleu (no dev BLEU ever computed): those now train
    afresh. Raised limits, limits the run has not passed, and best-checkpoint settings of a
    run that has not finished still resume."""
    from nmtkit.config import load_config
    from nmtkit.sweep.runner import _trained_otherwise
    from nmtkit.training.checkpoint import checkpoint_dirs, read_trainer_state

    root, _, sweep_dir, _ = finished
    run_dir = sweep_dir / "variants" / "baseline" / "train"
    state = read_trainer_state(checkpoint_dirs(run_dir)[-1])
    assert state.step == 12
    epochs = state.epoch + 1  # the epochs it has trained in (12 updates: within its first)

    def changed(*overrides, run=run_dir, done=False):
        return _trained_otherwise(run, load_config(root / "base.yaml", list(overrides)), done)

    assert changed() == changed("train.max_steps=24") == changed("train.max_flops=1e18") == []
    assert changed(f"train.max_epochs={epochs}") == changed("train.validate_every=3", "train.keep_last=5") == []
    assert changed("train.max_steps=6") == ["train.max_steps=6, which the run has passed"]
    assert changed("train.max_flops=1000") == ["train.max_flops=1000, which the run has passed"]
    with pytest.MonkeyPatch.context() as patch:  # a long run: an integer limit is shown as one, not 1e+06
        import nmtkit.sweep.runner as runner

        patch.setattr(runner, "_last_state", lambda _: dataclasses.replace(state, step=2_000_000))
        assert changed("train.max_steps=1000000") == ["train.max_steps=1000000, which the run has passed"]
    assert sorted(changed("train.best_metric=bleu", "train.patience=1")) == [
        "train.best_metric, after the run finished", "train.patience, after the run finished"]
    assert changed("train.dev_bleu_beam=2") == []  # read only under best_metric=bleu
    assert changed("train.schedule=cosine", "train.max_steps=24") == ["train.max_steps", "train.schedule"]

    unstarted = tmp_path / "train"  # trained with these settings, but no checkpoint yet
    unstarted.mkdir()
    (unstarted / "config.yaml").write_bytes((run_dir / "config.yaml").read_bytes())
    assert changed("train.best_metric=bleu", "train.patience=1", "train.max_steps=6", run=unstarted) == []
    assert changed("train.best_metric=bleu", run=unstarted, done=True) == ["train.best_metric, after the run finished"]


def test_a_run_has_finished_as_the_trainer_decides():
    from nmtkit.sweep.runner import _finished
    from nmtkit.training.checkpoint import TrainerState

    limits = {"max_steps": 100, "max_minutes": 0, "max_flops": 0, "patience": 0, "max_epochs": 0}
    assert [_finished(TrainerState(step=step), limits) for step in (0, 99, 100)] == [False, False, True]
    assert _finished(TrainerState(step=5, bad_validations=2), {**limits, "patience": 2})
    assert not _finished(TrainerState(step=5, bad_validations=1), {**limits, "patience": 2})
    assert _finished(TrainerState(step=5, train_seconds=60.0), {**limits, "max_minutes": 1})
    assert _finished(TrainerState(step=5, train_flops=1e12), {**limits, "max_flops": 1e12})
    epochs = {**limits, "max_epochs": 2}
    assert not _finished(TrainerState(step=5, epoch=1, batch_in_epoch=3, epoch_batches=10), epochs)
    assert _finished(TrainerState(step=5, epoch=1, batch_in_epoch=10, epoch_batches=10), epochs)
    assert _finished(TrainerState(step=5, epoch=2), epochs)


def test_plot_overlays_the_variants(finished, tmp_path, monkeypatch, capsys):
    from support.cli import cli

    from nmtkit.sweep.plan import sweep_runs

    _, _, sweep_dir, _ = finished
    assert [name for name, _ in sweep_runs(sweep_dir)] == ["baseline", "fast"]
    out = tmp_path / "curves.png"
    code, err = cli(monkeypatch, capsys, "plot", str(sweep_dir), "-o", str(out))
    assert code == 0, err
    assert out.stat().st_size > 10_000


def test_only_then_killed_sweep_resumes_where_it_stopped(finished, tmp_path):
    root, _, reference_dir, _ = finished
    sweep = write_sweep(root, "killed")
    sweep_dir = root / "killed"
    only = sweep_here(sweep, "--only", "baseline")
    assert only.returncode == 0, only.stderr
    assert not (sweep_dir / "variants" / "fast").exists()
    assert [row["status"] for row in results_of(sweep_dir)["variants"]] == ["done", "pending"]

    # the whole sweep, killed (sweep and training together, SIGKILL) once `fast` has a checkpoint
    process = subprocess.Popen([sys.executable, "-m", "nmtkit", "sweep", str(sweep)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=ENV, start_new_session=True)
    checkpoints = sweep_dir / "variants" / "fast" / "train" / "checkpoints"
    deadline = time.monotonic() + 300
    while not (checkpoints.is_dir() and any(p.name.startswith("step_") for p in checkpoints.iterdir())):
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint of the second variant"
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (sweep_dir / "variants" / "fast" / "results" / "results.json").exists()

    resumed = sweep_here(sweep)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.count("finished earlier with these settings, skipped") == 1
    assert "resumed from step_" in (sweep_dir / "variants" / "fast" / "run.log").read_text()
    assert without_timing(results_of(sweep_dir)) == without_timing(results_of(reference_dir))


def test_dry_run_lists_variants_with_parameter_counts(tmp_path):
    from nmtkit.config import load_config
    from nmtkit.models.build import build_model, parameter_table

    write_task(tmp_path)
    # the baseline's dropout sets it apart from d_model=16,pre_norm=false (equal variants are warned of)
    sweep = write_sweep(tmp_path, "grid", variants=[{"name": "baseline", "overrides": {"model.dropout": 0.1}},
                                                    {"name": "vocab", "overrides": ["vocab.size=20"]}],
                        grid={"model.d_model": [16, 32], "model.pre_norm": [False, True]})
    result = sweep_here(sweep, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "grid").exists()  # nothing written
    lines = result.stderr.splitlines()
    rows = [line.split() for line in lines[lines.index(next(l for l in lines if "variant" in l and "prepare" in l
                                                                     and "settings" in l)) + 1:]]
    assert [row[0] for row in rows] == ["baseline", "vocab", "d_model=16,pre_norm=false", "d_model=16,pre_norm=true",
                                        "d_model=32,pre_norm=false", "d_model=32,pre_norm=true"]
    assert [row[1] for row in rows] == ["#1", "#2", "#1", "#1", "#1", "#1"]
    assert rows[3][5:] == ["model.d_model=16", "model.pre_norm=true"]
    for row, overrides, vocab in ((rows[1], ["vocab.size=20"], 20), (rows[4], ["model.d_model=32"], 16),
                                  (rows[3], ["model.pre_norm=true"], 16)):
        cfg = load_config(tmp_path / "base.yaml", overrides)
        total = parameter_table(build_model(cfg.model, vocab, vocab))["total"]
        assert row[2] == row[3] == f"{total:,}" and row[4] == "pending"
    assert "2 prepare(s)" in result.stderr

    only = sweep_here(sweep, "--dry-run", "--only", "vocab", "--only", "d_model=32,pre_norm=true")
    assert only.returncode == 0, only.stderr
    lines = only.stderr.splitlines()
    header = next(i for i, l in enumerate(lines) if "variant" in l and "prepare" in l and "settings" in l)
    assert [line.split()[:2] for line in lines[header + 1:]] == [["vocab", "#2"], ["d_model=32,pre_norm=true", "#1"]]


@pytest.mark.parametrize("change, fragments", [
    ({"extra": 1}, ["unknown sweep key extra"]),
    ({"variants": [{"name": "a", "overrides": {"model.pre_nrom": True}}]}, ["variant a", "model.pre_nrom"]),
    ({"variants": [{"name": "a", "overrides": {"train.lr": "fast"}}]}, ["variant a", "train.lr", "number"]),
    ({"variants": [{"name": "a", "overrides": ["train.lr"]}]}, ["variant a", "not of the form key=value"]),
    ({"variants": [{"name": "a"}, {"name": "a"}]}, ["two variants are named a"]),
    ({"variants": [{"name": "a/b"}]}, ["variant name 'a/b'"]),
    ({"variants": [{"overrides": {"train.lr": 1}}]}, ["variant 1", "needs a name"]),
    ({"variants": [{"name": "a", "overrides": {"workdir": "x"}}]}, ["workdir cannot be overridden"]),
    ({"variants": [{"name": "a", "grid": {"train.lr": []}}]}, ["grid key train.lr needs a non-empty list"]),
    ({"variants": [{"name": "a", "recipe": "nope.yaml"}]}, ["variant a", "recipe not found"]),
    ({"variants": []}, ["no variants"]),
    ({"recipe": "missing.yaml"}, ["recipe not found"]),
    ({"variants": [{"name": "a", "grid": {1: [2, 3]}}]}, ["variants[0].grid: keys must be names, got 1"]),
    ({"variants": [{"name": "a", "overrides": {"data.hf_revision": datetime.date(2024, 1, 1)}}]},
     ["overrides.data.hf_revision", "not a plain value"]),
    # a workdir or a variant's recipe of the wrong type no longer falls back to the default, or uses str(value)
    *(({"workdir": value}, [f"workdir must name a directory, got {value!r}"]) for value in (["a", "b"], True, {"a": 1},
                                                                                          "", " ", 0, False, None)),
    *(({"variants": [{"name": "a", "recipe": value}]}, [f"variant a: recipe must name a recipe file", f"got {value!r}"])
      for value in (0, False, "", [], None)),
    # a key set twice for one variant: the last value would win, silently
    ({"variants": [{"name": "x", "overrides": {"train.lr": 0.1}, "grid": {"train.lr": [0.2, 0.3]}}]},
     ["variant x: train.lr is set both by the grid and by train.lr"]),
    ({"variants": [{"name": "x", "overrides": {"train": {"lr": 0.1}}, "grid": {"train.lr": [0.2, 0.3]}}]},
     ["variant x: train.lr is set both by the grid and by train.lr"]),
    ({"variants": [{"name": "x", "overrides": ["train.lr=0.1"], "grid": {"train": [{"lr": 0.2}]}}]},
     ["variant x: train is set both by the grid and by train.lr"]),
    ({"variants": [{"name": "a", "overrides": {"model": {"pre_norm": True}, "model.pre_norm": False}}]},
     ["variant a: model.pre_norm is set twice"]),
    # the seeds set train.seed for every run: a nested mapping must not get past that
    ({"seeds": [1], "variants": [{"name": "a", "overrides": {"train": {"seed": 5}}}]}, ["variant a sets train.seed"]),
    ({"seeds": [1], "variants": [{"name": "a", "overrides": ["train={seed: 5}"]}]}, ["variant a sets train.seed"]),
    ({"seeds": [1], "overrides": {"train": {"seed": 5}}, "variants": [{"name": "a"}]}, ["sets train.seed"]),
])
def test_bad_sweep_files_are_rejected(tmp_path, change, fragments):
    from nmtkit.errors import ConfigError
    from nmtkit.sweep.spec import load_sweep

    write_task(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_sweep(write_sweep(tmp_path, "bad", **change))
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_a_nested_override_sets_the_keys_it_names(tmp_path):
    """``overrides: {model: {pre_norm: true}}`` replaced the whole model section by the defaults
    (44M parameters instead of the recipe's 5.8k): a nested mapping sets the keys it names."""
    from nmtkit.config import load_config
    from nmtkit.sweep.spec import load_sweep

    recipe = write_task(tmp_path)
    sweep = load_sweep(write_sweep(tmp_path, "nested", variants=[
        {"name": "baseline"}, {"name": "mapping", "overrides": {"model": {"pre_norm": True}, "train": {"seed": 5}}},
        {"name": "listed", "overrides": ["model={pre_norm: true, dropout: 0.1}"]}]))
    _, mapping, listed = sweep.variants
    assert mapping.overrides == ("model.pre_norm=true", "train.seed=5")  # as the table and `run` show them
    assert listed.overrides == ("model.pre_norm=true", "model.dropout=0.1")
    placed = lambda v: [f"name=nested-{v.name}", f"workdir={tmp_path / 'nested' / 'variants' / v.name}"]  # noqa: E731
    assert mapping.config == load_config(recipe, ["model.pre_norm=true", "train.seed=5", *placed(mapping)])
    assert listed.config == load_config(recipe, ["model.pre_norm=true", "model.dropout=0.1", *placed(listed)])
    assert (mapping.config.model.d_model, mapping.config.train.max_steps) == (16, 12)  # the recipe's, kept


@pytest.mark.parametrize("change, pairs", [
    # a baseline plus a grid over its own value (the recipe's train.lr is 0.003)
    ({"variants": [{"name": "base"}, {"grid": {"train.lr": [0.003, 0.01]}}]}, [("base", "lr=0.003")]),
    # YAML 1.1 reads 1e-3 as text, which train.lr reads as 0.001
    ({"grid": {"train.lr": ["1e-3", 0.001]}}, [("lr=1e-3", "lr=0.001")]),
    # each later copy is named with the first
    ({"variants": [{"name": "a"}, {"name": "b", "overrides": {"train.lr": 0.003}},
                   {"name": "c", "overrides": ["train.lr=3e-3"]}]}, [("a", "b"), ("a", "c")]),
    ({"variants": [{"name": "a"}, {"name": "b", "overrides": {"train.lr": 0.01}}]}, []),
])
def test_variants_of_the_same_settings_are_warned_of_not_refused(tmp_path, change, pairs):
    """A sweep file with a baseline inside its grid loaded before the check came: it still loads,
    every variant kept, with one warning line per copy."""
    from nmtkit.sweep.spec import load_sweep

    write_task(tmp_path)
    path = write_sweep(tmp_path, "same", **change)
    sweep = load_sweep(path)
    assert sweep.warnings == tuple(f"{path}: variants {a} and {b} have the same settings and will train the same "
                                   f"model (`seeds:` repeats a run with other seeds)" for a, b in pairs)
    assert len(sweep.variants) == len({v.name for v in sweep.variants}) >= 2


def test_same_settings_warning_is_one_line_on_stderr(tmp_path):
    write_task(tmp_path)
    path = write_sweep(tmp_path, "same", variants=[{"name": "base"}, {"grid": {"train.lr": [0.003, 0.01]}}])
    result = sweep_here(path, "--dry-run")
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warned == [f"warning: {path}: variants base and lr=0.003 have the same settings and will train the same "
                      f"model (`seeds:` repeats a run with other seeds)"], result.stderr
    assert "lr=0.01" in result.stderr  # every variant listed


def test_a_nested_override_replaces_a_dict_valued_key_whole(tmp_path):
    """``{data: {files: {train: {fr: ..}}}}`` flattened to data.files.train.fr=..., which kept
    the recipe's languages and splits beside the new ones: data.files is one value, replaced
    whole, as on the command line."""
    import yaml

    from nmtkit.sweep.spec import load_sweep

    recipe = yaml.safe_load(write_task(tmp_path).read_text())
    new = {"dev": {"fr": "d.fr", "tgt": "d.tgt"}, "test": {"fr": "t.fr", "tgt": "t.tgt"},
           "train": {"fr": "a.fr", "tgt": "a.tgt"}}  # in the order write_sweep's YAML puts them
    text = json.dumps(new)
    sweep = load_sweep(write_sweep(tmp_path, "files", variants=json.loads(json.dumps([  # no YAML aliases
        {"name": "nested", "overrides": {"data": {"src_lang": "fr", "files": new, "clean": {"max_len": 9}}}},
        {"name": "listed", "overrides": [f"data={{src_lang: fr, files: {text}}}"]},
        {"name": "dotted", "overrides": {"data.src_lang": "fr", "data.files": new}},
        {"name": "only", "overrides": {"data": {"files": {"train": {"src": "b.src", "tgt": "b.tgt"}}}}},
        {"name": "g", "grid": {"data.files.train": [{"fr": "b.fr", "tgt": "b.tgt"}]}}]))))
    nested, listed, dotted, only, grid = sweep.variants
    assert nested.overrides == ("data.clean.max_len=9", f"data.files={text}", "data.src_lang=fr")
    assert listed.overrides == ("data.src_lang=fr", f"data.files={text}")
    assert dotted.overrides == (f"data.files={text}", "data.src_lang=fr")
    assert only.overrides == ('data.files={"train": {"src": "b.src", "tgt": "b.tgt"}}',)
    for variant in (nested, listed, dotted):
        assert variant.config.data.files == new, variant.name
    assert only.config.data.files == {"train": {"src": "b.src", "tgt": "b.tgt"}}  # dev and test gone too
    assert grid.overrides == ('data.files.train={"fr": "b.fr", "tgt": "b.tgt"}',)  # a dotted key: that split
    assert grid.config.data.files == {**recipe["data"]["files"], "train": {"fr": "b.fr", "tgt": "b.tgt"}}
    assert nested.config.data.clean.max_len == 9 and nested.config.model.d_model == 16  # sections still merge


def test_a_bad_sweep_file_is_one_line_before_any_work(tmp_path):
    write_task(tmp_path)
    bad = {"name": "b", "overrides": {"model.pre_nrom": True}}
    result = sweep_cli(write_sweep(tmp_path, "bad", variants=[{"name": "a"}, bad]))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("nmtkit: error: ") and len(result.stderr.splitlines()) == 1, result.stderr
    assert "variant b" in result.stderr and "unknown config key model.pre_nrom" in result.stderr
    assert not (tmp_path / "bad").exists()


def test_shipped_sweeps_load():
    from nmtkit.sweep.spec import load_sweep

    sweeps = sorted((Path(__file__).resolve().parent.parent / "recipes" / "sweeps").glob("*.yaml"))
    assert sweeps
    for path in sweeps:
        sweep = load_sweep(path)  # every variant's config is built, so a stale key fails here
        assert len(sweep.variants) >= 2, path


def test_only_names_an_unknown_variant(tmp_path):
    write_task(tmp_path)
    result = sweep_cli(write_sweep(tmp_path, "pair"), "--only", "nope")
    assert result.returncode == 2 and "--only nope: no such variant" in result.stderr
    assert "baseline, fast" in result.stderr


def test_digests_hash_only_settings_that_differ_from_the_defaults(tmp_path):
    """A key nmtkit adds later arrives at its default: finished variants must stay finished,
    so the digests ignore settings at their defaults and change with any other value."""
    from nmtkit.config import Config, from_dict
    from nmtkit.sweep.spec import Variant, changed_settings

    recipe = tiny_recipe(tmp_path / "work")
    plain = from_dict(recipe)
    defaults = Config().to_dict()
    spelled_out = from_dict({**recipe, "train": {**recipe["train"], "label_smoothing": defaults["train"]["label_smoothing"],
                                                 "clip_norm": defaults["train"]["clip_norm"]}})
    changed = from_dict({**recipe, "train": {**recipe["train"], "clip_norm": 0.5}})
    key = lambda cfg, attr: getattr(Variant("v", None, (), cfg), attr)  # noqa: E731
    assert key(plain, "config_key") == key(spelled_out, "config_key") != key(changed, "config_key")
    assert key(plain, "data_key") == key(changed, "data_key")
    assert changed_settings(changed)["train"]["clip_norm"] == 0.5
    assert "label_smoothing" not in changed_settings(spelled_out)["train"]


def test_a_variant_whose_settings_changed_trains_afresh_and_keeps_its_old_run(tmp_path):
    """Resuming would train on from the old weights (or find the run finished) and report the
    old model under the new settings."""
    write_task(tmp_path)
    first = sweep_here(write_sweep(tmp_path, "edit", variants=[{"name": "v", "overrides": {"train.lr": 0.01}}]))
    assert first.returncode == 0, first.stderr
    variant = tmp_path / "edit" / "variants" / "v"
    old_bleu = results_of(tmp_path / "edit")["variants"][0]["test_bleu"]
    old_checkpoints = sorted(p.name for p in (variant / "train" / "checkpoints").iterdir())

    again = sweep_here(write_sweep(tmp_path, "edit", variants=[{"name": "v", "overrides": {"train.lr": 0.003}}]))
    assert again.returncode == 0, again.stderr
    assert "v: trained with other settings (train.lr); moved its old train/ to" in " ".join(again.stderr.split())
    [old_run] = variant.glob("train.old-*")
    [old_results] = variant.glob("results.old-*")
    assert sorted(p.name for p in (old_run / "checkpoints").iterdir()) == old_checkpoints
    assert json.loads((old_results / "results.json").read_text())["splits"]["test"]["bleu"]["score"] == old_bleu
    log = (variant / "run.log").read_text()
    assert "resumed from" not in log and "already finished" not in log
    assert yaml.safe_load((variant / "train" / "config.yaml").read_text())["train"]["lr"] == 0.003
    record = json.loads((variant / "sweep-run.json").read_text())
    assert (record["status"], record["sessions"]) == ("done", 1)

    # decoding settings change only the translations: the model stays, dev and test are translated again
    beam = sweep_here(write_sweep(tmp_path, "edit", variants=[{"name": "v", "overrides": {"train.lr": 0.003,
                                                                                        "decode.beam_size": 2}}]))
    assert beam.returncode == 0, beam.stderr
    assert len(list(variant.glob("train.old-*"))) == 1 and "training already finished" in (variant / "run.log").read_text()
    assert "beam 2" in (variant / "run.log").read_text()


def test_a_failed_variant_reports_the_error_of_its_own_session(tmp_path):
    from nmtkit.sweep.runner import _last_error

    log = tmp_path / "run.log"
    log.write_text("step 1\nnmtkit: error: data.files.train: missing\n")
    start = log.stat().st_size
    with open(log, "a") as handle:
        handle.write("step 1\nstep 2\nKilled\n")
    assert _last_error(log, start) == "Killed"
    assert _last_error(log) == "nmtkit: error: data.files.train: missing"


def test_variants_differing_only_in_corpus_weights_share_one_prepare(tmp_path):
    from nmtkit.config import from_dict
    from nmtkit.sweep.spec import Variant

    def corpora(weight):
        return {**tiny_recipe(tmp_path / "work"), "data": {"src_lang": "src", "tgt_lang": "tgt", "corpora": [
            {"name": "a", "source": "files", "files": {"train": {"src": "a", "tgt": "b"}}, "weight": weight},
            {"name": "b", "source": "files", "files": {"train": {"src": "c", "tgt": "d"}}, "tag": "<bt>"}]}}

    key = lambda recipe: Variant("v", None, (), from_dict(recipe)).data_key  # noqa: E731
    assert key(corpora(1.0)) == key(corpora(3.0))
    changed = corpora(1.0)
    changed["data"]["corpora"][1]["tag"] = "<2x>"
    assert key(changed) != key(corpora(1.0))
