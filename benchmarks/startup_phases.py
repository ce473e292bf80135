"""Where launch-to-first-line goes: ``echo LINE | nmtkit translate -m MODEL`` split into its
phases (up to the command, torch and the other imports, options and side files, model load, the
first search), in wall seconds and in the main thread's CPU seconds. CPU seconds are steadier
than wall time on a busy machine, so compare trees from the same minute: ``--tree`` may be given
several times (each a directory holding an ``nmtkit`` package, e.g. a ``git archive`` of another
commit), and the runs alternate between them.

    python benchmarks/startup_phases.py --model W/train/averaged --tree . --tree /tmp/base --runs 8
"""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

# (phase, the mark it starts at, the mark it ends at); marks are taken in the child
PHASES = [("to the command", "start", "command"), ("imports (torch)", "command", "options"),
          ("options, side files", "options", "load"), ("model load", "load", "loaded"),
          ("first search", "search", "searched"), ("to first line", "start", "searched")]
# (module, function) whose entry and exit are marked: entry name, exit name (None: entry only)
PROBES = [("nmtkit.runtime.threads", "start_reading", "command", None),
          ("nmtkit.translate_files", "resolve_options", "options", None),
          ("nmtkit.translate_files", "open_engine", "load", "loaded"),
          ("nmtkit.decoding.translate", "Translator.translate", "search", "searched")]


def child(argv: list[str]) -> None:
    """Run ``nmtkit ARGV`` in this process, marking each probe; the marks go to stderr as JSON."""
    t0, c0 = time.perf_counter(), time.thread_time()
    marks = {"start": (0.0, 0.0)}

    def mark(name: str) -> None:
        marks.setdefault(name, (time.perf_counter() - t0, time.thread_time() - c0))

    def wrapped(function, enter: str, leave):
        def probe(*args, **kwargs):
            mark(enter)
            result = function(*args, **kwargs)
            if leave:
                mark(leave)
            return result
        return probe

    class Patch(importlib.abc.MetaPathFinder):
        """Wraps a probed module's functions right after the module runs (no import moved)."""

        def find_spec(self, name, path, target=None):
            probes = [p for p in PROBES if p[0] == name]
            if not probes:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                for _, dotted, enter, leave in probes:
                    owner, attr = module, dotted
                    if "." in dotted:
                        owner, attr = getattr(module, dotted.split(".")[0]), dotted.split(".")[1]
                    setattr(owner, attr, wrapped(getattr(owner, attr), enter, leave))
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Patch())
    sys.argv = ["nmtkit", *argv]
    from nmtkit.cli import main
    try:
        main()
    except SystemExit as stop:
        if stop.code:
            raise
    print("PHASE-MARKS " + json.dumps(marks), file=sys.stderr)


def measure(tree: str, model: str, line: bytes) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    env.pop("OMP_NUM_THREADS", None)  # translate chooses its threads as it does for a user
    done = subprocess.run([sys.executable, __file__, "--child", "-q", "translate", "-m", model], input=line,
                          capture_output=True, env=env, cwd="/", timeout=600)
    found = re.search(r"^PHASE-MARKS (.*)$", done.stderr.decode(), re.MULTILINE)
    if done.returncode != 0 or found is None or done.stdout.count(b"\n") != 1:
        raise RuntimeError(f"translate failed in {tree}:\n{done.stderr.decode()[-2000:]}")
    marks = json.loads(found.group(1))
    return {name: [marks[b][i] - marks[a][i] for i in (0, 1)] for name, a, b in PHASES}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--tree", action="append", required=True, help="a directory holding an nmtkit package")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--line", default="Hello.", help="the line piped in")
    parser.add_argument("--json", type=Path, help="also write the medians here")
    args = parser.parse_args()
    runs = {tree: [] for tree in args.tree}
    for _ in range(args.runs):
        for tree in args.tree:  # alternating: a change in the machine's load falls on every tree alike
            runs[tree].append(measure(tree, args.model, args.line.encode() + b"\n"))
    medians = {tree: {name: [round(statistics.median(r[name][i] for r in rows), 3) for i in (0, 1)]
                      for name, *_ in PHASES} for tree, rows in runs.items()}
    print(f"| phase (median of {args.runs}, load {os.getloadavg()[0]:.1f}) | "
          + " | ".join(f"{t} wall s | {t} CPU s" for t in args.tree) + " |")
    print("|---|" + "---|---|" * len(args.tree))
    for name, *_ in PHASES:
        print(f"| {name} | " + " | ".join(f"{medians[t][name][0]:.3f} | {medians[t][name][1]:.3f}" for t in args.tree)
              + " |")
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "medians": medians}, indent=1) + "\n")


if __name__ == "__main__":
    main()
