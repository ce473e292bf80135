"""Decoding speed with terminology constraints against plain decoding: sentences/s of one
model on the same lines, in one process, one configuration after the other.

Constraint sets per line (``--sets``): ``plain`` (no constraints file), ``empty`` (a list
per line, all empty: must cost nothing), and ``NxW``: N phrases of W consecutive words each,
drawn (seeded by the line number) from the line's reference translation, as a terminology
list would name them; lines whose reference has too few words get fewer. Every set runs at
each ``--beams`` width after a warm-up on the first ``--warmup`` lines; timing covers
encoding, search and detokenisation. Reported per run: sentences/s, output pieces/s, the
slowdown against ``plain`` at the same beam, the share of lines whose output contains all
their phrases (as words), and BLEU against the references.

    python benchmarks/constraints_speed.py --model WORKDIR/train/best --data WORKDIR/prepared
"""
from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import common

SETS = "plain,empty,1x1,2x1,1x2"


def phrases_from(reference: str, count: int, words: int, seed: int) -> list[str]:
    """``count`` non-overlapping phrases of ``words`` consecutive words of ``reference``."""
    tokens = reference.split()
    starts = list(range(0, len(tokens) - words + 1, words))
    random.Random(seed).shuffle(starts)
    return [" ".join(tokens[s:s + words]) for s in sorted(starts[:count])]


def guides_for(name: str, refs: list[str]):
    """The Guide per line of constraint set ``name`` (None for plain)."""
    from nmtkit.decoding.guides import Guide

    if name == "plain":
        return None
    if name == "empty":
        return [Guide() for _ in refs]
    count, words = (int(x) for x in name.split("x"))
    return [Guide(constraints=tuple(phrases_from(ref, count, words, i))) for i, ref in enumerate(refs)]


def met_share(outputs: list[str], guides) -> float | None:
    """Share of lines with constraints whose output holds every phrase as whole words."""
    asked = [(out, g.constraints) for out, g in zip(outputs, guides or []) if g.constraints]
    if not asked:
        return None
    met = sum(all(f" {p} " in f" {out} " for p in phrases) for out, phrases in asked)
    return round(met / len(asked), 4)


def run(translator, lines: list[str], refs: list[str], name: str, warmup: int) -> dict:
    import sacrebleu

    guides = guides_for(name, refs)
    tokens = [0]
    search = translator.engine.search

    def counting(src, src_mask, **targets):
        hyps = search(src, src_mask, **targets)
        tokens[0] += sum(len(h[0].tokens) for h in hyps)
        return hyps

    translator.engine.search = counting
    try:
        translator.translate(lines[:warmup], guides=None if guides is None else guides[:warmup])
        tokens[0] = 0
        start = time.perf_counter()
        outputs = translator.translate(lines, guides=guides)
        seconds = time.perf_counter() - start
    finally:
        translator.engine.search = search
    return {"set": name, "sentences": len(lines), "decode_s": round(seconds, 3),
            "sent_s": round(len(lines) / seconds, 2), "tgt_tok_s": round(tokens[0] / seconds, 1),
            "met": met_share(outputs, guides), "bleu": round(sacrebleu.corpus_bleu(outputs, [refs]).score, 2)}


def main(argv=None) -> list[dict]:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--sets", default=SETS, help=f"constraint sets (default {SETS})")
    parser.add_argument("--beams", default="5", help="comma-separated beam sizes (default 5)")
    parser.add_argument("--split", default="test", help="prepared split to translate")
    parser.add_argument("--max-sentences", type=int, default=500, help="the first N lines (0: all)")
    parser.add_argument("--warmup", type=int, default=20, help="lines translated before timing")
    parser.add_argument("--batch-tokens", type=int, default=6000, help="source tokens x beam per batch")
    args = parser.parse_args(argv)
    import torch

    from nmtkit.decoding.options import TranslateOptions
    from nmtkit.decoding.torch_engine import TorchEngine, load_models
    from nmtkit.decoding.translate import Translator

    torch.set_num_threads(args.threads)
    meta = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    data, limit = Path(args.data), args.max_sentences or None
    lines = (data / f"{args.split}.{meta['src_lang']}").read_text(encoding="utf-8").splitlines()[:limit]
    refs = (data / f"{args.split}.{meta['tgt_lang']}").read_text(encoding="utf-8").splitlines()[:limit]
    loaded = load_models([args.model], torch.device("cpu"))
    records = []
    for beam in (int(b) for b in args.beams.split(",")):
        # one batch at a time, as constrained batches always run: the ratios compare searches, not parallelism
        options = TranslateOptions(beam_size=beam, batch_tokens=args.batch_tokens, device=args.device,
                                   dtype="float32", workers=1)
        translator = Translator(TorchEngine.from_loaded(loaded, options), options)
        for name in args.sets.split(","):
            load_before = common.load_average()
            record = {"config": f"b{beam}-{name}", "beam": beam, **run(translator, lines, refs, name, args.warmup),
                      "threads": args.threads, "load_before": load_before, "load_after": common.load_average()}
            records.append(record)
            print(json.dumps(record), file=sys.stderr)
    for record in records:
        plain = next((r for r in records if r["beam"] == record["beam"] and r["set"] == "plain"), None)
        record["vs_plain"] = round(record["sent_s"] / plain["sent_s"], 3) if plain else None
    common.write_results(Path(args.out), "constraints_speed", records, [
        ("config", "configuration"), ("sent_s", "sent/s"), ("tgt_tok_s", "tgt tok/s"), ("vs_plain", "x plain"),
        ("met", "lines meeting all"), ("bleu", "BLEU"), ("decode_s", "decode s"), ("sentences", "sentences"),
        ("threads", "threads"), ("load_before", "load before")],
        "Decoding with terminology constraints",
        [f"Model {args.model}; {args.split} split of {args.data}; batches of {args.batch_tokens} source tokens x beam.",
         "NxW: N phrases of W consecutive reference words per line; 'lines meeting all' counts lines with "
         "constraints whose output holds every phrase as whole words."])
    return records


if __name__ == "__main__":
    main()
