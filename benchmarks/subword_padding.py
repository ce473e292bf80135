"""Subword regularisation and length bucketing: padding share and sampling time per epoch.

For the deterministic segmentation of train.npz and for sampled epochs (``train.subword_alpha``
and ``train.subword_nbest`` as given), the batches ``nmtkit train`` would form at
``--max-tokens`` are built and measured: batches per epoch, pieces per sentence, and the share
of padding in the padded source and target tensors. Times are CPU seconds of this process
(one thread; a busy machine stretches wall time, not these): ``setup`` builds the per-word
lattices once per run, ``sample`` is one ``SubwordSampler.epoch``.

    python benchmarks/subword_padding.py --data data/quickstart/prepared --alpha 0.1 --alpha 0.2
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmtkit.data.batching import make_batches  # noqa: E402
from nmtkit.data.ids import ParallelIds, load_split  # noqa: E402
from nmtkit.data.subword_sampling import SubwordSampler  # noqa: E402
from nmtkit.data.vocab import Vocab, spm_files  # noqa: E402


def padding(data: ParallelIds, max_tokens: int, seed: int, epoch: int) -> dict:
    """Padding share of the epoch's batches, source and target (BOS/EOS counted as real tokens)."""
    src_lens, tgt_lens = data.src_lengths(), data.tgt_lengths() + 1
    batches = make_batches(data.src_lengths(), data.tgt_lengths(), max_tokens, seed, epoch)
    real = {"src": 0, "tgt": 0}
    padded = {"src": 0, "tgt": 0}
    for idx in batches:
        for side, lens in (("src", src_lens), ("tgt", tgt_lens)):
            real[side] += int(lens[idx].sum())
            padded[side] += int(lens[idx].max()) * len(idx)
    return {"batches": len(batches), "src_pieces_per_sentence": round(real["src"] / len(data), 2),
            "tgt_pieces_per_sentence": round(real["tgt"] / len(data) - 1, 2),
            **{f"{side}_padding_share": round(1 - real[side] / padded[side], 4) for side in real}}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="A prepared/ directory.")
    parser.add_argument("--type", default="unigram", choices=("unigram", "bpe"), help="Its SentencePiece model type.")
    parser.add_argument("--alpha", type=float, action="append", help="train.subword_alpha (repeat).")
    parser.add_argument("--nbest", type=int, default=-1, help="train.subword_nbest.")
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=2, help="Sampled epochs measured per alpha.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="Also write the rows here.")
    args = parser.parse_args(argv)
    data = load_split(args.data / "train.npz")
    joint = (args.data / "spm.model").is_file()
    vocabs = tuple(Vocab(args.data / name) for name in spm_files(joint))
    rows = [{"alpha": 0.0, "epoch": 0, **padding(data, args.max_tokens, args.seed, 0)}]
    for alpha in args.alpha or [0.1]:
        start = time.process_time()
        sampler = SubwordSampler(data, vocabs, args.type, alpha, args.nbest, args.seed)
        setup = time.process_time() - start
        for epoch in range(args.epochs):
            start = time.process_time()
            sampled = sampler.epoch(epoch)
            seconds = time.process_time() - start
            rows.append({"alpha": alpha, "nbest": args.nbest, "epoch": epoch, "setup_cpu_seconds": round(setup, 2),
                         "sample_cpu_seconds": round(seconds, 2),
                         **padding(sampled, args.max_tokens, args.seed, epoch)})
    for row in rows:
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return rows


if __name__ == "__main__":
    main()
