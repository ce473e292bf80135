"""Where a search's time goes: the torch engine's ``Translator``, built as ``nmtkit translate``
builds it, translating the first lines of a file under ``torch.profiler``; the operators by
their own time. One batch at a time by default (``--workers 1``), so the table is one thread's
work and its shares add up to that thread's time.

    python benchmarks/decode_profile.py --model W/train/averaged --source W/prepared/test.en \
        --lines 300 --beam 4 --threads 1 --out OUT
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import common


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="nmtkit model directory")
    parser.add_argument("--source", required=True, help="text file, one sentence a line")
    parser.add_argument("--lines", type=int, default=300, help="first N lines, translated once untimed first")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--dtype", default="auto", help="auto, float32, bf16 or int8 (translate's --dtype)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="batches at once (translate's --workers)")
    parser.add_argument("--rows", type=int, default=30, help="rows of the table")
    parser.add_argument("--out", help="folder for decode_profile.json and decode_profile.md")
    args = parser.parse_args(argv)

    from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory

    keep_freed_memory()  # as the CLI does, before torch loads
    bound_kernel_caches()
    from torch.profiler import ProfilerActivity, profile

    from nmtkit.runtime.console import get_console
    from nmtkit.translate_files import open_translator, resolve_options

    options = resolve_options([args.model], {"beam_size": args.beam}, device="cpu", engine="torch",
                              threads=args.threads, dtype=args.dtype, workers=args.workers)
    translator = open_translator([args.model], options, get_console(-1))
    with open(args.source, encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for _, line in zip(range(args.lines), handle)]
    translator.translate(lines)  # warm-up: kernels, caches and packed weights as a long run has them
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        translator.translate(lines)
    seconds = time.perf_counter() - start
    rows = common.operator_rows(prof, args.rows)
    record = {"benchmark": "decode_profile", "model": str(args.model), "lines": len(lines), "beam": args.beam,
              "dtype": args.dtype, "threads": args.threads, "workers": args.workers,
              "sent_s_under_profiler": round(len(lines) / seconds, 1),
              "load_before": [round(x, 2) for x in os.getloadavg()], "ops": rows}
    common.write_profile(Path(args.out) if args.out else None, "decode_profile", record, [
        f"## Where a search goes (beam {args.beam}, {args.dtype}, {args.threads} thread(s), "
        f"{args.workers} batch(es) at once, {len(lines)} lines)", "",
        f"{record['sent_s_under_profiler']} sentences/s under the profiler; load before {record['load_before']}.",
        "", "| op | own ms | calls | share % |", "|---|---|---|---|",
        *[f"| {r['op']} | {r['self_ms']} | {r['calls']} | {r['share_pct']} |" for r in rows]])
    return record


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
