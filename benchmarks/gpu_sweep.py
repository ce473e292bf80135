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
the sweep's order, split by split, so an early stop leaves the variants nearly the same paired
runs (``--summarize`` compares them on the pairs all of them finished). A run that its finished
peers' median time says cannot end within the budget does not start; those still going at its
end (or at SIGINT / SIGTERM) get SIGTERM, save, and SIGKILL after ``--grace-s``, and resume
where their work directory is: on the same machine, or wherever it is carried. The tables are
the sweep's own (WORKDIR/results.md, copied to OUT with runs.json: each run's start and time).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import common  # puts this checkout's nmtkit first on sys.path


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
    """``nmtkit prepare`` once per data key of ``selected`` (a finished prepare is skipped by
    prepare itself); the keys."""
    from nmtkit.sweep.runner import link_prepared
    from nmtkit.sweep.spec import run_command

    keys = []
    for variant in selected:
        if variant.data_key in keys:
            continue
        keys.append(variant.data_key)
        link_prepared(sweep, variant, console)  # the prepared/ the runs will use
        arguments = run_command(sweep, variant)
        done = subprocess.run([sys.executable, "-m", "nmtkit", "prepare", *arguments[1:]], env=common.child_env(None))
        if done.returncode != 0:
            raise SystemExit(f"gpu_sweep: prepare of {variant.name}'s data failed (exit {done.returncode})")
    return keys


def missing_data(sweep, selected) -> list[str]:
    """Data keys of ``selected`` without a prepared manifest: nothing to carry for them."""
    return sorted({v.data_key for v in selected
                   if not (sweep.workdir / "prepared" / v.data_key / "manifest.json").is_file()})


class Job:
    """One run as a child process: started as `nmtkit sweep` starts one, reaped by ``poll``."""

    def __init__(self, sweep, variant, device: str, threads: int, console):
        from nmtkit.sweep.runner import begin_run, stop_with_parent
        from nmtkit.sweep.spec import run_command

        self.sweep, self.variant, self.stopping, self.killed = sweep, variant, False, False
        self.old = begin_run(sweep, variant, console)
        log = sweep.variant_dir(variant.name) / "run.log"
        self.session_start = log.stat().st_size if log.is_file() else 0
        arguments = [*run_command(sweep, variant), f"train.device={device}", f"train.threads={threads}"]
        self.started = time.time()
        with open(log, "a", encoding="utf-8") as handle:
            self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", *arguments],
                                            stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                                            env=common.child_env(threads), preexec_fn=stop_with_parent)

    def signal(self, signum: int) -> None:
        """os.kill, not Popen.send_signal: that polls, and could reap the child before ``poll``."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signum)

    def poll(self) -> bool:
        """True once the child has ended and its record is written."""
        from nmtkit.sweep.runner import finish_run

        pid, wait_status, usage = os.wait4(self.process.pid, os.WNOHANG)
        if pid == 0:
            return False
        self.process.returncode = code = os.waitstatus_to_exitcode(wait_status)
        code = 128 - code if code < 0 else code
        self.ended = time.time()
        self.status, _ = finish_run(self.sweep, self.variant, self.old, code, usage.ru_maxrss, self.session_start,
                                    stopped=self.killed)
        return True


def run_jobs(sweep, selected, args, console) -> list[dict]:
    """Up to ``args.jobs`` runs at once until the budget is spent (or SIGINT / SIGTERM: then as
    if it were); one entry per ended run. Children never outlive it."""
    from nmtkit.sweep.record import variant_status

    pending = [v for v in selected if variant_status(sweep, v) != "done"]
    console.info(f"{len(selected) - len(pending)} of {len(selected)} runs finished earlier; {len(pending)} to run")
    deadline = [time.monotonic() + args.budget_s]
    running, ended = [], []

    def stop_now(signum, frame) -> None:
        deadline[0] = min(deadline[0], time.monotonic())

    previous = {sig: signal.signal(sig, stop_now) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while pending or running:
            now = time.monotonic()
            done = sorted(entry["seconds"] for entry in ended if entry["status"] == "done")
            typical = done[len(done) // 2] if done else 0.0  # a run that cannot finish in time is not started
            if now + typical >= deadline[0]:
                pending.clear()
            while pending and len(running) < args.jobs:
                running.append(Job(sweep, pending.pop(0), args.device, args.threads, console))
            if now >= deadline[0]:
                for job in running:
                    if not job.stopping:  # the budget is spent: save and stop (resumable)
                        job.stopping = True
                        job.signal(signal.SIGTERM)
                    elif now > deadline[0] + args.grace_s and not job.killed:
                        job.killed = True
                        job.signal(signal.SIGKILL)
            for job in [job for job in running if job.poll()]:
                running.remove(job)
                ended.append({"run": job.variant.name, "status": job.status, "started": round(job.started, 1),
                              "seconds": round(job.ended - job.started, 1)})
                console.info(f"{job.variant.name}: {job.status} in {job.ended - job.started:.0f} s "
                             f"({len(ended)} ended, {len(running)} running, {len(pending)} pending)")
            time.sleep(0.5)
    finally:
        for job in running:  # an error here: stop the children, and record them, before leaving
            job.killed = True
            job.signal(signal.SIGKILL)
            while not job.poll():
                time.sleep(0.1)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return ended


def write_tables(sweep, args) -> dict:
    from nmtkit.storage.files import atomic_write_text
    from nmtkit.sweep.results import write_results
    from nmtkit.sweep.runner import _counts

    results = write_results(sweep, {v.name: _counts(v) for v in sweep.variants})
    if args.out:
        for name in ("results.md", "results.json"):
            atomic_write_text(Path(args.out) / name, (sweep.workdir / name).read_text(encoding="utf-8"))
    return results


def summarize(paths: list[str]) -> str:
    """One Markdown table from the results.json of several calls (each holds the runs it ran):
    each variant's dev and test BLEU over the (split, seed) pairs that every variant finished, so
    the means compare like with like, then over all its runs; the runs one per line."""
    from nmtkit.sweep.spread import spread, spread_cell

    runs, settings = {}, {}
    for path in paths:
        try:
            rows = json.loads(Path(path).read_text(encoding="utf-8"))["variants"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise SystemExit(f"gpu_sweep: {path} is not a sweep's results.json ({type(err).__name__}: {err})")
        for row in rows:
            if row.get("status") == "done" and "group" in row:  # runs of a sweep with seeds or splits
                runs.setdefault(row["group"], {})[(row["split"], row["seed"])] = row
                settings[row["group"]] = " ".join(f"`{item}`" for item in row["settings"]) or "(the recipe)"
    common = sorted(set.intersection(*(set(pairs) for pairs in runs.values()))) if runs else []
    if not common:
        raise SystemExit("gpu_sweep: no (split, seed) pair that every variant finished in these results")

    def cell(rows, metric: str) -> str:
        return spread_cell(spread([row[metric] for row in rows]), ".2f")

    pairs = ", ".join(f"split {split} seed {seed}" for split, seed in common)
    lines = [f"Variants by mean dev BLEU over the {len(common)} (split, seed) pairs every variant finished "
             f"({pairs}); then over all of each variant's runs.", "",
             "| variant | dev BLEU (paired) | test BLEU (paired) | runs | dev BLEU (all) | test BLEU (all) | settings |",
             "|---|---|---|---|---|---|---|"]
    order = sorted(runs, key=lambda g: -spread([runs[g][k]["dev_bleu"] for k in common])["mean"])
    for group in order:
        paired, every = [runs[group][k] for k in common], list(runs[group].values())
        lines.append(f"| {group} | {cell(paired, 'dev_bleu')} | {cell(paired, 'test_bleu')} | {len(every)} | "
                     f"{cell(every, 'dev_bleu')} | {cell(every, 'test_bleu')} | {settings[group]} |")
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
    if sys.argv[1:2] == ["--summarize"]:
        if not sys.argv[2:]:
            raise SystemExit("gpu_sweep: --summarize needs one or more results.json files")
        print(summarize(sys.argv[2:]), end="")
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", help="the sweep file (its workdir holds the prepared data)")
    parser.add_argument("--only", action="append", help="run names or variant names, as `nmtkit sweep --only`")
    parser.add_argument("--prepare", action="store_true", help="prepare every data key here and stop")
    parser.add_argument("--jobs", type=int, default=8, help="runs at once (at least 1)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each run")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=480, help="no run starts after this; then SIGTERM")
    parser.add_argument("--grace-s", type=float, default=45, help="seconds a stopped run has to save, then SIGKILL")
    parser.add_argument("--out", help="a folder for results.md, results.json and runs.json")
    args = parser.parse_args()
    if args.jobs < 1 or args.threads < 1:
        parser.error("--jobs and --threads must be at least 1")

    from nmtkit.errors import NmtkitError

    try:
        failed = sweep_on_gpu(args)
    except NmtkitError as err:
        raise SystemExit(f"gpu_sweep: {err}")
    if failed:
        raise SystemExit(f"gpu_sweep: {failed} run(s) failed; see variants/<name>/run.log")


def sweep_on_gpu(args) -> int:
    """--prepare, or the runs; the number of runs that failed."""
    from nmtkit.runtime.console import get_console
    from nmtkit.storage.files import atomic_write_text, exclusive
    from nmtkit.sweep.plan import refuse_foreign_files, write_plan
    from nmtkit.sweep.runner import _counts
    from nmtkit.sweep.spec import load_sweep

    console = get_console(0)
    sweep = load_sweep(args.sweep)
    selected = sweep.select(args.only)
    sweep.workdir.mkdir(parents=True, exist_ok=True)
    if args.prepare:
        with exclusive(sweep.workdir, "another `nmtkit sweep`"):
            refuse_foreign_files(sweep)
            keys = prepare_all(sweep, selected, console)
        console.info(f"prepared {len(keys)} data key(s) under {sweep.workdir / 'prepared'}")
        return 0
    missing = missing_data(sweep, selected)
    if missing:
        raise SystemExit(f"gpu_sweep: no prepared data for {', '.join(missing)} under {sweep.workdir / 'prepared'}; "
                         f"run with --prepare where the data is, then carry {sweep.workdir / 'prepared'}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with exclusive(sweep.workdir, "another `nmtkit sweep`"):
        refuse_foreign_files(sweep)
        write_plan(sweep, {v.name: _counts(v) for v in sweep.variants})
        ended = run_jobs(sweep, selected, args, console)
        write_tables(sweep, args)
    statuses = [entry["status"] for entry in ended]
    summary = {"sweep": args.sweep, "jobs": args.jobs, "threads": args.threads, "device": args.device,
               "wall_s": round(time.monotonic() - start, 1),
               "ended": {status: statuses.count(status) for status in sorted(set(statuses))}, "runs": ended}
    if args.out:
        atomic_write_text(Path(args.out) / "runs.json", json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    return statuses.count("failed")


if __name__ == "__main__":
    main()
