"""Where a training update goes on this machine: the trainer of ``nmtkit train`` built in this
process from a work directory's recipe, a few updates run under ``torch.profiler``, and two
tables: the operators by their own time, and each matrix product's shape with its GFLOP/s (the
MFU of ``train_speed.py`` counts these products' FLOPs against a square-matmul peak).

    python benchmarks/train_profile.py --work W --dtype bf16 --steps 10 --threads 2 --out OUT

W is a work directory made by ``nmtkit run``/``prepare`` (its config.yaml and prepared/; ``--recipe``
names another recipe); the trainer writes nothing there: its run directory is a scratch one,
removed at the end.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import common

PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm")


def product_flops(op: str, shapes: list) -> tuple[list, list, int]:
    """(a's shape, b's shape, FLOPs) of one call of a matrix product from the profiler's input
    shapes: mm(a, b), addmm(bias, a, b), bmm(a, b) with a batch dimension first."""
    a, b = (shapes[1], shapes[2]) if op == "aten::addmm" else (shapes[0], shapes[1])
    if op == "aten::bmm":
        return a, b, 2 * a[0] * a[1] * a[2] * b[2]
    return a, b, 2 * a[0] * a[1] * b[1]


def product_rows(prof) -> tuple[list[dict], float]:
    """Each product shape's calls, own time and GFLOP/s, slowest in total first; and the
    products' share (%) of all operators' own time."""
    rows, own = [], 0.0
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key not in PRODUCTS or not e.self_cpu_time_total:
            continue
        a, b, flops = product_flops(e.key, e.input_shapes)
        own += e.self_cpu_time_total
        rows.append({"op": e.key, "a": a, "b": b, "calls": e.count, "self_ms": round(e.self_cpu_time_total / 1e3, 1),
                     "gflops": round(flops * e.count / (e.self_cpu_time_total * 1e-6) / 1e9, 1)})
    total = sum(e.self_cpu_time_total for e in prof.key_averages()) or 1.0
    return sorted(rows, key=lambda r: -r["self_ms"]), round(100 * own / total, 1)


def profile_updates(work: Path, recipe: Path, dtype_name: str, threads: int, warmup: int, steps: int,
                    scratch: Path):
    """(profiler, target tokens/s) of ``steps`` updates after ``warmup``, the run in ``scratch``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nmtkit.config.loading import load_config
    from nmtkit.runtime.console import get_console
    from nmtkit.runtime.device import resolve_dtype
    from nmtkit.training import trainer as training

    (scratch / "prepared").symlink_to(work / "prepared")
    cfg = load_config(recipe, [f"workdir={scratch}", f"train.dtype={dtype_name}", f"train.threads={threads}"])
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    dtype = resolve_dtype(cfg.train.dtype, device, cpu_fp16=True)
    src_path, tgt_path, src_vocab, tgt_vocab = training.prepared_vocabs(cfg)
    torch.manual_seed(cfg.train.seed)
    model = training.build_model(cfg.model, len(src_vocab), len(tgt_vocab))

    trainer = training.Trainer(cfg, get_console(-1), model, device, dtype, src_path, tgt_path, src_vocab, tgt_vocab,
                               scratch / "train")
    updates = trainer._updates()
    for _ in range(warmup):
        _, _, _, data, group = next(updates)
        trainer._step(data, group)
    groups = [next(updates) for _ in range(steps)]
    tokens, start = 0, time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _, _, _, data, group in groups:
            tokens += trainer._step(data, group)[2]
    return prof, tokens / (time.perf_counter() - start)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="work directory with prepared/ (and config.yaml)")
    parser.add_argument("--recipe", help="the recipe to train by (default: WORK/config.yaml)")
    parser.add_argument("--dtype", default="bf16", help="float32 or bf16")
    parser.add_argument("--steps", type=int, default=10, help="updates profiled (after --warmup)")
    parser.add_argument("--warmup", type=int, default=5, help="updates run before profiling")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=40, help="rows of each table")
    parser.add_argument("--out", help="folder for train_profile.json and train_profile.md")
    args = parser.parse_args(argv)

    from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory

    keep_freed_memory()  # as the CLI does, before torch loads
    bound_kernel_caches()
    work = Path(args.work).resolve()
    scratch = Path(tempfile.mkdtemp(prefix="nmtkit-train-profile-"))
    try:
        prof, rate = profile_updates(work, Path(args.recipe or work / "config.yaml"), args.dtype, args.threads,
                                     args.warmup, args.steps, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ops = common.operator_rows(prof, args.rows)
    products, share = product_rows(prof)
    record = {"benchmark": "train_profile", "work": str(work), "dtype": args.dtype, "threads": args.threads,
              "steps": args.steps, "tgt_tok_s_under_profiler": round(rate, 1),
              "load_before": [round(x, 2) for x in os.getloadavg()], "ops": ops,
              "products": products[:args.rows], "products_share_pct": share}
    lines = [f"## Where a training update goes ({args.dtype}, {args.threads} threads, {args.steps} updates)", "",
             f"{record['tgt_tok_s_under_profiler']} target tokens/s under the profiler; matrix products "
             f"{share}% of the operators' own time; load before {record['load_before']}.", "",
             "| op | own ms | calls | share % |", "|---|---|---|---|",
             *[f"| {r['op']} | {r['self_ms']} | {r['calls']} | {r['share_pct']} |" for r in ops],
             "", "| product | a | b | calls | own ms | GFLOP/s |", "|---|---|---|---|---|---|",
             *[f"| {r['op']} | {r['a']} | {r['b']} | {r['calls']} | {r['self_ms']} | {r['gflops']} |"
               for r in products[:args.rows]]]
    common.write_profile(Path(args.out) if args.out else None, "train_profile", record, lines)
    return record


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
