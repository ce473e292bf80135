"""A tiny sweep task (reversal data as text files, a tiny recipe, sweep files of variants) and
``nmtkit sweep`` run on it as a subprocess or in this process, with its results read back: what
the sweep, replica, ownership and GPU-sweep tests share."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from conftest import reversal_pairs, tiny_recipe, write_pairs
from support.cli import cli_here, run_cli

VARIANTS = [{"name": "baseline"}, {"name": "fast", "overrides": {"train.lr": 0.01}}]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def write_task(root: Path) -> Path:
    """Generated reversal data as text files and a tiny recipe reading them; returns the recipe."""
    files = {split: write_pairs(root, split, reversal_pairs(count, seed, length=6))
             for split, count, seed in (("train", 300, 0), ("dev", 20, 1), ("test", 40, 2))}
    recipe = tiny_recipe(root / "unused", data={"files": files},
                         model={"d_model": 16, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 1},
                         train={"max_steps": 12, "validate_every": 6, "save_every": 3, "log_every": 3,
                                "average_last": 1, "max_tokens": 300})
    del recipe["workdir"]
    path = root / "base.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def write_sweep(root: Path, name: str, variants=VARIANTS, **extra) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"recipe": "base.yaml", "workdir": str(root / name), "variants": variants,
                                    **extra}), encoding="utf-8")
    return path


def sweep_cli(*args: str) -> subprocess.CompletedProcess:
    result = run_cli("sweep", *map(str, args))
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    return result


def sweep_here(*args) -> subprocess.CompletedProcess:
    """``nmtkit sweep ARGS`` in this process, returned as sweep_cli returns it (its runs are still
    `nmtkit run` children)."""
    return cli_here("sweep", *args)


def results_of(sweep_dir: Path) -> dict:
    return json.loads((sweep_dir / "results.json").read_text(encoding="utf-8"))


def without_timing(results: dict) -> list[dict]:
    """The rows without what depends on the machine's speed and on how many sessions ran."""
    timing = ("train_tok_s", "train_minutes", "decode_sent_s", "peak_rss_mib")
    return [{k: v for k, v in row.items() if k not in timing} for row in results["variants"]]
