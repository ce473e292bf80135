"""Sweeps over seeds and data splits on a tiny generated task: runs per (variant, seed, split)
sharing one prepare per split, splits that differ with dev and test held out of training, a
kill mid-sweep and its resume, the spread and the paired tests recomputed by hand from the
per-run results, the spread plot; and data.split_seed on its own (files and SWORD held-out
positions)."""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import reversal_pairs
from support.sweeps import ENV, results_of, sweep_cli, sweep_here, write_sweep, write_task

VARIANTS = [{"name": "base"}, {"name": "fast", "overrides": {"train.lr": 0.01}}]
RUNS = [f"{v},seed={s},split={k}" for k in (0, 1) for s in (1, 2) for v in ("base", "fast")]


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def train_lines(prepared: Path, lang: str) -> list[str]:
    import gzip

    return gzip.decompress((prepared / f"train.{lang}.gz").read_bytes()).decode().splitlines()


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    """2 variants x seeds 1, 2 x 2 splits, killed (SIGKILL) once the third run has a checkpoint,
    then run again to the end."""
    root = tmp_path_factory.mktemp("replicas")
    write_task(root)
    sweep = write_sweep(root, "rep", variants=VARIANTS, seeds=[1, 2], splits=2,
                        overrides={"train.max_steps": 6, "train.validate_every": 3, "train.save_every": 2})
    sweep_dir = root / "rep"
    process = subprocess.Popen([sys.executable, "-m", "nmtkit", "sweep", str(sweep)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=ENV, start_new_session=True)
    checkpoints = sweep_dir / "variants" / RUNS[2] / "train" / "checkpoints"
    deadline = time.monotonic() + 400
    while not (checkpoints.is_dir() and any(p.name.startswith("step_") for p in checkpoints.iterdir())):
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint of the third run"
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    resumed = sweep_here(sweep)
    assert resumed.returncode == 0, resumed.stderr
    return root, sweep, sweep_dir, resumed


def test_every_variant_runs_once_per_seed_and_split_and_the_kill_resumed(replicated):
    _, _, sweep_dir, resumed = replicated
    results = results_of(sweep_dir)
    assert [row["name"] for row in results["variants"]] == RUNS
    assert all(row["status"] == "done" for row in results["variants"])
    assert resumed.stderr.count("finished earlier with these settings, skipped") == 2
    assert "resumed from step_" in (sweep_dir / "variants" / RUNS[2] / "run.log").read_text()
    for name in RUNS:
        config = (sweep_dir / "variants" / name / "train" / "config.yaml").read_text()
        seed, split = int(name.split("seed=")[1][0]), int(name[-1])
        assert f"seed: {seed}\n" in config and (f"split_seed: {split}\n" in config or split == 0)


def test_one_prepare_per_split_shared_by_every_variant_and_seed(replicated):
    _, _, sweep_dir, _ = replicated
    prepared = sorted(p.name for p in (sweep_dir / "prepared").iterdir())
    assert len(prepared) == 2
    targets = {name: os.readlink(sweep_dir / "variants" / name / "prepared") for name in RUNS}
    for split in (0, 1):
        assert len({targets[name] for name in RUNS if name.endswith(f"split={split}")}) == 1
    assert targets[RUNS[0]] != targets[RUNS[-1]]


def test_splits_differ_and_hold_dev_and_test_out_of_training(replicated):
    root, _, sweep_dir, _ = replicated
    split0, split1 = (sweep_dir / "variants" / RUNS[i] / "prepared" for i in (0, 4))
    assert lines(split0 / "dev.src") == lines(root / "dev.src")  # split 0 is the files' own split
    assert lines(split0 / "test.src") == lines(root / "test.src")
    assert lines(split1 / "dev.src") != lines(split0 / "dev.src")
    assert lines(split1 / "test.src") != lines(split0 / "test.src")
    for prepared in (split0, split1):
        dev, test = set(zip(lines(prepared / "dev.src"), lines(prepared / "dev.tgt"))), \
            set(zip(lines(prepared / "test.src"), lines(prepared / "test.tgt")))
        train = set(zip(train_lines(prepared, "src"), train_lines(prepared, "tgt")))
        assert (len(lines(prepared / "dev.src")), len(lines(prepared / "test.src"))) == (20, 40)
        assert not (dev & train) and not (test & train)


def test_spread_and_paired_tests_equal_a_hand_computation(replicated):
    from nmtkit.scoring.significance import paired_runs_test, sign_test

    _, _, sweep_dir, _ = replicated
    results = results_of(sweep_dir)
    per_run = {name: json.loads((sweep_dir / "variants" / name / "results" / "results.json").read_text())
               for name in RUNS}
    groups = {row["name"]: row for row in results["groups"]}
    assert list(groups) == ["base", "fast"] and results["seeds"] == [1, 2] and results["splits"] == 2
    for group in ("base", "fast"):
        names = [name for name in RUNS if name.startswith(group + ",")]
        for key, split_name, metric in (("test_bleu", "test", "bleu"), ("test_chrf", "test", "chrf"),
                                        ("dev_bleu", "dev", "bleu")):
            scores = [per_run[name]["splits"][split_name][metric]["score"] for name in names]
            assert groups[group][key] == pytest.approx({"mean": statistics.fmean(scores), "n": 4,
                                                        "std": statistics.stdev(scores), "min": min(scores),
                                                        "max": max(scores)})
        flops = [per_run[name]["train_flops"] for name in names]
        assert all(f > 0 for f in flops)
        assert groups[group]["train_pflops"]["mean"] == pytest.approx(statistics.fmean(flops) / 1e15)
    deltas = [per_run[f"fast{name[4:]}"]["splits"]["test"]["bleu"]["score"] - per_run[name]["splits"]["test"]["bleu"]["score"]
              for name in RUNS if name.startswith("base,")]
    wins, losses = sum(d > 0 for d in deltas), sum(d < 0 for d in deltas)
    assert (groups["fast"]["wins"], groups["fast"]["losses"]) == (wins, losses)
    assert groups["fast"]["sign_p"] == pytest.approx(sign_test(wins, losses), abs=1e-4)
    runs = []
    for name in RUNS:
        if name.startswith("base,"):
            base, other = sweep_dir / "variants" / name, sweep_dir / "variants" / f"fast{name[4:]}"
            runs.append((lines(other / "results" / "test.hyp"), lines(base / "results" / "test.hyp"),
                         lines(base / "prepared" / "test.tgt"), name[-1]))
    assert groups["fast"]["p_value"] == pytest.approx(paired_runs_test(runs).p_value, abs=1e-4)
    markdown = (sweep_dir / "results.md").read_text()
    fast = groups["fast"]["test_bleu"]
    assert f"| fast | 4/4 | {fast['mean']:.2f} ± {fast['std']:.2f} | {fast['min']:.2f}–{fast['max']:.2f} |" in markdown


def test_plot_draws_the_spread(replicated, tmp_path, monkeypatch, capsys):
    from support.cli import cli

    from nmtkit.sweep.plan import sweep_groups

    _, _, sweep_dir, _ = replicated
    groups = sweep_groups(sweep_dir)
    assert [(name, len(paths), len(bleus)) for name, paths, bleus in groups] == [("base", 4, 4), ("fast", 4, 4)]
    out = tmp_path / "spread.png"
    code, err = cli(monkeypatch, capsys, "plot", str(sweep_dir), "-o", str(out))
    assert code == 0, err
    assert out.stat().st_size > 10_000


def test_another_baseline_tests_every_other_variant_against_it(replicated):
    """--baseline (or the file's baseline:) picks the variant the p-values test against; the
    runs are not repeated, only the tables are rebuilt."""
    from nmtkit.scoring.significance import paired_runs_test, sign_test

    _, sweep, sweep_dir, _ = replicated
    before = results_of(sweep_dir)
    try:
        again = sweep_here(sweep, "--baseline", "fast")
        assert again.returncode == 0, again.stderr
        assert (again.stdout + again.stderr).count("finished earlier with these settings") == len(RUNS)
        results = results_of(sweep_dir)
        groups = {row["name"]: row for row in results["groups"]}
        assert results["baseline"] == "fast" and "p_value" not in groups["fast"]
        runs, deltas = [], []
        for name in RUNS:
            if name.startswith("fast,"):
                base, other = sweep_dir / "variants" / name, sweep_dir / "variants" / f"base{name[4:]}"
                runs.append((lines(other / "results" / "test.hyp"), lines(base / "results" / "test.hyp"),
                             lines(base / "prepared" / "test.tgt"), name[-1]))
                deltas.append(before_bleu(before, f"base{name[4:]}") - before_bleu(before, name))
        assert groups["base"]["p_value"] == pytest.approx(paired_runs_test(runs).p_value, abs=1e-4)
        wins, losses = sum(d > 0 for d in deltas), sum(d < 0 for d in deltas)
        assert (groups["base"]["wins"], groups["base"]["losses"]) == (wins, losses)
        assert groups["base"]["sign_p"] == pytest.approx(sign_test(wins, losses), abs=1e-4)
        runs_by_name = {row["name"]: row for row in results["variants"]}
        assert runs_by_name["fast,seed=1,split=0"].get("p_value") is None
        assert runs_by_name["base,seed=1,split=0"].get("p_value") is not None
        assert "against `fast`, the baseline" in (sweep_dir / "results.md").read_text()
    finally:
        assert sweep_here(sweep).returncode == 0  # the tables as the other tests read them
    assert results_of(sweep_dir)["groups"] == before["groups"]


def before_bleu(results: dict, name: str) -> float:
    return next(row["test_bleu"] for row in results["variants"] if row["name"] == name)


def test_a_baseline_that_is_no_variant_is_one_line(tmp_path):
    write_task(tmp_path)
    bad = sweep_cli(write_sweep(tmp_path, "plain", variants=VARIANTS), "--dry-run", "--baseline", "nope")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "--baseline: 'nope' is not a variant of this sweep (variants: base, fast)" in bad.stderr
    named = write_sweep(tmp_path, "named", variants=VARIANTS, baseline="fast,seed=1")
    bad = sweep_cli(named, "--dry-run")
    assert bad.returncode == 2 and "baseline: 'fast,seed=1' is not a variant" in bad.stderr
    good = write_sweep(tmp_path, "good", variants=VARIANTS, baseline="fast")
    assert sweep_here(good, "--dry-run").returncode == 0


def test_dry_run_and_command_line_seeds_and_splits(tmp_path):
    write_task(tmp_path)
    sweep = write_sweep(tmp_path, "plain", variants=VARIANTS)
    result = sweep_here(sweep, "--dry-run", "--seeds", "3,4,5", "--splits", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert "2 variants x 3 seed(s) x 2 split(s) = 12 runs" in out and "2 prepare(s)" in out
    assert "fast,seed=5,split=1" in out
    bad = sweep_cli(sweep, "--dry-run", "--seeds", "1,x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--seeds 1,x" in bad.stderr
    bad = sweep_cli(sweep, "--dry-run", "--splits", "0")
    assert bad.returncode == 2 and "--splits: expected a number of data splits from 1" in bad.stderr
    seeded = write_sweep(tmp_path, "seeded", variants=[{"name": "s", "overrides": {"train.seed": 7}}], seeds=[1, 2])
    bad = sweep_cli(seeded, "--dry-run")
    assert bad.returncode == 2 and "variant s sets train.seed" in bad.stderr and bad.stderr.count("\n") == 1


def test_a_files_split_redraws_dev_and_test_at_their_sizes_from_all_pairs():
    from nmtkit.data.sources.corpus import Corpus
    from nmtkit.data.sources.resplit import resplit

    train, dev, test = reversal_pairs(50, 0, 4), reversal_pairs(5, 1, 4), reversal_pairs(8, 2, 4)
    corpus = Corpus(train=iter(train), dev=dev, test=test)
    assert resplit(corpus, 0) is corpus
    one, again, two = (resplit(Corpus(train=iter(train), dev=dev, test=test), seed) for seed in (1, 1, 2))
    assert (one.dev, one.test, list(one.train)) == (again.dev, again.test, list(again.train))
    assert (len(one.dev), len(one.test), one.train_size) == (5, 8, 50)
    assert sorted(one.dev + one.test + list(one.train)) == sorted(dev + test + train)
    assert one.dev != two.dev and one.dev != dev


def test_a_sword_split_keeps_every_books_share_and_draws_other_verses():
    from nmtkit.data.sources.sword import heldout_indices

    books = [120, 40, 7, 300, 33]
    starts = [sum(books[:i]) for i in range(len(books))]

    def shares(picks):
        return [sum(start <= p < start + size for p in picks) for start, size in zip(starts, books)]

    base = heldout_indices(books, 30, 20)
    assert heldout_indices(books, 30, 20, 0) == base
    one, again, two = (heldout_indices(books, 30, 20, seed) for seed in (1, 1, 2))
    assert one == again and one != base and one != two
    assert shares(one[0] + one[1]) == shares(base[0] + base[1])
    assert (len(one[0]), len(one[1])) == (30, 20) and not set(one[0]) & set(one[1])
