"""A sweep's runs side by side on one GPU, from prepared data made here and carried there: a
lever search over splits and seeds in the minutes a GPU is lent.

    PYTHONPATH=. python benchmarks/gpu_sweep.py SWEEP.yaml --prepare           (here: every prepare)
    PYTHONPATH=. python benchmarks/gpu_sweep.py SWEEP.yaml --jobs 8 --budget-s 480 --out OUT   (GPU)
    python benchmarks/gpu_sweep.py --summarize OUT1/results.json OUT2/results.json    (one table)

The quickstart's small model leaves an H200 mostly idle (its updates wait on kernel launches), so
several `nmtkit run`s at once finish several times as many runs per minute as one. Each run is
the one `nmtkit sweep` would run (its command plus ``train.device``, its run.log and record, in
the sweep's work directory), with ``prepare`` replaced by the prepared data carried there (the
SWORD source is not on the GPU machine; train and translate verify its checksums). Runs start in
the sweep's order (split by split, so an early stop leaves every variant the same paired runs);
none starts that its finished peers' median time says cannot end within the budget, and those
still going at its end get SIGTERM, save, and resume under the next call or `nmtkit sweep`. The tables are the sweep's own
(WORKDIR/results.md, copied to OUT with a log of the runs).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def child(argv: list[str]) -> None:
    """One ``nmtkit ARGV`` (a ``run``) whose prepare step uses the carried prepared/ as it is."""
    from nmtkit import cli
    from nmtkit.data import prepare as prepare_module

    def carried(cfg, console) -> dict:
        console.info("prepare: using the carried prepared directory")
        return {}

    prepare_module.prepare = carried
    sys.argv = ["nmtkit", *argv]
    cli.main()


def prepare_all(sweep, selected, console) -> list[str]:
    """``nmtkit prepare`` once per data key of ``selected`` that lacks a finished prepare; the
    keys prepared."""
    from nmtkit.sweep.runner import _link_prepared
    from nmtkit.sweep.spec import run_command

    done, made = set(), []
    for variant in selected:
        if variant.data_key in done:
            continue
        done.add(variant.data_key)
        _link_prepared(sweep, variant, console)
        arguments = run_command(sweep, variant)
        subprocess.run([sys.executable, "-m", "nmtkit", "prepare", *arguments[1:]], check=True, cwd=os.getcwd())
        made.append(variant.data_key)
    return made


def missing_data(sweep, selected) -> list[str]:
    """Data keys of ``selected`` without a prepared manifest: nothing to carry for them."""
    return sorted({v.data_key for v in selected
                   if not (sweep.workdir / "prepared" / v.data_key / "manifest.json").is_file()})


class Job:
    def __init__(self, sweep, variant, device: str, threads: int, console):
        from nmtkit.sweep.record import RECORD, read_record
        from nmtkit.sweep.runner import _link_prepared, _set_aside_old_run, _trained_otherwise
        from nmtkit.sweep.spec import run_command
        from nmtkit.storage.files import atomic_write_text
        from nmtkit.workdir import WorkDir

        self.variant, self.directory = variant, sweep.variant_dir(variant.name)
        _link_prepared(sweep, variant, console)
        changed = _trained_otherwise(WorkDir(self.directory).run.path, variant.config)
        if changed:
            _set_aside_old_run(self.directory, console, variant.name, changed)
        old = read_record(self.directory)
        self.old = old if old.get("config") == variant.config_key else {}
        self.record_path = self.directory / RECORD
        atomic_write_text(self.record_path, json.dumps(
            {"config": variant.config_key, "status": "started", "sessions": self.old.get("sessions", 0),
             "peak_rss_mib": self.old.get("peak_rss_mib", 0)}, indent=1) + "\n")
        arguments = [*run_command(sweep, variant), f"train.device={device}", f"train.threads={threads}"]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
        self.log = open(self.directory / "run.log", "a", encoding="utf-8")
        self.start = time.monotonic()
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", *arguments],
                                        stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def poll(self) -> bool:
        """True once the run has ended (its record written)."""
        from nmtkit.storage.files import atomic_write_text
        from nmtkit.sweep.runner import STOPPED_CODES, _last_error

        pid, wait_status, usage = os.wait4(self.process.pid, os.WNOHANG)
        if pid == 0:
            return False
        self.process.returncode = code = os.waitstatus_to_exitcode(wait_status)
        code = 128 - code if code < 0 else code
        self.log.close()
        self.seconds = time.monotonic() - self.start
        self.status = "done" if code == 0 else "stopped" if code in STOPPED_CODES else "failed"
        record = {"config": self.variant.config_key, "status": self.status, "exit_code": code,
                  "sessions": self.old.get("sessions", 0) + 1,
                  "peak_rss_mib": round(max(usage.ru_maxrss / 1024, self.old.get("peak_rss_mib", 0)), 1)}
        if self.status == "failed":
            record["error"] = _last_error(self.directory / "run.log")
        atomic_write_text(self.record_path, json.dumps(record, indent=1) + "\n")
        return True


def run_jobs(sweep, selected, args, console) -> list[dict]:
    """Up to ``args.jobs`` runs at once until the budget is spent; one line per ended run."""
    from nmtkit.sweep.record import variant_status

    pending = [v for v in selected if variant_status(sweep, v) != "done"]
    console.info(f"{len(selected) - len(pending)} of {len(selected)} runs finished earlier; {len(pending)} to run")
    deadline = time.monotonic() + args.budget_s
    running, ended = [], []
    while pending or running:
        done = sorted(entry["seconds"] for entry in ended if entry["status"] == "done")
        typical = done[len(done) // 2] if done else 0.0  # a run that cannot finish in time is not started
        while pending and len(running) < args.jobs and time.monotonic() + typical < deadline:
            running.append(Job(sweep, pending.pop(0), args.device, args.threads, console))
        if time.monotonic() + typical >= deadline:
            pending.clear()
        if running and time.monotonic() >= deadline and not any(getattr(job, "stopping", False) for job in running):
            for job in running:  # the budget is spent: save and stop (resumable)
                job.stopping = True
                job.process.send_signal(signal.SIGTERM)
        for job in [job for job in running if job.poll()]:
            running.remove(job)
            ended.append({"run": job.variant.name, "status": job.status, "seconds": round(job.seconds, 1)})
            console.info(f"{job.variant.name}: {job.status} in {job.seconds:.0f} s ({len(ended)} ended, "
                         f"{len(running)} running, {len(pending)} pending)")
        if running and time.monotonic() > deadline + args.grace_s:
            for job in running:
                job.process.kill()
        time.sleep(0.5)
    return ended


def write_tables(sweep, args) -> dict:
    from nmtkit.sweep.results import write_results
    from nmtkit.sweep.runner import _counts

    results = write_results(sweep, {v.name: _counts(v) for v in sweep.variants})
    if args.out:
        for name in ("results.md", "results.json"):
            shutil.copyfile(sweep.workdir / name, Path(args.out) / name)
    return results


def summarize(paths: list[str]) -> str:
    """One Markdown table from the results.json of several calls (each holds the runs it ran):
    each variant's dev and test BLEU over the (split, seed) pairs that every variant finished, so
    the means compare like with like, then over all its runs; the runs one per line."""
    import statistics

    runs, settings = {}, {}
    for path in paths:
        for row in json.loads(Path(path).read_text(encoding="utf-8"))["variants"]:
            if row.get("status") == "done":
                runs.setdefault(row["group"], {})[(row["split"], row["seed"])] = row
                settings[row["group"]] = " ".join(f"`{item}`" for item in row["settings"]) or "(the recipe)"
    common = sorted(set.intersection(*(set(pairs) for pairs in runs.values())))

    def spread(values: list[float]) -> str:
        return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else \
            f"{values[0]:.2f}" if values else "—"

    pairs = ", ".join(f"split {split} seed {seed}" for split, seed in common)
    lines = [f"Variants by mean dev BLEU over the {len(common)} (split, seed) pairs every variant finished "
             f"({pairs}); then over all of each variant's runs.", "",
             "| variant | dev BLEU (paired) | test BLEU (paired) | runs | dev BLEU (all) | test BLEU (all) | settings |",
             "|---|---|---|---|---|---|---|"]
    order = sorted(runs, key=lambda g: -statistics.mean(runs[g][k]["dev_bleu"] for k in common))
    for group in order:
        done = runs[group]
        lines.append(f"| {group} | {spread([done[k]['dev_bleu'] for k in common])} | "
                     f"{spread([done[k]['test_bleu'] for k in common])} | {len(done)} | "
                     f"{spread([r['dev_bleu'] for r in done.values()])} | "
                     f"{spread([r['test_bleu'] for r in done.values()])} | {settings[group]} |")
    keys = sorted({k for done in runs.values() for k in done})
    lines += ["", "Dev / test BLEU of each run:", "",
              "| variant | " + " | ".join(f"split {a} seed {b}" for a, b in keys) + " |",
              "|---|" + "---|" * len(keys)]
    for group in order:
        cells = [f"{runs[group][k]['dev_bleu']:.2f} / {runs[group][k]['test_bleu']:.2f}" if k in runs[group] else "—"
                 for k in keys]
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if sys.argv[1:2] == ["--summarize"]:
        print(summarize(sys.argv[2:]), end="")
        return
    parser.add_argument("sweep", help="the sweep file (its workdir holds the prepared data)")
    parser.add_argument("--only", action="append", help="run names or variant names, as `nmtkit sweep --only`")
    parser.add_argument("--prepare", action="store_true", help="prepare every data key here and stop")
    parser.add_argument("--jobs", type=int, default=8, help="runs at once")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each run")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=480, help="no run starts after this; then SIGTERM")
    parser.add_argument("--grace-s", type=float, default=45, help="seconds a stopped run has to save")
    parser.add_argument("--out", help="a folder for results.md, results.json and runs.json")
    args = parser.parse_args()

    from nmtkit.runtime.console import get_console
    from nmtkit.storage.files import exclusive
    from nmtkit.sweep.plan import write_plan
    from nmtkit.sweep.runner import _counts
    from nmtkit.sweep.spec import load_sweep

    console = get_console(0)
    sweep = load_sweep(args.sweep)
    selected = sweep.select(args.only)
    if args.prepare:
        sweep.workdir.mkdir(parents=True, exist_ok=True)
        with exclusive(sweep.workdir, "another `nmtkit sweep`"):
            made = prepare_all(sweep, selected, console)
        console.info(f"prepared {len(made)} data key(s) under {sweep.workdir / 'prepared'}")
        return
    missing = missing_data(sweep, selected)
    if missing:
        sys.exit(f"gpu_sweep: no prepared data for {', '.join(missing)} under {sweep.workdir / 'prepared'}; "
                 f"run with --prepare where the data is, then carry {sweep.workdir / 'prepared'}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    sweep.workdir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with exclusive(sweep.workdir, "another `nmtkit sweep`"):
        write_plan(sweep, {v.name: _counts(v) for v in sweep.variants})
        ended = run_jobs(sweep, selected, args, console)
        write_tables(sweep, args)
    summary = {"sweep": args.sweep, "jobs": args.jobs, "threads": args.threads, "device": args.device,
               "wall_s": round(time.monotonic() - start, 1), "runs": ended}
    if args.out:
        (Path(args.out) / "runs.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))


if __name__ == "__main__":
    main()
