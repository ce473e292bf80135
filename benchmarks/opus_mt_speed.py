"""Decoding speed on an OPUS-MT-size MarianMT model (d 512, 6+6 layers, 58k vocabulary, random
weights), in one run: transformers' ``generate`` against nmtkit's own search (float32, int8) and
nmtkit's CTranslate2 engine (float32, int8), all on the same imported model and the same lines.
Every hypothesis is forced to exactly ``--forced-len`` pieces (EOS blocked before, forced after),
so every engine does the same work whatever the random weights say (as decode_speed.py's forced
runs). Each configuration runs in this process after a warm-up on the first ``--warmup`` lines;
one JSON object per configuration, then the speed-ups against ``generate`` float32.

    python benchmarks/opus_mt_speed.py --sentences 500 --threads 4
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"


def opus_mt_like(out: Path, args) -> Path:
    """A random MarianMT directory of OPUS-MT's shape: real SentencePiece models of a toy
    language, vocab.json filled up to ``--vocab`` pieces (the filler pieces never occur in text)."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    sys.path.insert(0, str(TESTS))
    from support.marian_models import _pieces, _spm  # the tests' builder: SentencePiece models numbered their own way

    out.mkdir(parents=True)
    scratch = out.parent / "spm"
    scratch.mkdir()
    src, tgt = _spm(scratch, "source.spm", 1), _spm(scratch, "target.spm", 2)
    pieces = list(dict.fromkeys(_pieces(src) + _pieces(tgt)))
    filler = [f"\u2581filler{i}" for i in range(args.vocab - len(pieces) - 3)]
    vocab = {piece: i for i, piece in enumerate(["</s>", "<unk>", *pieces, *filler, "<pad>"])}
    pad = vocab["<pad>"]
    config = MarianConfig(vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=args.d_model,
                          encoder_layers=args.layers, decoder_layers=args.layers,
                          encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
                          encoder_ffn_dim=4 * args.d_model, decoder_ffn_dim=4 * args.d_model,
                          activation_function="swish", scale_embedding=True, max_position_embeddings=512,
                          pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
                          dropout=0.0)
    torch.manual_seed(0)
    MarianMTModel(config).save_pretrained(out)
    for name, path in (("source.spm", src), ("target.spm", tgt)):
        (out / name).write_bytes(path.read_bytes())
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    return out


def time_hf(hf_dir: Path, lines: list[str], args) -> float:
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    model, tokenizer = MarianMTModel.from_pretrained(hf_dir).eval(), MarianTokenizer.from_pretrained(hf_dir)

    def run(batch_lines: list[str]) -> None:
        for start in range(0, len(batch_lines), args.batch):
            inputs = tokenizer(batch_lines[start:start + args.batch], return_tensors="pt", padding=True)
            with torch.inference_mode():
                model.generate(**inputs, num_beams=args.beam, do_sample=False, min_new_tokens=args.forced_len,
                               max_new_tokens=args.forced_len + 1)

    run(lines[:args.warmup])
    start = time.perf_counter()
    run(lines)
    return time.perf_counter() - start


def time_nmtkit(model_dir: Path, lines: list[str], args, engine: str, dtype: str) -> float:
    from nmtkit.decoding.options import TranslateOptions
    from nmtkit.translate_files import open_engine
    from nmtkit.decoding.translate import Translator

    options = TranslateOptions(beam_size=args.beam, min_len=args.forced_len, max_len_a=0.0,
                               max_len_b=args.forced_len, device="cpu", dtype=dtype, engine=engine,
                               batch_tokens=args.batch * 16 * args.beam,
                               workers=1)  # one batch at a time, as CTranslate2 and generate here and as measured before
    translator = Translator(open_engine([str(model_dir)], options), options)
    translator.translate(lines[:args.warmup])
    start = time.perf_counter()
    translator.translate(lines)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--forced-len", type=int, default=20)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16, help="sentences a batch (nmtkit: the same in tokens)")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=58101)
    args = parser.parse_args()

    import torch

    from nmtkit.ctranslate2.export import export_ctranslate2
    from nmtkit.pretrained.marian_import import import_marian

    sys.path.insert(0, str(TESTS))
    from conftest import tiny_sentences

    torch.set_num_threads(args.threads)
    lines = tiny_sentences(args.sentences, 5)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        hf_dir = opus_mt_like(work / "hf", args)
        model = import_marian(str(hf_dir), work / "model")
        exports = {q: export_ctranslate2(model, work / f"ct2-{q}", q) for q in ("float32", "int8")}
        runs = {"hf:float32": lambda: time_hf(hf_dir, lines, args),
                "nmtkit:float32": lambda: time_nmtkit(model, lines, args, "torch", "float32"),
                "nmtkit:int8": lambda: time_nmtkit(model, lines, args, "torch", "int8"),
                "ct2:float32": lambda: time_nmtkit(exports["float32"], lines, args, "ctranslate2", "float32"),
                "ct2:int8": lambda: time_nmtkit(exports["int8"], lines, args, "ctranslate2", "int8")}
        seconds = {}
        for name, run in runs.items():
            seconds[name] = run()
            tokens = len(lines) * args.forced_len
            print(json.dumps({"config": name, "seconds": round(seconds[name], 3),
                              "target_tokens_per_s": round(tokens / seconds[name], 1)}), flush=True)
    print(json.dumps({"nmtkit_float32_vs_hf_float32": round(seconds["hf:float32"] / seconds["nmtkit:float32"], 2),
                      "nmtkit_int8_vs_ct2_int8": round(seconds["ct2:int8"] / seconds["nmtkit:int8"], 2),
                      "threads": args.threads, "beam": args.beam, "forced_len": args.forced_len,
                      "sentences": len(lines), "d_model": args.d_model, "vocab": args.vocab}))


if __name__ == "__main__":
    main()
