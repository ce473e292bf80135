"""benchmarks/gpu_sweep.py on the CPU, on a tiny generated task: it prepares every data key
where the data is, refuses to run without them, runs a sweep's runs two at a time from the
prepared data alone with the results and records `nmtkit sweep` gets running them one by one
(which then finds them all finished), stops its runs when it is told to stop so that
`nmtkit sweep` resumes them from their checkpoints, and merges several calls' results into
one table; bad input gets one line."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.sweeps import ENV, results_of, sweep_here, without_timing, write_sweep, write_task

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_sweep.py"
VARIANTS = [{"name": "base"}, {"name": "fast", "overrides": {"train.lr": 0.01}}]
RUNS = ["base,seed=1,split=0", "fast,seed=1,split=0"]
STEPS = {"train.max_steps": 6, "train.validate_every": 3, "train.save_every": 2}
SOURCES = [f"{split}.{lang}" for split in ("train", "dev", "test") for lang in ("src", "tgt")]


def gpu_sweep(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=600)


def record(sweep_dir: Path, run: str) -> dict:
    return json.loads((sweep_dir / "variants" / run / "sweep-run.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The same sweep (2 variants x seed 1 x 1 split) by `nmtkit sweep`, and by gpu_sweep.py (2 at
    once, after its --prepare, with the source text moved away); the refusal before the prepare."""
    root = tmp_path_factory.mktemp("gpu_sweep")
    write_task(root)
    serial = write_sweep(root, "serial", variants=VARIANTS, seeds=[1], splits=1, overrides=STEPS)
    assert sweep_here(serial).returncode == 0
    parallel = write_sweep(root, "parallel", variants=VARIANTS, seeds=[1], splits=1, overrides=STEPS)
    refused = gpu_sweep(parallel, "--device", "cpu")
    prepared = gpu_sweep(parallel, "--prepare")
    assert prepared.returncode == 0, prepared.stderr
    for name in SOURCES:  # as on the GPU machine: the prepared data only
        (root / name).rename(root / f"away-{name}")
    out = root / "out"
    try:
        ran = gpu_sweep(parallel, "--device", "cpu", "--jobs", "2", "--threads", "1", "--out", out)
    finally:
        for name in SOURCES:
            (root / f"away-{name}").rename(root / name)
    assert ran.returncode == 0, ran.stderr
    return root, parallel, refused, ran, out


def test_without_prepared_data_it_refuses_in_one_line(swept):
    refused = swept[2]
    assert refused.returncode != 0
    assert refused.stderr.strip().count("\n") == 0 and "no prepared data for" in refused.stderr
    assert "--prepare" in refused.stderr and "Traceback" not in refused.stderr


def test_prepare_makes_the_prepared_directory_the_runs_share(swept):
    root = swept[0]
    prepared = sorted((root / "parallel" / "prepared").iterdir())
    assert len(prepared) == 1 and (prepared[0] / "manifest.json").is_file()


def test_runs_side_by_side_give_the_sequential_sweeps_results(swept):
    root, parallel, _, ran, out = swept
    ours, theirs = results_of(root / "parallel"), results_of(root / "serial")
    assert [row["name"] for row in ours["variants"]] == RUNS
    assert all(row["status"] == "done" for row in ours["variants"])
    assert without_timing(ours) == without_timing(theirs)
    assert json.loads((out / "results.json").read_text()) == ours
    for run in RUNS:
        mine, serial = record(root / "parallel", run), record(root / "serial", run)
        assert {k: mine[k] for k in ("status", "exit_code", "sessions")} == \
               {k: serial[k] for k in ("status", "exit_code", "sessions")}
        assert mine["peak_rss_mib"] > 50
        assert "using the carried prepared directory" in (root / "parallel" / "variants" / run / "run.log").read_text()
    summary = json.loads((out / "runs.json").read_text())
    assert sorted(r["run"] for r in summary["runs"]) == sorted(RUNS) and summary["ended"] == {"done": 2}
    first, second = sorted(summary["runs"], key=lambda r: r["started"])
    assert second["started"] < first["started"] + first["seconds"]  # they ran at the same time
    again = sweep_here(parallel)
    assert again.returncode == 0 and again.stderr.count("finished earlier with these settings, skipped") == 2


def test_a_run_it_stops_resumes_under_nmtkit_sweep(swept):
    """The stop reaches the run within about half a second (gpu_sweep.py's poll), long before its
    1,000 steps end even on a fast CPU; validating only at the end keeps the resumed rest short."""
    root = swept[0]
    long = write_sweep(root, "long", variants=VARIANTS[:1], seeds=[1], splits=1,
                       overrides={**STEPS, "train.max_steps": 1000, "train.save_every": 10,
                                  "train.validate_every": 1000})
    assert gpu_sweep(long, "--prepare").returncode == 0
    process = subprocess.Popen([sys.executable, str(SCRIPT), str(long), "--device", "cpu", "--threads", "1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    run_dir = root / "long" / "variants" / "base,seed=1,split=0"
    deadline = time.monotonic() + 300
    while not any((run_dir / "train" / "checkpoints").glob("step_*")):
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)  # as at the end of its budget
    assert process.wait(timeout=120) == 0, process.stderr.read()
    stopped = record(root / "long", "base,seed=1,split=0")
    assert stopped["status"] == "stopped" and stopped["exit_code"] == 143 and stopped["sessions"] == 1
    resumed = sweep_here(long)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from step_" in (run_dir / "run.log").read_text()
    assert record(root / "long", "base,seed=1,split=0")["sessions"] == 2
    assert results_of(root / "long")["variants"][0]["status"] == "done"


def row(group: str, split: int, seed: int, dev: float, test: float) -> dict:
    return {"name": f"{group},seed={seed},split={split}", "group": group, "split": split, "seed": seed,
            "status": "done", "dev_bleu": dev, "test_bleu": test, "settings": [] if group == "a" else ["train.lr=0.01"]}


def test_summarize_compares_variants_on_the_pairs_all_of_them_finished(tmp_path):
    first = [row("a", 0, 1, 20.0, 19.0), row("b", 0, 1, 22.0, 21.0), row("a", 1, 1, 24.0, 23.0),
             row("b", 1, 1, 21.0, 20.0), {**row("b", 0, 2, 30.0, 30.0), "status": "failed"}]
    second = [row("a", 0, 2, 10.0, 9.0)]  # only a has split 0 seed 2: in a's "all" columns alone
    paths = []
    for name, rows in (("a.json", first), ("b.json", second)):
        (tmp_path / name).write_text(json.dumps({"variants": rows}), encoding="utf-8")
        paths.append(tmp_path / name)
    table = subprocess.run([sys.executable, str(SCRIPT), "--summarize", *map(str, paths)], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert "over the 2 (split, seed) pairs every variant finished (split 0 seed 1, split 1 seed 1)" in table[0]
    # a: paired dev 20, 24 (mean 22, sd 2.83); all dev 20, 24, 10 (mean 18, sd 7.21). b: 22, 21
    assert table[4] == "| a | 22.00 ± 2.83 | 21.00 ± 2.83 | 3 | 18.00 ± 7.21 | 17.00 ± 7.21 | (the recipe) |"
    assert table[5] == "| b | 21.50 ± 0.71 | 20.50 ± 0.71 | 2 | 21.50 ± 0.71 | 20.50 ± 0.71 | `train.lr=0.01` |"
    assert table[-2:] == ["| a | 20.00 / 19.00 | 10.00 / 9.00 | 24.00 / 23.00 |",
                          "| b | 22.00 / 21.00 | — | 21.00 / 20.00 |"]


@pytest.mark.parametrize("args, message", [
    (["--summarize"], "needs one or more results.json"),
    (["--summarize", "/nonexistent/results.json"], "is not a sweep's results.json"),
    (["SWEEP", "--jobs", "0"], "--jobs and --threads must be at least 1"),
    (["/nonexistent/sweep.yaml"], "gpu_sweep: "),
])
def test_bad_input_gets_one_line_and_a_failing_exit(tmp_path, args, message):
    (tmp_path / "SWEEP").write_text("recipe: x.yaml\nvariants: [{name: a}]\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr
