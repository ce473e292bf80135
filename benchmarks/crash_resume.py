"""Crash-resume soak: ``tests/test_crash_resume.py`` with a longer run and many more kills.

    python benchmarks/crash_resume.py --kills 25 --steps 60 --seed 1 [--json out.json]

Trains the tiny reversal model through ``python -m nmtkit train`` once without
interruption, then again in a fresh work directory while SIGKILLing the process ``--kills``
times at seeded random moments (each kill waits for a chosen checkpoint, then up to ~2
steps), resuming every time. After each kill every ``step_N`` on disk must load; at the end
weights, EMA, optimizer moments, ``best/`` and metrics must equal the uninterrupted run's,
bit for bit. Prints (and with ``--json`` writes) a report: kills, what each kill
interrupted (judged from what it left behind), checkpoints checked and the time taken.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.resume import (assert_same_final_state, final_state, make_task, reference_run,  # noqa: E402
                            train_with_kills)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=25)
    parser.add_argument("--steps", type=int, default=60, help="updates of the run (a checkpoint after each)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nmtkit-crash-") as tmp:
        reference, crashed = Path(tmp) / "reference", Path(tmp) / "crashed"
        ref_state, step_seconds = reference_run(reference, args.steps)
        recipe = make_task(crashed, prepared_from=reference, max_steps=args.steps)
        report = train_with_kills(recipe, args.kills, args.seed, step_seconds, max_steps=args.steps)
        assert_same_final_state(ref_state, final_state(crashed / "train"), max_steps=args.steps)
    result = {"steps": args.steps, "seed": args.seed, **asdict(report), "identical": True,
              "tensors_compared": len(ref_state["tensors"]), "metric_records_compared": len(ref_state["metrics"]),
              "seconds_per_step": round(step_seconds, 3), "wall_seconds": round(time.perf_counter() - start, 1)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    if report.kills < args.kills:
        sys.exit(f"only {report.kills} of {args.kills} kills landed before the run finished; raise --steps")


if __name__ == "__main__":
    main()
