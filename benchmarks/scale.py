"""How prepare and training grow with the corpus: synthetic corpora of given sizes, each prepared
and trained for a few updates, with wall time, peak memory, CPU and disk per size.

A synthetic pair joins 2-3 pairs of a prepared corpus's training text, each drawn at random
(seeded), so a 4.5M-pair corpus made from the 31k Bible verses has WMT-like sizes and lengths and
almost no duplicate pairs (joining 1-3 consecutive verses repeated each single verse ~50 times at
4.5M pairs, and deduplication then left a fraction of the corpus to encode). Every size
runs in a fresh work directory with the ``files`` source: ``nmtkit prepare`` then ``nmtkit
train`` for ``--steps`` updates (dev validation included), each in a child process. Peak RSS is
given for the command's own process and for its whole process tree (SentencePiece training and
the encoding workers run in children), sampled every 10 ms; CPU is the tree's user + system time
over the wall time (2.0 = both of 2 cores busy).

    python benchmarks/scale.py --text data/quickstart/prepared --sizes 500000,1500000,4500000
"""
from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import common


def synthetic_corpus(text: Path, langs: tuple[str, str], pairs: int, out: Path, seed: int,
                     dev_pairs: int = 0) -> dict:
    """``pairs`` pairs of 2-3 random training pairs of ``text`` into ``out``.{src,tgt} lang files;
    dev and test are ``text``'s own, or with ``dev_pairs`` a dev set of that many joins of its dev
    pairs (WMT's newstest dev sets hold ~3,000 pairs; the dev-loss pass's memory grows with it)."""
    rng = np.random.default_rng(seed)
    _write_joins(text, "train", langs, pairs, out, rng)
    if dev_pairs:
        _write_joins(text, "dev", langs, dev_pairs, out, rng)
    for split in ("dev", "test")[1 if dev_pairs else 0:]:
        for lang in langs:
            shutil.copyfile(text / f"{split}.{lang}", out / f"{split}.{lang}")
    return {split: {lang: str(out / f"{split}.{lang}") for lang in langs} for split in ("train", "dev", "test")}


def _write_joins(text: Path, split: str, langs: tuple[str, str], pairs: int, out: Path, rng) -> None:
    sides = [prepared_lines(text, split, lang) for lang in langs]
    with open(out / f"{split}.{langs[0]}", "w", encoding="utf-8") as src, \
            open(out / f"{split}.{langs[1]}", "w", encoding="utf-8") as tgt:
        for start in range(0, pairs, 100_000):
            count = min(100_000, pairs - start)
            rows_of = rng.integers(0, len(sides[0]), (count, 3))
            for rows, span in zip(rows_of.tolist(), rng.integers(2, 4, count).tolist()):
                rows = rows[:span]
                src.write(" ".join(sides[0][i] for i in rows) + "\n")
                tgt.write(" ".join(sides[1][i] for i in rows) + "\n")


def prepared_lines(text: Path, split: str, lang: str) -> list[str]:
    """A split's text in a prepared directory: train's is kept as ``train.LANG.gz`` (plain
    ``train.LANG`` where an older nmtkit prepared it)."""
    packed = text / f"{split}.{lang}.gz"
    if packed.is_file():
        return gzip.decompress(packed.read_bytes()).decode("utf-8").splitlines()
    return (text / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()


def tree_rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants, in MiB (0 once it is gone)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/status", encoding="utf-8") as handle:
                total += next((int(line.split()[1]) for line in handle if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", encoding="utf-8") as handle:
                    todo += [int(child) for child in handle.read().split()]
        except (OSError, ValueError):
            continue
    return round(total / 1024, 1)


def run_tree(argv: list[str], timeout: float) -> dict:
    """Run ``argv``: wall time, its own peak RSS (VmHWM), the peak RSS of its process tree and the
    tree's CPU time over the wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=common.child_env(None),
                            cwd=common.REPO)
    own, tree, deadline = None, 0.0, time.monotonic() + timeout
    while proc.poll() is None:
        own = max(filter(None, [own, common.peak_rss_mib(proc.pid)]), default=None)
        tree = max(tree, tree_rss_mib(proc.pid))
        if time.monotonic() > deadline:
            proc.kill()
        time.sleep(0.01)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    error = proc.stderr.read().decode("utf-8", "replace").strip().splitlines()[-1:] if proc.returncode else []
    return {"returncode": proc.returncode, "wall_s": round(wall, 1), "peak_rss_mib": own,
            "tree_peak_rss_mib": tree, "cpu_cores": round(cpu / max(wall, 1e-9), 2), "error": error}


def disk_mib(*paths: Path) -> float:
    files = [p for path in paths for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()]
    return round(sum(p.stat().st_size for p in files) / 2 ** 20, 1)


def recipe_for(base: Path, workdir: Path, files: dict, langs: tuple[str, str], args) -> dict:
    import yaml

    cfg = yaml.safe_load(base.read_text(encoding="utf-8")) or {}
    cfg["workdir"] = str(workdir)
    cfg["data"] = {**{k: v for k, v in cfg.get("data", {}).items() if k in ("clean",)},
                   "source": "files", "src_lang": langs[0], "tgt_lang": langs[1], "files": files}
    cfg.setdefault("vocab", {}).update({k: v for k, v in (("type", args.vocab_type), ("size", args.vocab_size))
                                        if v is not None})
    train = cfg.setdefault("train", {})
    train.update(max_steps=args.steps, log_every=1, validate_every=args.steps, save_every=10 ** 9, keep_last=1,
                 best_metric="loss", max_minutes=0, max_epochs=0, patience=0, tensorboard=False)
    if args.max_tokens:
        train["max_tokens"] = args.max_tokens
    if args.preset:
        cfg.setdefault("model", {})["preset"] = args.preset
    return cfg


def measure(size: int, args, langs: tuple[str, str]) -> dict:
    import yaml

    workdir = Path(args.work) / f"pairs-{size}"
    shutil.rmtree(workdir, ignore_errors=True)
    corpus = workdir / "corpus"
    corpus.mkdir(parents=True)
    files = synthetic_corpus(Path(args.text), langs, size, corpus, args.seed, args.dev_pairs)
    recipe = workdir / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(recipe_for(Path(args.recipe), workdir / "work", files, langs, args)),
                      encoding="utf-8")
    record = {"pairs": size, "source_mib": disk_mib(*(corpus / f"train.{lang}" for lang in langs))}
    for step in ("prepare", "train"):
        result = run_tree([common.python(), "-m", "nmtkit", "-q", step, str(recipe)], args.timeout)
        record.update({f"{step}_{key}": value for key, value in result.items()})
        if result["returncode"]:
            break
    prepared = workdir / "work" / "prepared"
    for step in ("fetch", "spm", "encode"):  # each step's wall time, from its stamp
        stamp = prepared / "stamps" / f"{step}.json"
        if stamp.is_file():
            record[f"prepare_{step}_s"] = json.loads(stamp.read_text(encoding="utf-8")).get("seconds")
    if prepared.is_dir():
        record["prepared_mib"] = disk_mib(prepared)
        record["prepared_over_source"] = round(record["prepared_mib"] / max(record["source_mib"], 1e-9), 2)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return record


COLUMNS = [("pairs", "pairs"), ("source_mib", "source MiB"), ("prepare_wall_s", "prepare s"),
           ("prepare_peak_rss_mib", "prepare RSS MiB"), ("prepare_tree_peak_rss_mib", "prepare tree RSS MiB"),
           ("prepare_cpu_cores", "prepare cores"),
           ("prepare_fetch_s", "fetch s"), ("prepare_spm_s", "spm s"), ("prepare_encode_s", "encode s"), ("prepared_mib", "prepared MiB"),
           ("prepared_over_source", "prepared / source"), ("train_wall_s", "train s"),
           ("train_peak_rss_mib", "train RSS MiB")]


def main(argv=None) -> list[dict]:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", required=True, help="a prepared directory whose train/dev/test text is the material")
    parser.add_argument("--sizes", required=True, help="comma-separated pair counts, e.g. 500000,1500000")
    parser.add_argument("--recipe", default=str(common.REPO / "recipes" / "quickstart.yaml"),
                        help="model, vocab and train settings (its data section is replaced)")
    parser.add_argument("--steps", type=int, default=3, help="training updates per size")
    parser.add_argument("--max-tokens", type=int, default=0, help="train.max_tokens (default: the recipe's)")
    parser.add_argument("--preset", default="", help="model.preset, e.g. transformer-base")
    parser.add_argument("--vocab-type", default=None, help="vocab.type (default: the recipe's)")
    parser.add_argument("--vocab-size", type=int, default=None, help="vocab.size (default: the recipe's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dev-pairs", type=int, default=0,
                        help="a dev set of this many joined dev pairs (default: --text's dev set as it is)")
    parser.add_argument("--work", default=str(common.REPO / "benchmarks" / "out" / "scale-work"),
                        help="scratch space: corpora and work directories (deleted after each size)")
    parser.add_argument("--keep", action="store_true", help="keep each size's corpus and work directory")
    parser.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per command")
    parser.add_argument("--out", default=str(common.REPO / "benchmarks" / "out"), help="where JSON and Markdown go")
    args = parser.parse_args(argv)
    manifest = json.loads((Path(args.text) / "manifest.json").read_text(encoding="utf-8"))
    langs = (manifest["languages"]["src"], manifest["languages"]["tgt"])
    records = []
    for size in (int(s) for s in args.sizes.split(",")):
        records.append({**measure(size, args, langs), "load_avg": common.load_average()})
        print(json.dumps(records[-1]), flush=True)
    notes = [f"Command: python benchmarks/scale.py {' '.join(sys.argv[1:] if argv is None else argv)}"]
    common.write_results(Path(args.out), "scale", records, COLUMNS, "Prepare and training by corpus size", notes)
    return records


if __name__ == "__main__":
    main()
