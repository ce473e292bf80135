"""Training and decoding throughput on an idle machine and beside CPU-bound processes, per
thread setting.

The target, for both: with one competing CPU-bound process, at least 50% of the idle
throughput, while idle throughput stays within 3% of PyTorch's default threads. Each setting
runs first on the machine as it is ("idle"), then with ``--competitors`` processes spinning
``while True: pass`` started just before ("busy"); ``--work`` picks what runs:
  train   train_speed's measurement: ``nmtkit train`` for ``--steps`` updates in a fresh
          process, target tokens/s, the median of the windows after the warm-up ones
  decode  decode_speed's measurement: the torch engine in a fresh process translates the first
          ``--max-sentences`` lines of the test split at ``--beam`` in ``--dtype``, sentences/s
          after loading and a warm-up; the thread setting applied as ``translate --threads``

Settings (``--settings``, comma-separated):
  auto          train.threads=0 / --threads 0: nmtkit's choice (free cores measured at start)
  all           <cores of this process> threads: what PyTorch uses by default on an idle machine
  one           1 thread
  NAME+passive  the same with OMP_WAIT_POLICY=passive in the environment (idle threads sleep)

No OMP_NUM_THREADS is set for the children (it would override the auto setting).

    python benchmarks/busy_machine.py --model WORKDIR/train/best --data WORKDIR/prepared
    python benchmarks/busy_machine.py --work decode --model WORKDIR/train/best --data WORKDIR/prepared
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import common
import decode_speed
import train_speed

SPIN = "while True: pass"
WORKS = {"train": "tgt_tok_s", "decode": "sent_s"}  # what runs -> the throughput compared


def thread_setting(name: str) -> tuple[dict, dict]:
    """(train overrides, environment additions) of a setting name."""
    base, _, policy = name.partition("+")
    threads = {"auto": 0, "all": len(os.sched_getaffinity(0)), "one": 1}.get(base)
    if threads is None or policy not in ("", "passive"):
        raise SystemExit(f"unknown setting {name!r} (auto, all, one, each optionally +passive)")
    return {"threads": threads}, ({"OMP_WAIT_POLICY": "PASSIVE"} if policy else {})


def decode_record(args, threads: int, scratch: Path) -> dict:
    """decode_speed's measurement of the torch engine on ``threads`` (0: auto) in a fresh process."""
    saved = args.threads
    args.threads = threads  # decode_speed's child applies it with configure_threads, as translate --threads
    try:
        record = decode_speed.run_config(args, "torch", args.dtype, args.beam, None, scratch, None, args.src_path)
    finally:
        args.threads = saved
    record.pop("output")
    return record


def measure(args, work: str, setting: str, busy: bool, recipe: Path, meta: dict, scratch: Path) -> dict:
    overrides, env = thread_setting(setting)
    saved = {key: os.environ.get(key) for key in (*env, "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.pop(key, None)
    os.environ.update(env)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.competitors if busy else 0)]
    try:
        if work == "train":
            record = train_speed.run_dtype(args, args.dtype, recipe, meta, overrides)
        else:
            record = decode_record(args, overrides["threads"], scratch)
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    record.update(work=work, setting=setting, throughput=record[WORKS[work]],
                  machine_state=f"{args.competitors} competing" if busy else "idle")
    return record


def add_ratios(records: list[dict], baseline: str) -> None:
    """busy / idle per work and setting, and idle / the baseline setting's idle of the same work."""
    idle = {(r["work"], r["setting"]): r["throughput"] for r in records if r["machine_state"] == "idle"}
    for record in records:
        own, base = idle.get((record["work"], record["setting"])), idle.get((record["work"], baseline))
        if record["machine_state"] != "idle" and own:
            record["busy_over_idle"] = round(record["throughput"] / own, 3)
            if base:
                record["busy_over_baseline_idle"] = round(record["throughput"] / base, 3)
        elif record["machine_state"] == "idle" and base:
            record["idle_over_baseline"] = round(record["throughput"] / base, 3)


def parse_args(argv):
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--work", default="train,decode", help="comma-separated: train, decode (see above)")
    parser.add_argument("--dtype", default="float32", help="float32 or bf16")
    parser.add_argument("--settings", default="all,auto,one,all+passive,auto+passive",
                        help="comma-separated thread settings (see above); the first is the baseline")
    parser.add_argument("--competitors", type=int, default=1, help="CPU-bound processes in the busy runs")
    train_speed.add_training_options(parser, steps=60)
    parser.add_argument("--beam", type=int, default=4, help="decode: beam size")
    parser.add_argument("--split", default="test", help="decode: the prepared split translated")
    parser.add_argument("--max-sentences", type=int, default=200, help="decode: lines translated per run (0: all)")
    parser.add_argument("--warmup", type=int, default=10, help="decode: lines translated before timing")
    parser.add_argument("--batch-tokens", type=int, default=0,
                        help="decode: source tokens x beam per batch (0: as decode_speed.py chooses)")
    args = parser.parse_args(argv)
    args.works = [w for w in args.work.split(",") if w]
    unknown = [w for w in args.works if w not in WORKS]
    if unknown or not args.works:
        raise SystemExit(f"--work takes train and/or decode, not {args.work!r}")
    args.settings = [s for s in args.settings.split(",") if s]
    for setting in args.settings:
        thread_setting(setting)  # every name checked before anything runs
    args.threads = 0  # no OMP_NUM_THREADS for the children: the thread setting decides
    args.keep_outputs = False
    args.batch_tokens = args.batch_tokens or decode_speed.run_batch_tokens(Path(args.data))
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    meta = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    args.src_path = Path(args.data) / f"{args.split}.{meta['src_lang']}"
    recipe = Path(args.recipe) if args.recipe else train_speed.default_recipe(Path(args.data))
    settings = args.settings
    records = []
    scratch = Path(tempfile.mkdtemp(prefix="nmtkit-bench-busy-"))
    try:
        for work in args.works:
            for setting in settings:
                for busy in (False, True):
                    records.append(measure(args, work, setting, busy, recipe, meta, scratch))
                    print(json.dumps({k: v for k, v in records[-1].items() if k != "windows_tok_s"}), file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    add_ratios(records, settings[0])
    common.write_results(Path(args.out), "busy_machine", records, [
        ("work", "work"), ("setting", "setting"), ("machine_state", "machine"),
        ("throughput", "throughput (train: tgt tok/s median; decode: sent/s)"),
        ("tgt_tok_s_min", "train min"), ("tgt_tok_s_max", "train max"), ("threads_used", "decode threads"),
        ("busy_over_idle", "busy / idle"), ("busy_over_baseline_idle", f"busy / {settings[0]} idle"),
        ("idle_over_baseline", f"idle / {settings[0]} idle"), ("load_before", "load before")],
        "Training and decoding on a busy machine",
        [f"Model {args.model}; data {args.data}; {args.dtype}; competing: {args.competitors} x `{SPIN}`.",
         f"train: {args.steps} updates per run, windows of {args.log_every}, the first {args.warmup_windows} left out.",
         f"decode: torch engine, beam {args.beam}, the first {args.max_sentences or 'all'} lines of {args.split} "
         f"after {args.warmup} warm-up lines, {args.batch_tokens} batch tokens."])
    return records


if __name__ == "__main__":
    main()
