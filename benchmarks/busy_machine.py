"""Training throughput on an idle machine and beside CPU-bound processes, per thread setting.

Issue 20's target: with one competing CPU-bound process, at least 50% of the idle tokens/s,
while idle throughput stays within 3% of PyTorch's default threads. Each setting trains with
train_speed's measurement (``nmtkit train`` for ``--steps`` updates in a fresh process,
median of the windows after the warm-up ones), first on the machine as it is ("idle"), then
with ``--competitors`` processes spinning ``while True: pass`` started just before ("busy").

Settings (``--settings``, comma-separated):
  auto          train.threads=0: nmtkit's choice (free cores measured at start)
  all           train.threads=<cores of this process>: what PyTorch uses by default on an idle machine
  one           train.threads=1
  NAME+passive  the same with OMP_WAIT_POLICY=passive in the environment (idle threads sleep)

No OMP_NUM_THREADS is set for the children (it would override train.threads=0).

    python benchmarks/busy_machine.py --model WORKDIR/train/best --data WORKDIR/prepared
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import common
import train_speed

SPIN = "while True: pass"


def thread_setting(name: str) -> tuple[dict, dict]:
    """(train overrides, environment additions) of a setting name."""
    base, _, policy = name.partition("+")
    threads = {"auto": 0, "all": len(os.sched_getaffinity(0)), "one": 1}.get(base)
    if threads is None or policy not in ("", "passive"):
        raise SystemExit(f"unknown setting {name!r} (auto, all, one, each optionally +passive)")
    return {"threads": threads}, ({"OMP_WAIT_POLICY": "PASSIVE"} if policy else {})


def measure(args, setting: str, busy: bool, recipe: Path, meta: dict) -> dict:
    overrides, env = thread_setting(setting)
    saved = {key: os.environ.get(key) for key in (*env, "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.pop(key, None)
    os.environ.update(env)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.competitors if busy else 0)]
    try:
        record = train_speed.run_dtype(args, args.dtype, recipe, meta, overrides)
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    record.update(setting=setting, machine_state=f"{args.competitors} competing" if busy else "idle")
    return record


def add_ratios(records: list[dict], baseline: str) -> None:
    """busy / idle per setting, and idle / the baseline setting's idle."""
    idle = {r["setting"]: r["tgt_tok_s"] for r in records if r["machine_state"] == "idle"}
    for record in records:
        if record["machine_state"] != "idle" and record["setting"] in idle:
            record["busy_over_idle"] = round(record["tgt_tok_s"] / idle[record["setting"]], 3)
            if baseline in idle:
                record["busy_over_baseline_idle"] = round(record["tgt_tok_s"] / idle[baseline], 3)
        elif record["machine_state"] == "idle" and baseline in idle:
            record["idle_over_baseline"] = round(record["tgt_tok_s"] / idle[baseline], 3)


def main(argv=None) -> list[dict]:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", help="float32 or bf16")
    parser.add_argument("--settings", default="all,auto,one,all+passive,auto+passive",
                        help="comma-separated thread settings (see above); the first is the baseline")
    parser.add_argument("--competitors", type=int, default=1, help="CPU-bound processes in the busy runs")
    train_speed.add_training_options(parser, steps=60)
    args = parser.parse_args(argv)
    args.threads = 0  # no OMP_NUM_THREADS for the children: train.threads decides
    meta = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    recipe = Path(args.recipe) if args.recipe else train_speed.default_recipe(Path(args.data))
    settings = [s for s in args.settings.split(",") if s]
    for setting in settings:
        thread_setting(setting)  # every name checked before anything runs
    records = []
    for setting in settings:
        for busy in (False, True):
            records.append(measure(args, setting, busy, recipe, meta))
            print(json.dumps({k: v for k, v in records[-1].items() if k != "windows_tok_s"}), file=sys.stderr)
    add_ratios(records, settings[0])
    common.write_results(Path(args.out), "busy_machine", records, [
        ("setting", "setting"), ("machine_state", "machine"), ("tgt_tok_s", "train tgt tok/s (median)"),
        ("tgt_tok_s_min", "min"), ("tgt_tok_s_max", "max"), ("busy_over_idle", "busy / idle"),
        ("busy_over_baseline_idle", f"busy / {settings[0]} idle"), ("idle_over_baseline", f"idle / {settings[0]} idle"),
        ("load_before", "load before")],
        "Training on a busy machine",
        [f"Model {args.model}; data {args.data}; {args.dtype}; {args.steps} updates per run, windows of "
         f"{args.log_every}, the first {args.warmup_windows} left out; competing: {args.competitors} x `{SPIN}`."])
    return records


if __name__ == "__main__":
    main()
