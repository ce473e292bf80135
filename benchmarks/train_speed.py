"""Training throughput as a user gets it: ``nmtkit train`` on the prepared data, per dtype.

Each dtype runs ``nmtkit train`` for ``--steps`` updates in a scratch work directory whose
``prepared/`` links to ``--data``, with the model settings of ``--model`` and the training
settings of ``--recipe`` (default: the run's own ``train/config.yaml`` beside the data, else
recipes/quickstart.yaml). The trainer logs target tokens/s (EOS included, padding not) per
``--log-every`` window in metrics.jsonl; the steady state is the median of the windows after
the first ``--warmup-windows``. Peak RSS is the training process's own. MFU = model FLOP/s
(see common.transformer_flops, x3 for forward + backward) / the measured matmul peak.

    python benchmarks/train_speed.py --model WORKDIR/train/best --data WORKDIR/prepared
"""
from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import common


def default_recipe(data: Path) -> Path:
    run_config = data.parent / "train" / "config.yaml"
    return run_config if run_config.is_file() else common.REPO / "recipes" / "quickstart.yaml"


def bench_recipe(recipe: Path, model_meta: dict, workdir: Path, args, dtype: str) -> dict:
    """The recipe, with the model's settings and a short run that only measures."""
    import yaml

    cfg = yaml.safe_load(recipe.read_text(encoding="utf-8")) or {}
    cfg["workdir"] = str(workdir)
    cfg["model"] = {k: v for k, v in model_meta["model"].items()}
    data = cfg.setdefault("data", {})
    for key in ("src_lang", "tgt_lang"):
        if key in model_meta:
            data[key] = model_meta[key]
    cfg.setdefault("vocab", {})["joint"] = model_meta["spm"]["src"] == model_meta["spm"]["tgt"]
    train = cfg.setdefault("train", {})
    train.update(max_steps=args.steps, log_every=args.log_every, validate_every=args.steps, save_every=10 ** 9,
                 keep_last=1, best_metric="loss", dtype=dtype, device=args.device, max_minutes=0,
                 max_epochs=0, patience=0, tensorboard=False)
    if args.max_tokens:
        train["max_tokens"] = args.max_tokens
    return cfg


def steady_state(metrics_path: Path, skip: int) -> dict:
    rows = [json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rates = [r["tgt_tok_s"] for r in rows if r.get("type") == "train"]
    kept = rates[skip:] or rates[-1:]
    return {"windows_tok_s": rates, "tgt_tok_s": round(statistics.median(kept), 1),
            "tgt_tok_s_min": min(kept), "tgt_tok_s_max": max(kept)}


def mean_lengths(data: Path) -> tuple[float, float]:
    import numpy as np

    split = np.load(data / "train.npz")
    n = len(split["src_offsets"]) - 1
    return float(split["src_offsets"][-1]) / n, float(split["tgt_offsets"][-1]) / n + 1  # + EOS


def run_dtype(args, dtype: str, recipe: Path, meta: dict) -> dict:
    import yaml

    scratch = Path(tempfile.mkdtemp(prefix="nmtkit-bench-train-"))
    try:
        (scratch / "prepared").symlink_to(Path(args.data).resolve())
        cfg = bench_recipe(recipe, meta, scratch, args, dtype)
        recipe_path = scratch / "bench.yaml"
        recipe_path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        argv = [common.python(), "-m", "nmtkit", "-q", "train", str(recipe_path)]
        load_before = common.load_average()
        done = common.run_child(argv, threads=args.threads)
        if done["returncode"] != 0:
            raise RuntimeError(f"nmtkit train failed ({dtype}):\n{done['stderr'][-3000:]}")
        result = steady_state(scratch / "train" / "metrics.jsonl", args.warmup_windows)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"dtype": dtype, "steps": args.steps, "max_tokens": cfg["train"].get("max_tokens", 4096),
            "threads": args.threads, **result, "peak_rss_mib": done["peak_rss_mib"], "wall_s": done["wall_s"],
            "load_before": load_before, "load_after": common.load_average(),
            "command": " ".join(argv[1:]) + f"  (recipe: {recipe} + model of {args.model})"}


def main(argv=None) -> list[dict]:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--recipe", help="recipe for the training settings (default: see above)")
    parser.add_argument("--dtypes", default="float32,bf16", help="comma-separated: float32, bf16")
    parser.add_argument("--steps", type=int, default=40, help="updates per dtype")
    parser.add_argument("--log-every", type=int, default=5, help="updates per throughput window")
    parser.add_argument("--warmup-windows", type=int, default=2, help="windows left out as warm-up")
    parser.add_argument("--max-tokens", type=int, default=0, help="override train.max_tokens (0: the recipe's)")
    args = parser.parse_args(argv)
    data = Path(args.data)
    meta = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    recipe = Path(args.recipe) if args.recipe else default_recipe(data)
    src_len, tgt_len = mean_lengths(data)
    import sentencepiece

    vocab = sentencepiece.SentencePieceProcessor(model_file=str(Path(args.model) / meta["spm"]["tgt"])).vocab_size()
    flops = common.transformer_flops(meta["model"], vocab, src_len, tgt_len)
    records = []
    for dtype in args.dtypes.split(","):
        peak = common.matmul_peak(dtype, args.threads)
        record = run_dtype(args, dtype, recipe, meta)
        achieved = record["tgt_tok_s"] * flops["train_per_tgt_token"] / 1e9
        record.update(matmul_peak_gflops=peak["gflops"], matmul_peak=peak, model_gflops=round(achieved, 1),
                      mfu_pct=round(100 * achieved / peak["gflops"], 1),
                      train_mflop_per_tgt_token=round(flops["train_per_tgt_token"] / 1e6, 1))
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "windows_tok_s"}), file=sys.stderr)
    common.write_results(Path(args.out), "train_speed", records, [
        ("dtype", "dtype"), ("tgt_tok_s", "train tgt tok/s (median)"), ("tgt_tok_s_min", "min"),
        ("tgt_tok_s_max", "max"), ("peak_rss_mib", "peak RSS MiB"), ("train_mflop_per_tgt_token", "MFLOP/tok"),
        ("model_gflops", "model GFLOP/s"), ("matmul_peak_gflops", "matmul peak GFLOP/s"), ("mfu_pct", "MFU %"),
        ("threads", "threads"), ("load_before", "load before")],
        "Training throughput (nmtkit train, steady state)",
        [f"Model {args.model}; data {args.data}; mean lengths src {src_len:.1f} / tgt {tgt_len:.1f} pieces.",
         f"{args.steps} updates per dtype, windows of {args.log_every}, the first {args.warmup_windows} left out."])
    return records


if __name__ == "__main__":
    main()
