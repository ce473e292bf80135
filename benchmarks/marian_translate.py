"""Translate a text file with transformers alone, from a MarianMT directory (what `nmtkit export
--format marian` writes, or an OPUS-MT model): the other side of docs/pretrained.md's real-weights
demonstration. Beam search ranks by raw log-probability (length_penalty 0, as `nmtkit translate
--lenpen 0`), never generates the ids generation_config.json bans, and stops after
--max-new-tokens (nmtkit's --max-len-b plus one, for EOS). One output line per input line.

    python benchmarks/marian_translate.py exported/quickstart-marian -i test.en -o hf.es --beam-size 4
"""
from __future__ import annotations

import argparse
from pathlib import Path


def translate(model_dir: str, lines: list[str], beam: int, max_new_tokens: int, batch: int) -> list[str]:
    import torch
    from transformers import GenerationConfig, MarianMTModel, MarianTokenizer

    model, tokenizer = MarianMTModel.from_pretrained(model_dir).eval(), MarianTokenizer.from_pretrained(model_dir)
    banned = GenerationConfig.from_pretrained(model_dir).bad_words_ids
    out = [""] * len(lines)
    todo = [i for i, line in enumerate(lines) if line.strip()]  # a blank line stays blank, as in nmtkit
    for start in range(0, len(todo), batch):
        rows = todo[start:start + batch]
        inputs = tokenizer([lines[i] for i in rows], return_tensors="pt", padding=True)
        with torch.inference_mode():
            ids = model.generate(**inputs, num_beams=beam, do_sample=False, length_penalty=0.0, early_stopping=True,
                                 max_new_tokens=max_new_tokens, bad_words_ids=banned)
        for i, text in zip(rows, tokenizer.batch_decode(ids, skip_special_tokens=True)):
            out[i] = text
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("-i", "--input", required=True)
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    lines = Path(args.input).read_text(encoding="utf-8").splitlines()
    outputs = translate(args.model_dir, lines, args.beam_size, args.max_new_tokens, args.batch)
    Path(args.output).write_text("".join(line + "\n" for line in outputs), encoding="utf-8")


if __name__ == "__main__":
    main()
