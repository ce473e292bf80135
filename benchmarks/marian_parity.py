"""MarianMT parity figures for docs/pretrained.md: on tiny random MarianMT models built with
transformers (the tests' builder, tests/support/marian_models.py), the largest difference between
nmtkit's and transformers' teacher-forced log-probabilities, how many of N inputs greedy and beam-4
search translate exactly as ``generate`` does (lenpen 0 on both sides, pad never generated,
at most 12 pieces then EOS; the imported model's other decode defaults, so the EOS forced at
the limit scores 0 on both sides), and of the others, how many of nmtkit's outputs are at least as
probable as generate's by MarianMTModel's own scoring. Prints one JSON object.

    python benchmarks/marian_parity.py --inputs 200
    python benchmarks/marian_parity.py --inputs 200 --eos-at-limit scored   # nmtkit's own rule
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

SHAPES = {"shared-swish-scaled": dict(), "separate-relu-unscaled": dict(shared=False, activation="relu", scale=False),
          "shared-gelu-untied": dict(activation="gelu", tied=False), "multilingual": dict(codes=(">>fra<<", ">>deu<<"))}


def measure(shape: dict, inputs: int, work: Path, seed: int, eos_at_limit: str = "") -> dict:
    import torch
    from conftest import tiny_sentences
    from support.marian_models import make_marian
    from test_marian_import import hf_pair, hf_translations, more_probable_where_different, our_logprobs
    from nmtkit.decoding.options import TranslateOptions
    from nmtkit.decoding.translate import translate_lines
    from nmtkit.modeldir import load_model_dir
    from nmtkit.pretrained.marian_import import import_marian
    from nmtkit.translate_files import saved_decode_settings

    hf_dir = make_marian(work / "hf", seed=seed, **shape)
    model_dir = import_marian(str(hf_dir), work / "model")
    loaded = load_model_dir(model_dir)
    hf, tokenizer = hf_pair(hf_dir)
    code = ">>deu<< " if shape.get("codes") else ""
    sources, targets = [code + s for s in tiny_sentences(64, seed + 1)], tiny_sentences(64, seed + 2)
    batch = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).logits
    theirs = logits.log_softmax(-1).gather(-1, batch.labels.clamp(min=0)[..., None])[..., 0]
    diff = max(float((ours - theirs[row, :len(ours)]).abs().max())
               for row, ours in enumerate(our_logprobs(loaded, sources, targets)))
    lines = [code + " ".join(line.split()[:4]) for line in tiny_sentences(inputs, seed + 3)]
    out = {"max_abs_logprob_difference": diff}
    for beam in (1, 4):
        options = TranslateOptions.from_decode(saved_decode_settings(model_dir), beam_size=beam, lenpen=0.0,
                                               max_len_a=0.0, max_len_b=12, min_len=0, device="cpu", dtype="float32")
        if eos_at_limit:  # another rule than the import's (free)
            options = dataclasses.replace(options, eos_at_limit=eos_at_limit)
        ours, sequences = translate_lines([loaded], lines, options), []
        theirs = hf_translations(hf, tokenizer, lines, beam, 12, sequences)
        same = sum(a == b for a, b in zip(ours, theirs))
        out[f"beam{beam}_identical"] = f"{same}/{len(lines)}"
        if same < len(lines):  # where they differ: is nmtkit's output the more probable, by MarianMTModel?
            better = more_probable_where_different(loaded, hf, tokenizer, lines, ours, theirs, sequences, options)
            out[f"beam{beam}_different_but_more_probable"] = f"{better}/{len(lines) - same}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--eos-at-limit", choices=("scored", "free"), default="",
                        help="the search's rule for the EOS forced at the length limit (default: the import's, free)")
    args = parser.parse_args()
    results = {}
    for name, shape in SHAPES.items():
        with tempfile.TemporaryDirectory() as tmp:
            results[name] = measure(shape, args.inputs, Path(tmp), args.seed, args.eos_at_limit)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
