"""Where a training update goes on this machine: the trainer of ``nmtkit train`` built in this
process from a work directory's recipe, a few updates run under ``torch.profiler``, and two
tables: the operators by their own time, and each matrix product's shape with its GFLOP/s (the
MFU of ``train_speed.py`` counts these products' FLOPs against a square-matmul peak).

    python benchmarks/train_profile.py --work W --dtype bf16 --steps 10 --threads 2 --out OUT

W is a work directory made by ``nmtkit run``/``prepare`` (its config.yaml and prepared/; ``--recipe``
names another recipe); the trainer writes nothing there: its run directory is a scratch one.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


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
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nmtkit.config.loading import load_config
    from nmtkit.runtime.device import resolve_dtype
    from nmtkit.training import trainer as training

    work = Path(args.work).resolve()
    scratch = Path(tempfile.mkdtemp(prefix="nmtkit-train-profile-"))
    (scratch / "prepared").symlink_to(work / "prepared")
    cfg = load_config(args.recipe or work / "config.yaml", [f"workdir={scratch}", f"train.dtype={args.dtype}",
                                             f"train.threads={args.threads}"])
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    dtype = resolve_dtype(cfg.train.dtype, device, cpu_fp16=True)
    src_path, tgt_path, src_vocab, tgt_vocab = training.prepared_vocabs(cfg)
    torch.manual_seed(cfg.train.seed)
    model = training.build_model(cfg.model, len(src_vocab), len(tgt_vocab))

    class Quiet:
        def info(self, *_, **__):
            pass

        warn = info

    trainer = training.Trainer(cfg, Quiet(), model, device, dtype, src_path, tgt_path, src_vocab, tgt_vocab,
                               scratch / "train")
    updates = trainer._updates()
    for _ in range(args.warmup):
        _, _, _, data, group = next(updates)
        trainer._step(data, group)
    groups = [next(updates) for _ in range(args.steps)]
    tokens = 0
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _, _, _, data, group in groups:
            tokens += trainer._step(data, group)[2]
    seconds = time.perf_counter() - start
    ops = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ops)
    op_rows = sorted(({"op": e.key, "self_ms": round(e.self_cpu_time_total / 1e3, 1), "calls": e.count,
                       "share_pct": round(100 * e.self_cpu_time_total / total, 2)} for e in ops),
                     key=lambda r: -r["self_ms"])[:args.rows]
    products = []
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key not in ("aten::mm", "aten::addmm", "aten::bmm") or not e.self_cpu_time_total:
            continue
        a, b = (e.input_shapes[1], e.input_shapes[2]) if e.key == "aten::addmm" else e.input_shapes[:2]
        flops = 2 * a[0] * a[1] * a[2] * b[2] if e.key == "aten::bmm" else 2 * a[0] * a[1] * b[1]
        products.append({"op": e.key, "a": a, "b": b, "calls": e.count, "self_ms": round(e.self_cpu_time_total / 1e3, 1),
                         "gflops": round(flops * e.count / (e.self_cpu_time_total * 1e-6) / 1e9, 1)})
    products.sort(key=lambda r: -r["self_ms"])
    record = {"benchmark": "train_profile", "work": str(work), "dtype": args.dtype, "threads": args.threads,
              "steps": args.steps, "tgt_tok_s_under_profiler": round(tokens / seconds, 1),
              "load_before": [round(x, 2) for x in os.getloadavg()], "ops": op_rows,
              "products": products[:args.rows], "products_share_pct": round(
                  100 * sum(r["self_ms"] for r in products) * 1e3 / total, 1)}
    lines = [f"## Where a training update goes ({args.dtype}, {args.threads} threads, {args.steps} updates)", "",
             f"{record['tgt_tok_s_under_profiler']} target tokens/s under the profiler; matrix products "
             f"{record['products_share_pct']}% of the operators' own time; load before {record['load_before']}.", "",
             "| op | own ms | calls | share % |", "|---|---|---|---|"]
    lines += [f"| {r['op']} | {r['self_ms']} | {r['calls']} | {r['share_pct']} |" for r in op_rows]
    lines += ["", "| product | a | b | calls | own ms | GFLOP/s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['op']} | {r['a']} | {r['b']} | {r['calls']} | {r['self_ms']} | {r['gflops']} |"
              for r in products[:args.rows]]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_profile.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
        (out / "train_profile.md").write_text(text, encoding="utf-8")
    return record


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
