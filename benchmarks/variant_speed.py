"""Training speed of each model variant (issue 15): ``nmtkit train`` of one recipe with one
override set per variant, for a few updates each, in the same sitting.

Each variant trains ``--steps`` updates in a scratch work directory whose ``prepared/`` links
to ``--data`` (so every variant sees the same batches), logging every ``--log-every``
updates; tokens/s is the median of the trainer's ``tgt_tok_s`` windows after the first
``--warmup-windows``, and is reported relative to the first variant. Parameter counts (total
and, for Mixture of Experts, active per token) come from ``nmtkit train --dry-run``.

    python benchmarks/variant_speed.py --recipe recipes/quickstart.yaml --data data/quickstart/prepared
"""
from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from pathlib import Path

import common
from train_speed import timed_train

# name -> dotted overrides of the recipe (the first is the reference)
VARIANTS: dict[str, list[str]] = {
    "default (sinusoidal, relu, post-norm)": [],
    "pre-norm": ["model.pre_norm=true"],
    "rmsnorm (pre-norm)": ["model.pre_norm=true", "model.norm=rmsnorm"],
    "learned positions": ["model.positions=learned"],
    "alibi": ["model.positions=alibi"],
    "rope": ["model.positions=rope"],
    "gelu": ["model.ffn=gelu"],
    "swiglu": ["model.ffn=swiglu"],
    "moe 4 experts top-2 every 2nd": ["model.moe_experts=4", "model.moe_top_k=2", "model.moe_every=2"],
    "moe 8 experts top-1": ["model.moe_experts=8", "model.moe_top_k=1", "model.moe_every=1"],
}


def parameters(recipe: Path, overrides: list[str], threads: int) -> dict:
    """Total and active parameters as ``--dry-run`` prints them."""
    done = common.run_child([common.python(), "-m", "nmtkit", "train", str(recipe), "--dry-run", *overrides],
                            threads=threads)
    text = done["stdout"] + done["stderr"]
    if done["returncode"] != 0:
        raise RuntimeError(f"--dry-run failed ({overrides}):\n{text[-2000:]}")
    total = re.search(r"parameters: total\D*([\d,]+)", text)
    active = re.search(r"parameters: active per token\D*([\d,]+)", text)
    as_int = (lambda m: int(m.group(1).replace(",", "")) if m else None)
    return {"parameters": as_int(total), "active_parameters": as_int(active) or as_int(total)}


def run_variant(args, name: str, overrides: list[str]) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="nmtkit-bench-variant-"))
    try:
        (scratch / "prepared").symlink_to(Path(args.data).resolve())
        settings = [f"workdir={scratch}", f"train.max_steps={args.steps}", f"train.log_every={args.log_every}",
                    "train.validate_every=1000000", "train.save_every=1000000", f"train.threads={args.threads}",
                    *overrides]
        counts = parameters(Path(args.recipe), settings, args.threads)
        argv = [common.python(), "-m", "nmtkit", "-q", "train", str(args.recipe), *settings]
        done, result, load_before = timed_train(argv, scratch, args, name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"variant": name, "overrides": " ".join(overrides) or "—", **counts, **result,
            "peak_rss_mib": done["peak_rss_mib"], "threads": args.threads, "steps": args.steps,
            "load_before": load_before, "load_after": common.load_average(),
            "command": "nmtkit -q train " + " ".join(str(a) for a in argv[5:])}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default=str(common.REPO / "recipes" / "quickstart.yaml"))
    parser.add_argument("--data", required=True, help="a prepared directory of that recipe (WORKDIR/prepared)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--warmup-windows", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    parser.add_argument("--out", default=str(common.REPO / "benchmarks" / "out"))
    args = parser.parse_args(argv)
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or list(VARIANTS)
    records = []
    for name in chosen:
        records.append(run_variant(args, name, VARIANTS[name]))
        reference = records[0]["tgt_tok_s"]
        for record in records:
            record["relative_speed"] = round(record["tgt_tok_s"] / reference, 3)
        common.write_results(Path(args.out), "variant_speed", records,
                             [("variant", "variant"), ("parameters", "parameters"),
                              ("active_parameters", "active / token"), ("tgt_tok_s", "train tgt tok/s"),
                              ("relative_speed", "× default"), ("peak_rss_mib", "peak RSS MiB"),
                              ("load_before", "load")],
                             "Training speed per model variant",
                             [f"{args.steps} updates per variant, {args.threads} threads, median of windows of "
                              f"{args.log_every} after the first {args.warmup_windows}."])
        print(f"{name}: {records[-1]['tgt_tok_s']} tok/s", flush=True)
    return records


if __name__ == "__main__":
    main()
