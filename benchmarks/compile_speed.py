"""torch.compile off and on: training target tokens/s, decoding sentences/s and compile time.

Training: train_speed's measurement (``nmtkit train`` for ``--steps`` updates in a fresh
process, median tokens/s of the ``--log-every`` windows after the first
``--warmup-windows``) with ``train.compile`` false and true, per dtype: float32, plus bf16
where the CPU has bf16 units (or ``--dtypes``). The compile time is the first window's
seconds minus a steady window's, compiled run minus uncompiled run (both first windows pay
the same start-up otherwise). Decoding: decode_speed's child (torch engine, beam ``--beam``)
with and without ``translate --compile``; its warm-up on the first ``--warmup`` lines holds
the compile, so compile time = warm-up seconds compiled minus uncompiled. Children run with
``TORCH_LOGS=recompiles``; ``recompiles`` counts the graphs compiled after the first (new
shape classes: batches of one sentence, the first decoder steps' empty caches).

    python benchmarks/compile_speed.py --model WORKDIR/train/best --data WORKDIR/prepared
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import common
import decode_speed
import train_speed


def default_dtypes() -> str:
    from nmtkit.runtime.device import cpu_has_fast_bf16

    return "float32,bf16" if cpu_has_fast_bf16() else "float32"


def compile_seconds(records: list[dict], key: str, first: str, steady: str = "") -> None:
    """Add ``compile_s`` to each compiled record: its start-up cost over the uncompiled one's."""
    def start_up(record: dict) -> float:
        return record[first] - (record[steady] if steady else 0.0)

    for record in records:
        if not record["compile"]:
            continue
        eager = next(r for r in records if not r["compile"] and r[key] == record[key])
        record["compile_s"] = round(start_up(record) - start_up(eager), 1)
        record["speedup"] = round(record["rate"] / eager["rate"], 3)


def training(args, meta: dict) -> list[dict]:
    recipe = Path(args.recipe) if args.recipe else train_speed.default_recipe(Path(args.data))
    records = []
    for dtype in filter(None, args.dtypes.split(",")):
        for compile in (False, True):
            record = train_speed.run_dtype(args, dtype, recipe, meta, {"compile": compile})
            record.update(what="train", compile=compile, compiled="yes" if compile else "no", rate=record["tgt_tok_s"],
                          unit="tgt tok/s")
            records.append(record)
            print(json.dumps({k: v for k, v in record.items() if k != "windows_tok_s"}), file=sys.stderr)
    compile_seconds(records, "dtype", "first_window_s", "window_s")
    return records


def decoding(args) -> list[dict]:
    data = Path(args.data)
    meta = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    args.batch_tokens = args.batch_tokens or decode_speed.run_batch_tokens(data)
    src_path = data / f"{args.split}.{meta['src_lang']}"
    refs = (data / f"{args.split}.{meta['tgt_lang']}").read_text(encoding="utf-8").splitlines()
    scratch = Path(tempfile.mkdtemp(prefix="nmtkit-bench-compile-"))
    records = []
    try:
        for dtype in filter(None, args.dtypes.split(",")):
            for compile in (False, True):
                record = decode_speed.run_config(args, "torch", dtype, args.beam, None, scratch, None, src_path,
                                                 compile=compile)
                decode_speed.add_bleu(record, refs)
                record.pop("output")
                record.update(what="decode", compile=compile, compiled="yes" if compile else "no",
                              rate=record["sent_s"], unit="sent/s")
                records.append(record)
                print(json.dumps(record), file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    compile_seconds(records, "dtype", "warmup_s")
    return records


def main(argv=None) -> list[dict]:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="", help="comma-separated: float32, bf16 (default: bf16 too where "
                                                     "the CPU has bf16 units)")
    train_speed.add_training_options(parser, steps=60)
    parser.add_argument("--split", default="test", help="prepared split to translate")
    parser.add_argument("--max-sentences", type=int, default=500, help="lines translated per run (0: all)")
    parser.add_argument("--warmup", type=int, default=50, help="lines translated before timing (holds the compile)")
    parser.add_argument("--beam", type=int, default=4, help="beam size for decoding")
    parser.add_argument("--batch-tokens", type=int, default=0, help="as decode_speed.py")
    parser.add_argument("--skip", default="", help="train or decode: leave that part out")
    args = parser.parse_args(argv)
    args.dtypes = args.dtypes or default_dtypes()
    args.keep_outputs = False
    os.environ["TORCH_LOGS"] = "recompiles"  # inherited by the children
    meta = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    records = (training(args, meta) if args.skip != "train" else []) + (decoding(args) if args.skip != "decode" else [])
    common.write_results(Path(args.out), "compile_speed", records, [
        ("what", "what"), ("dtype", "dtype"), ("compiled", "compiled"), ("rate", "rate"), ("unit", "unit"),
        ("speedup", "x uncompiled"), ("compile_s", "compile s"), ("recompiles", "recompiles"), ("bleu", "BLEU"),
        ("peak_rss_mib", "peak RSS MiB"), ("threads", "threads"), ("load_before", "load before")],
        "torch.compile on CPU: training and decoding",
        [f"Model {args.model}; data {args.data}. Training: {args.steps} updates, median of windows of "
         f"{args.log_every} after the first {args.warmup_windows}. Decoding: beam {args.beam}, "
         f"{args.max_sentences or 'all'} {args.split} lines after {args.warmup} warm-up lines."])
    return records


if __name__ == "__main__":
    main()
