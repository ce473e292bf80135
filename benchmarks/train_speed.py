"""Training throughput as a user gets it: ``nmtkit train`` on the prepared data, per dtype.

Each dtype runs ``nmtkit train`` for ``--steps`` updates in a scratch work directory whose
``prepared/`` links to ``--data``, with the model settings of ``--model`` and the training
settings of ``--recipe`` (default: the run's own ``train/config.yaml`` beside the data, else
recipes/quickstart.yaml). The trainer logs target tokens/s (EOS included, padding not) per
``--log-every`` window in metrics.jsonl; the steady state is the median of the windows after
the first ``--warmup-windows``. Peak RSS is the training process's own. MFU = model FLOP/s
(see common.transformer_flops, x3 for forward + backward) / the measured matmul peak.

``--peers joeynmt,fairseq`` also trains those toolkits (float32, CPU) on the same data,
SentencePiece vocabulary, architecture, batch size, optimiser and schedule for the same number
of updates, in the Python of ``--peer-python`` (a virtual environment where they are
installed), and reports the median of their own throughput log lines after the same warm-up:
JoeyNMT's "Tokens per Sec", fairseq's ``wps`` (fairseq_peer.py; fairseq 0.12 installs on
Python 3.11 as ``fairseq-fixed``). Both count target tokens with EOS and without padding, as
ours. Each nmtkit record gets its tok/s and peak RSS over each peer's (``x_fairseq_tok_s``,
``x_fairseq_rss``, whatever our dtype), and over the fastest peer's in its dtype (``x_peer``).
(OpenNMT-py 3.5 does not import on Python 3.11 with torch >= 2.3; see RESULTS.md.)

    python benchmarks/train_speed.py --model WORKDIR/train/best --data WORKDIR/prepared \
        [--peers fairseq --peer-python VENV/bin/python]
"""
from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional

import common
import fairseq_peer


def default_recipe(data: Path) -> Path:
    run_config = data.parent / "train" / "config.yaml"
    return run_config if run_config.is_file() else common.REPO / "recipes" / "quickstart.yaml"


def bench_recipe(recipe: Path, model_meta: dict, workdir: Path, args, dtype: str,
                 overrides: Optional[dict] = None) -> dict:
    """The recipe, with the model's settings and a short run that only measures (plus
    ``overrides`` of train settings, e.g. compile or threads)."""
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
                 max_epochs=0, patience=0, tensorboard=False, **(overrides or {}))
    if args.max_tokens:
        train["max_tokens"] = args.max_tokens
    return cfg


def steady_state(metrics_path: Path, skip: int) -> dict:
    rows = [json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rates = [r["tgt_tok_s"] for r in rows if r.get("type") == "train"]
    kept = rates[skip:] or rates[-1:]
    clock = [0.0] + [r["train_seconds"] for r in rows if r.get("type") == "train"]
    durations = [b - a for a, b in zip(clock, clock[1:])]  # seconds per window (the first: start-up included)
    return {"windows_tok_s": rates, "tgt_tok_s": round(statistics.median(kept), 1),
            "tgt_tok_s_min": min(kept), "tgt_tok_s_max": max(kept), "first_window_s": round(durations[0], 2),
            "window_s": round(statistics.median(durations[skip:] or durations[-1:]), 2)}


def timed_train(argv: list[str], scratch: Path, args, label: str) -> tuple[dict, dict, list[float]]:
    """Run ``nmtkit train`` (``argv``) whose run directory is ``scratch``/train: the child's
    record, the steady-state tokens/s of its metrics, and the load average before it."""
    load_before = common.load_average()
    done = common.run_child(argv, threads=args.threads)
    if done["returncode"] != 0:
        raise RuntimeError(f"nmtkit train failed ({label}):\n{done['stderr'][-3000:]}")
    return done, steady_state(scratch / "train" / "metrics.jsonl", args.warmup_windows), load_before


def mean_lengths(data: Path) -> tuple[float, float]:
    import numpy as np

    split = np.load(data / "train.npz")
    n = len(split["src_offsets"]) - 1
    return float(split["src_offsets"][-1]) / n, float(split["tgt_offsets"][-1]) / n + 1  # + EOS


def run_dtype(args, dtype: str, recipe: Path, meta: dict, overrides: Optional[dict] = None) -> dict:
    import yaml

    scratch = Path(tempfile.mkdtemp(prefix="nmtkit-bench-train-"))
    try:
        (scratch / "prepared").symlink_to(Path(args.data).resolve())
        cfg = bench_recipe(recipe, meta, scratch, args, dtype, overrides)
        recipe_path = scratch / "bench.yaml"
        recipe_path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        argv = [common.python(), "-m", "nmtkit", "-q", "train", str(recipe_path)]
        done, result, load_before = timed_train(argv, scratch, args, dtype)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"toolkit": "nmtkit", "dtype": dtype, "overrides": overrides or {}, "steps": args.steps,
            "max_tokens": cfg["train"].get("max_tokens", 4096),
            "recompiles": done["stderr"].count("Recompiling function"),  # counted with TORCH_LOGS=recompiles
            "threads": args.threads, **result, "peak_rss_mib": done["peak_rss_mib"], "wall_s": done["wall_s"],
            "load_before": load_before, "load_after": common.load_average(),
            "command": " ".join(argv[1:]) + f"  (recipe: {recipe} + model of {args.model})"}


# JoeyNMT 2.3 restricts SentencePiece to its vocabulary with SetVocabulary, which
# sentencepiece >= 0.2.1 no longer has; our vocabulary file is the model's whole piece list,
# so the restriction changes nothing and the shim makes it a no-op.
JOEYNMT_MAIN = ("import sys, sentencepiece\n"
                "if not hasattr(sentencepiece.SentencePieceProcessor, 'SetVocabulary'):\n"
                "    sentencepiece.SentencePieceProcessor.SetVocabulary = lambda self, pieces: None\n"
                "from joeynmt.__main__ import main\n"
                "sys.argv[0] = 'joeynmt'\n"
                "main()\n")


def joeynmt_config(meta: dict, recipe: dict, data: Path, workdir: Path, args) -> dict:
    """A JoeyNMT 2.x config with our model's dimensions and our recipe's training settings."""
    m, train = meta["model"], recipe.get("train", {})
    spm = {"model_file": str((Path(args.model) / meta["spm"]["src"]).resolve())}

    def side(lang: str) -> dict:
        return {"lang": lang, "level": "bpe", "lowercase": False, "max_length": 250,
                "voc_file": str(workdir / "vocab.txt"), "tokenizer_type": "sentencepiece", "tokenizer_cfg": spm}

    def stack(layers: int) -> dict:
        return {"type": "transformer", "num_layers": layers, "num_heads": m["heads"], "hidden_size": m["d_model"],
                "embeddings": {"embedding_dim": m["d_model"], "scale": True}, "ff_size": m["ffn_dim"],
                "dropout": m.get("dropout", 0.1), "layer_norm": "pre" if m.get("pre_norm") else "post"}

    return {
        "name": "nmtkit-bench", "joeynmt_version": "2.3.0", "model_dir": str(workdir / "model"), "use_cuda": False,
        "data": {"train": str(data / "train"), "dev": str(data / "dev"), "dataset_type": "plain",
                 "src": side(meta["src_lang"]), "trg": side(meta["tgt_lang"])},
        "training": {"optimizer": "adam", "adam_betas": [0.9, 0.98], "learning_rate": float(train.get("lr", 7e-4)),
                     "scheduling": "warmupinversesquareroot", "learning_rate_warmup": int(train.get("warmup", 4000)),
                     "label_smoothing": float(train.get("label_smoothing", 0.1)), "loss": "crossentropy",
                     "batch_size": int(args.max_tokens or train.get("max_tokens", 4096)), "batch_type": "token",
                     "updates": args.steps, "epochs": 100, "logging_freq": args.log_every,
                     "validation_freq": 10 ** 8, "keep_best_ckpts": 0, "shuffle": True, "overwrite": True,
                     "random_seed": 1, "num_workers": 0, "fp16": False},
        "testing": {"beam_size": 4, "beam_alpha": 0.6, "batch_size": 2048, "batch_type": "token",
                    "eval_metrics": ["bleu"]},  # required by its config parser; --skip-test runs none
        "model": {"initializer": "xavier_uniform", "embed_initializer": "xavier_uniform", "bias_initializer": "zeros",
                  "tied_embeddings": meta["spm"]["src"] == meta["spm"]["tgt"], "tied_softmax": True,
                  "encoder": stack(m["encoder_layers"]), "decoder": stack(m["decoder_layers"])},
    }


def run_joeynmt(args, recipe: Path, meta: dict) -> dict:
    """JoeyNMT on the same data and settings; its steady-state target tokens/s and peak RSS."""
    import sentencepiece
    import yaml

    scratch = Path(tempfile.mkdtemp(prefix="nmtkit-bench-joey-"))
    try:
        sp = sentencepiece.SentencePieceProcessor(model_file=str(Path(args.model) / meta["spm"]["src"]))
        (scratch / "vocab.txt").write_text("".join(sp.id_to_piece(i) + "\n" for i in range(sp.vocab_size())),
                                           encoding="utf-8")
        cfg = joeynmt_config(meta, yaml.safe_load(recipe.read_text(encoding="utf-8")) or {},
                             Path(args.data).resolve(), scratch, args)
        (scratch / "joey.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        argv = [args.peer_python, "-c", JOEYNMT_MAIN, "train", str(scratch / "joey.yaml"), "--skip-test"]
        load_before = common.load_average()
        done = common.run_child(argv, threads=args.threads, timeout=3600.0)
        log = done["stdout"] + done["stderr"]
        if done["returncode"] != 0:
            raise RuntimeError(f"joeynmt train failed:\n{log[-3000:]}")
        rates = [float(x) for x in re.findall(r"Tokens per Sec:\s*([0-9.]+)", log)]
        if not rates:
            raise RuntimeError(f"no throughput in JoeyNMT's log:\n{log[-3000:]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return peer_record("joeynmt", args, rates, done, load_before, cfg["training"]["batch_size"],
                       f"joeynmt train joey.yaml --skip-test (JoeyNMT {args.peer_python})")


def peer_record(toolkit: str, args, rates: list[float], done: dict, load_before: list[float], max_tokens: int,
                command: str) -> dict:
    """A peer's record: the median of its logged windows after the same warm-up as ours."""
    kept = rates[args.warmup_windows:] or rates[-1:]
    return {"toolkit": toolkit, "dtype": "float32", "steps": args.steps, "max_tokens": max_tokens,
            "threads": args.threads, "windows_tok_s": rates, "tgt_tok_s": round(statistics.median(kept), 1),
            "tgt_tok_s_min": min(kept), "tgt_tok_s_max": max(kept), "peak_rss_mib": done["peak_rss_mib"],
            "wall_s": done["wall_s"], "load_before": load_before, "load_after": common.load_average(),
            "command": command}


def run_fairseq(args, recipe: Path, meta: dict) -> dict:
    """fairseq on the same pieces, vocabulary and settings; its steady-state target tokens/s and peak RSS."""
    import yaml

    scratch = Path(tempfile.mkdtemp(prefix="nmtkit-bench-fairseq-"))
    try:
        bin_dir = fairseq_peer.binarize(args, meta, scratch)
        argv = [args.peer_python, *fairseq_peer.fairseq_train_argv(
            meta, yaml.safe_load(recipe.read_text(encoding="utf-8")) or {}, bin_dir, args)]
        load_before = common.load_average()
        done = common.run_child(argv, threads=args.threads, timeout=3600.0)
        log = done["stdout"] + done["stderr"]
        if done["returncode"] != 0:
            raise RuntimeError(f"fairseq-train failed:\n{log[-3000:]}")
        rates = fairseq_peer.fairseq_rates(log)
        if not rates:
            raise RuntimeError(f"no throughput in fairseq's log:\n{log[-3000:]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    record = peer_record("fairseq", args, rates, done, load_before, int(argv[argv.index("--max-tokens") + 1]),
                         "fairseq-train " + " ".join(argv[3:]).replace(str(scratch), "SCRATCH"))
    return {**record, "vocab": fairseq_peer.dictionary_size(log)}


PEERS = {"joeynmt": run_joeynmt, "fairseq": run_fairseq}


def compare_with_peers(record: dict, records: list[dict]) -> None:
    """For an nmtkit record: its tok/s over the fastest peer's in the same dtype (``x_peer``),
    and its tok/s and peak RSS over each peer's whatever the peer's dtype (``x_fairseq_tok_s``,
    ``x_fairseq_rss``: the targets compare our default dtype with fairseq's float32)."""
    if record["toolkit"] != "nmtkit":
        return
    peers = [r for r in records if r["toolkit"] != "nmtkit"]
    same_dtype = [r["tgt_tok_s"] for r in peers if r["dtype"] == record["dtype"]]
    if same_dtype:
        record["x_peer"] = round(record["tgt_tok_s"] / max(same_dtype), 2)
    for peer in peers:
        record[f"x_{peer['toolkit']}_tok_s"] = round(record["tgt_tok_s"] / peer["tgt_tok_s"], 2)
        if record["peak_rss_mib"] and peer["peak_rss_mib"]:
            record[f"x_{peer['toolkit']}_rss"] = round(record["peak_rss_mib"] / peer["peak_rss_mib"], 2)


def add_training_options(parser, steps: int) -> None:
    """The options of every benchmark that measures training with run_dtype."""
    parser.add_argument("--recipe", help="recipe for the training settings (default: the run's config.yaml "
                                         "beside --data, else recipes/quickstart.yaml)")
    parser.add_argument("--steps", type=int, default=steps, help="training updates per run")
    parser.add_argument("--log-every", type=int, default=5, help="updates per throughput window")
    parser.add_argument("--warmup-windows", type=int, default=2, help="windows left out as warm-up")
    parser.add_argument("--max-tokens", type=int, default=0, help="override train.max_tokens (0: the recipe's)")


def main(argv=None) -> list[dict]:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bf16", help="comma-separated: float32, bf16")
    add_training_options(parser, steps=40)
    parser.add_argument("--peers", default="", help="peer toolkits to train the same way: " + ", ".join(PEERS))
    parser.add_argument("--peer-python", default=sys.executable, help="the Python where the peers are installed")
    common.add_peak_option(parser)
    args = parser.parse_args(argv)
    data = Path(args.data)
    meta = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    recipe = Path(args.recipe) if args.recipe else default_recipe(data)
    src_len, tgt_len = mean_lengths(data)
    import sentencepiece

    vocab = sentencepiece.SentencePieceProcessor(model_file=str(Path(args.model) / meta["spm"]["tgt"])).vocab_size()
    flops = common.transformer_flops(meta["model"], vocab, src_len, tgt_len)
    records = []
    runs = [("nmtkit", dtype) for dtype in filter(None, args.dtypes.split(","))]
    runs += [(peer, "float32") for peer in filter(None, args.peers.split(","))]
    unknown = [toolkit for toolkit, _ in runs if toolkit not in ("nmtkit", *PEERS)]
    if unknown:  # before anything runs
        raise SystemExit(f"unknown peer {unknown[0]!r} (known: {', '.join(PEERS)})")
    for toolkit, dtype in runs:
        peak = common.matmul_peak(dtype, args.threads, args.peak_seconds)
        record = run_dtype(args, dtype, recipe, meta) if toolkit == "nmtkit" else PEERS[toolkit](args, recipe, meta)
        achieved = record["tgt_tok_s"] * flops["train_per_tgt_token"] / 1e9
        record.update(matmul_peak_gflops=peak["gflops"], matmul_peak=peak, model_gflops=round(achieved, 1),
                      mfu_pct=round(100 * achieved / peak["gflops"], 1),
                      train_mflop_per_tgt_token=round(flops["train_per_tgt_token"] / 1e6, 1))
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "windows_tok_s"}), file=sys.stderr)
    peer_names = [toolkit for toolkit in PEERS if any(r["toolkit"] == toolkit for r in records)]
    for record in records:
        compare_with_peers(record, records)
    common.write_results(Path(args.out), "train_speed", records, [
        ("toolkit", "toolkit"), ("dtype", "dtype"), ("tgt_tok_s", "train tgt tok/s (median)"), ("tgt_tok_s_min", "min"),
        ("tgt_tok_s_max", "max"), ("peak_rss_mib", "peak RSS MiB"), ("train_mflop_per_tgt_token", "MFLOP/tok"),
        ("model_gflops", "model GFLOP/s"), ("matmul_peak_gflops", "matmul peak GFLOP/s"), ("mfu_pct", "MFU %"),
        ("x_peer", "x fastest peer"),
        *[column for peer in peer_names for column in ((f"x_{peer}_tok_s", f"tok/s / {peer}'s"),
                                                        (f"x_{peer}_rss", f"peak RSS / {peer}'s"))],
        ("threads", "threads"), ("load_before", "load before")],
        "Training throughput (steady state)",
        [f"Model {args.model}; data {args.data}; mean lengths src {src_len:.1f} / tgt {tgt_len:.1f} pieces.",
         f"{args.steps} updates per dtype, windows of {args.log_every}, the first {args.warmup_windows} left out."])
    return records


if __name__ == "__main__":
    main()
