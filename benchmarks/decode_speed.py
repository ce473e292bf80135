"""Decoding throughput: sentences/s and target tokens/s on the test set, per engine, dtype
and beam, each configuration in a fresh process (its own peak RSS, no shared warm state).

Engines: ``torch`` (nmtkit's own search; dtype float32, bf16 or int8 = int8 Linear
layers, each input row scaled on its own, ``--dtype int8``), ``ct2`` (``nmtkit translate --engine ctranslate2``
on the model exported by ``nmtkit export``; float32 or int8 compute), ``ct2direct`` (the same
export run by CTranslate2 alone, as its own users would: SentencePiece pieces into one
``translate_batch`` call that sorts and batches by itself), ``hf`` (HuggingFace MarianMT
``generate``, random weights of the same dims, float32, bf16 or int8 = PyTorch's dynamic
quantisation, one scale per batch: forced lengths only). Every engine reads the same lines, encodes them
with the same SentencePiece model and runs length-sorted batches of ``--batch-tokens``
source tokens x beam. Timing starts after model loading and a warm-up on the first
``--warmup`` lines; it covers encoding, search and detokenisation.

Two kinds of runs:
- natural: each engine translates as it would for a user (lenpen 0.6, limit |x| + 50);
  BLEU against the reference shows what a dtype costs in quality.
- forced (``--forced-len L``): every hypothesis is exactly L pieces long (EOS blocked
  before, forced at L), so every engine does the same work whatever its weights; this is
  how HF is compared (ANCHORS: "forced lengths").
Target tokens are output pieces, EOS not counted.

A configuration is ``engine:dtype:beam`` or ``engine:dtype:beam:wN``: N batches searched at once
(torch: ``translate --workers N``, the threads shared among them; default: nmtkit's own choice,
one batch per thread; ct2direct: CTranslate2's ``inter_threads`` N with ``intra_threads``
threads / N; default 1, CTranslate2's own default). ``ct2direct:int8:4:w2`` on 2 cores is
CTranslate2 at its fastest there.

    python benchmarks/decode_speed.py --model WORKDIR/train/best --data WORKDIR/prepared
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import common

NATURAL = "torch:float32:4,torch:float32:1,torch:bf16:4,torch:bf16:1,torch:int8:4,torch:int8:1," \
          "ct2:float32:4,ct2:float32:1,ct2:int8:4,ct2:int8:1,ct2direct:float32:4,ct2direct:int8:4," \
          "ct2direct:int8:4:w2,ct2direct:int8:1:w2"
FORCED = "torch:float32:4,torch:int8:4,ct2:float32:4,ct2:int8:4,ct2direct:float32:4,ct2direct:int8:4," \
         "hf:float32:4,hf:int8:4"


# -- the child: one configuration ------------------------------------------------------------
class Counting:
    """Wraps a translator's engine ``search`` to count output pieces of the best hypotheses."""

    def __init__(self, translator) -> None:
        self.tokens = 0
        self.search = translator.engine.search
        self.lock = threading.Lock()  # batches may be searched on several threads at once
        translator.engine.search = self

    def __call__(self, *batch, **targets):
        hyps = self.search(*batch, **targets)
        with self.lock:
            self.tokens += sum(len(h[0].tokens) for h in hyps)
        return hyps


def torch_translator(cfg: dict, options):
    from nmtkit.runtime.compiler import compile_decoder
    from nmtkit.runtime.console import get_console
    from nmtkit.runtime.device import resolve_device
    from nmtkit.decoding.torch_engine import TorchEngine, load_models
    from nmtkit.decoding.translate import Translator

    engine = TorchEngine.from_loaded(load_models([cfg["model"]], resolve_device(cfg["device"])), options)
    if cfg.get("compile"):  # as translate --compile does
        engine.model = compile_decoder(engine.model, engine.device, get_console())
    return Translator(engine, options)


class MarianForced:
    """HuggingFace MarianMT (post-norm, sinusoidal, scaled tied embeddings: our architecture)
    with random weights, decoding exactly ``forced_len`` pieces per hypothesis, in ``dtype``
    (bf16: weights cast; int8: ``quantize_dynamic`` on its Linear layers, a scale per batch)."""

    def __init__(self, cfg: dict) -> None:
        import torch
        from transformers import MarianConfig, MarianMTModel

        from nmtkit.data.vocab import Vocab
        from nmtkit.decoding.translate import TranslateOptions

        meta = json.loads((Path(cfg["model"]) / "config.json").read_text(encoding="utf-8"))
        m = meta["model"]
        self.src_vocab = Vocab(Path(cfg["model"]) / meta["spm"]["src"])
        vocab = len(self.src_vocab)
        config = MarianConfig(vocab_size=vocab, decoder_vocab_size=vocab, d_model=m["d_model"],
                              encoder_layers=m["encoder_layers"], decoder_layers=m["decoder_layers"],
                              encoder_attention_heads=m["heads"], decoder_attention_heads=m["heads"],
                              encoder_ffn_dim=m["ffn_dim"], decoder_ffn_dim=m["ffn_dim"], activation_function="relu",
                              max_position_embeddings=m["max_positions"], scale_embedding=True, dropout=0.0,
                              pad_token_id=0, eos_token_id=3, bos_token_id=2, decoder_start_token_id=2,
                              forced_eos_token_id=None, share_encoder_decoder_embeddings=True)
        torch.manual_seed(0)
        self.model = MarianMTModel(config).eval()
        if cfg["dtype"] == "bf16":
            self.model = self.model.to(torch.bfloat16)
        elif cfg["dtype"] == "int8":
            self.model = torch.ao.quantization.quantize_dynamic(self.model, {torch.nn.Linear}, dtype=torch.qint8)
        self.options = TranslateOptions(beam_size=cfg["beam"], batch_tokens=cfg["batch_tokens"])
        self.forced_len = cfg["forced_len"]
        self.tokens = 0

    def translate(self, lines: list[str]) -> list[str]:
        import torch

        from nmtkit.decoding.batching import pad_sources, token_batches
        from nmtkit.specials import EOS

        sources = self.src_vocab.encode_batch(lines)
        out = [""] * len(lines)
        for batch in token_batches([len(s) for s in sources], self.options.batch_tokens, self.options.beam_size):
            src, mask = pad_sources([sources[i] or [EOS] for i in batch])
            with torch.inference_mode():
                generated = self.model.generate(input_ids=src, attention_mask=mask.long(),
                                                num_beams=self.options.beam_size, do_sample=False,
                                                min_new_tokens=self.forced_len, max_new_tokens=self.forced_len)
            for i, row in zip(batch, generated[:, 1:].tolist()):  # drop the decoder start token
                pieces = [t for t in row if t > EOS]  # the special ids are 0 to EOS
                self.tokens += len(pieces)
                out[i] = self.src_vocab.decode(pieces)
        return out


class CT2Direct:
    """CTranslate2 without nmtkit in the loop: the target for ``--engine ctranslate2``'s
    overhead. One ``translate_batch`` over all lines with CTranslate2's own sorting and
    batches of ``batch_tokens / beam`` source tokens (the same rows as the other engines);
    the length limit is the longest source + 50 for all (CTranslate2 has no per-sentence
    limit), or exactly ``forced_len``."""

    def __init__(self, cfg: dict) -> None:
        import ctranslate2
        import sentencepiece

        from nmtkit.ctranslate2.export import META

        model_dir = Path(cfg["ct2_model"])
        spm = json.loads((model_dir / META).read_text(encoding="utf-8"))["spm"]
        self.sp_src = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / spm["src"]))
        self.sp_tgt = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / spm["tgt"]))
        compute = {"float32": "float32", "int8": "int8", "bf16": "bfloat16", "fp16": "float16"}[cfg["dtype"]]
        # wN: N batches at once, each on threads / N of the threads (N at most the threads; with
        # --threads 0, CTranslate2's own intra_threads default for each)
        threads, inter = cfg["threads"], cfg.get("workers") or 1
        inter = min(inter, threads) if threads else inter
        self.ct2 = ctranslate2.Translator(str(model_dir), device=cfg.get("device", "cpu"), compute_type=compute,
                                          intra_threads=threads // inter if threads else 0, inter_threads=inter)
        self.beam, self.forced_len, self.batch_tokens = cfg["beam"], cfg["forced_len"], cfg["batch_tokens"]
        self.tokens = 0

    def translate(self, lines: list[str]) -> list[str]:
        pieces = self.sp_src.encode(lines, out_type=str)
        limit = self.forced_len or max(len(p) for p in pieces) + 50
        results = self.ct2.translate_batch(pieces, max_batch_size=max(1, self.batch_tokens // self.beam),
                                           batch_type="tokens", beam_size=self.beam, length_penalty=0.6,
                                           max_decoding_length=limit, min_decoding_length=self.forced_len or 0)
        best = [result.hypotheses[0] for result in results]
        self.tokens += sum(len(h) for h in best)
        return [self.sp_tgt.decode_pieces(h) for h in best]


def make_translator(cfg: dict):
    from nmtkit.decoding.translate import TranslateOptions

    if cfg["engine"] == "hf":
        return MarianForced(cfg)
    if cfg["engine"] == "ct2direct":
        return CT2Direct(cfg)
    forced = cfg.get("forced_len")
    lengths = dict(min_len=forced, max_len_a=0.0, max_len_b=forced) if forced else {}
    options = TranslateOptions(beam_size=cfg["beam"], batch_tokens=cfg["batch_tokens"], device=cfg["device"],
                               dtype=cfg["dtype"], workers=cfg.get("workers") or 0, compile=bool(cfg.get("compile")),
                               engine="ctranslate2" if cfg["engine"] == "ct2" else "torch", **lengths)
    if cfg["engine"] == "ct2":
        from nmtkit.ctranslate2.engine import CT2Engine
        from nmtkit.decoding.translate import Translator

        return Translator(CT2Engine(cfg["ct2_model"], options), options)
    return torch_translator(cfg, options)


def measure(cfg: dict) -> dict:
    """One configuration, timed after loading and a warm-up; writes its translations to
    ``cfg["output"]`` (also called in-process by gpu_check.py)."""
    import torch

    lines = Path(cfg["input"]).read_text(encoding="utf-8").splitlines()[:cfg["max_sentences"] or None]
    start = time.perf_counter()
    translator = make_translator(cfg)
    load_s = time.perf_counter() - start
    counter = translator if cfg["engine"] in ("hf", "ct2direct") else Counting(translator)
    start = time.perf_counter()
    translator.translate(lines[:cfg["warmup"]])
    warmup_s = time.perf_counter() - start  # with --compile: the compile time included
    counter.tokens = 0
    if torch.cuda.is_available() and str(cfg.get("device", "cpu")).startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = translator.translate(lines)
    seconds = time.perf_counter() - start
    Path(cfg["output"]).write_text("".join(line + "\n" for line in outputs), encoding="utf-8")
    return {"load_s": round(load_s, 2), "warmup_s": round(warmup_s, 2), "decode_s": round(seconds, 4),
            "sentences": len(lines), "tgt_tokens": counter.tokens, "sent_s": round(len(lines) / seconds, 2),
            "tgt_tok_s": round(counter.tokens / seconds, 1), "self_peak_rss_mib": common.peak_rss_mib()}


def child(cfg: dict) -> None:
    from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory

    keep_freed_memory()  # as the nmtkit CLI does
    bound_kernel_caches()
    from nmtkit.runtime.console import NmtConsole
    from nmtkit.runtime.threads import configure_threads

    # N: N threads; 0: nmtkit's auto choice (translate --threads 0), as busy_machine.py measures it
    threads = configure_threads(cfg["threads"], NmtConsole(verbosity=-1), what="translating", option="--threads")
    print(json.dumps({**measure(cfg), "threads_used": threads}))


# -- the parent: the matrix of configurations -----------------------------------------------
def parse_configs(text: str) -> list[tuple[str, str, int, int]]:
    """(engine, dtype, beam, workers; 0 for the engine's default) per ``engine:dtype:beam[:wN]``."""
    out = []
    for item in filter(None, text.split(",")):
        engine, dtype, beam, *rest = item.split(":")
        workers = int(rest[0].removeprefix("w")) if rest else 0
        if workers and engine not in ("torch", "ct2direct"):
            raise SystemExit(f"{item}: :wN applies to torch and ct2direct only ({engine} searches one batch at a time)")
        out.append((engine, dtype, int(beam), workers))
    return out


def available(engine: str) -> bool:
    module = {"ct2": "ctranslate2", "ct2direct": "ctranslate2", "hf": "transformers"}.get(engine)
    if module is None:
        return True
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def export_for_ct2(model_dir: str, scratch: Path) -> Path:
    from nmtkit.ctranslate2.export import export_ctranslate2

    return export_ctranslate2(model_dir, scratch / "ct2")


def run_config(args, engine: str, dtype: str, beam: int, forced_len, scratch: Path, ct2_dir, src_path: Path,
               compile: bool = False, workers: int = 0) -> dict:
    tag = f"{engine}-{dtype}-b{beam}" + (f"-w{workers}" if workers else "") + (f"-forced{forced_len}" if forced_len else "")
    tag += "-compiled" if compile else ""
    cfg = {"engine": engine, "dtype": dtype, "beam": beam, "workers": workers, "forced_len": forced_len, "model": args.model,
           "ct2_model": str(ct2_dir) if ct2_dir else None, "input": str(src_path), "output": str(scratch / f"{tag}.txt"),
           "max_sentences": args.max_sentences, "warmup": args.warmup, "batch_tokens": args.batch_tokens,
           "threads": args.threads, "device": args.device, "compile": compile}
    argv = [common.python(), str(Path(__file__).resolve()), "--child", json.dumps(cfg)]
    load_before = common.load_average()
    done = common.run_child(argv, threads=args.threads)
    if done["returncode"] != 0:
        raise RuntimeError(f"{tag} failed:\n{done['stderr'][-3000:]}")
    result = common.last_json_line(done["stdout"])
    record = {"config": tag, "engine": engine, "dtype": dtype, "beam": beam, "workers": workers, "forced_len": forced_len,
              **result,
              "peak_rss_mib": done["peak_rss_mib"], "threads": args.threads, "load_before": load_before,
              "recompiles": done["stderr"].count("Recompiling function"),  # counted with TORCH_LOGS=recompiles
              "load_after": common.load_average(), "output": cfg["output"]}
    if args.keep_outputs:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cfg["output"], Path(args.out) / f"{tag}.txt")
    return record


def run_batch_tokens(data: Path) -> int:
    """decode.batch_tokens of the work directory's config.yaml (what `nmtkit run` used)."""
    import yaml

    path = data.parent / "config.yaml"
    if path.is_file():
        return int(((yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("decode") or {}).get("batch_tokens", 6000))
    return 6000


def add_bleu(record: dict, refs: list[str]) -> None:
    import sacrebleu

    hyps = Path(record["output"]).read_text(encoding="utf-8").splitlines()
    record["bleu"] = round(sacrebleu.corpus_bleu(hyps, [refs[:len(hyps)]]).score, 2)


def main(argv=None) -> list[dict]:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--configs", default=NATURAL, help=f"engine:dtype:beam list (default {NATURAL})")
    parser.add_argument("--forced-configs", default=FORCED, help=f"same, for the forced runs (default {FORCED})")
    parser.add_argument("--forced-len", type=int, default=-1,
                        help="pieces per hypothesis in the forced runs (-1: the mean reference length; 0: no forced runs)")
    parser.add_argument("--split", default="test", help="prepared split to translate")
    parser.add_argument("--max-sentences", type=int, default=0, help="translate the first N lines only (0: all)")
    parser.add_argument("--warmup", type=int, default=20, help="lines translated before timing")
    parser.add_argument("--batch-tokens", type=int, default=0,
                        help="source tokens x beam per batch (0: decode.batch_tokens of the run's config.yaml beside --data, else 6000)")
    parser.add_argument("--keep-outputs", action="store_true", help="copy translations to --out")
    common.add_peak_option(parser)
    args = parser.parse_args(argv)
    meta = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    data = Path(args.data)
    args.batch_tokens = args.batch_tokens or run_batch_tokens(data)
    src_path, ref_path = data / f"{args.split}.{meta['src_lang']}", data / f"{args.split}.{meta['tgt_lang']}"
    refs = ref_path.read_text(encoding="utf-8").splitlines()
    scratch = Path(tempfile.mkdtemp(prefix="nmtkit-bench-decode-"))
    records = []
    try:
        runs = [(c, None) for c in parse_configs(args.configs)]
        forced_len = args.forced_len
        if forced_len < 0:
            from nmtkit.data.vocab import Vocab

            vocab = Vocab(Path(args.model) / meta["spm"]["tgt"])
            pieces = [len(ids) for ids in vocab.encode_batch(refs[:args.max_sentences or None])]
            forced_len = round(sum(pieces) / len(pieces))
        if forced_len:
            runs += [(c, forced_len) for c in parse_configs(args.forced_configs)]
        needs_export = any(c[0].startswith("ct2") for c, _ in runs) and available("ct2")
        ct2_dir = export_for_ct2(args.model, scratch) if needs_export else None
        for (engine, dtype, beam, workers), forced in runs:
            if not available(engine):
                print(f"skipping {engine}: not installed", file=sys.stderr)
                continue
            record = run_config(args, engine, dtype, beam, forced, scratch, ct2_dir, src_path, workers=workers)
            if not forced:
                add_bleu(record, refs)
            records.append(record)
            print(json.dumps({k: v for k, v in record.items() if k != "output"}), file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for record in records:
        record.pop("output")
    add_ratios(records)
    add_mfu(records, meta, src_path, refs, args)
    common.write_results(Path(args.out), "decode_speed", records, [
        ("config", "configuration"), ("sent_s", "sent/s"), ("tgt_tok_s", "tgt tok/s"), ("bleu", "BLEU"),
        ("vs_torch_fp32", "x torch fp32"), ("peak_rss_mib", "peak RSS MiB"), ("model_gflops", "model GFLOP/s"),
        ("mfu_pct", "MFU %"), ("load_s", "load s"),
        ("decode_s", "decode s"), ("sentences", "sentences"), ("threads", "threads"), ("load_before", "load before")],
        "Decoding throughput",
        [f"Model {args.model}; {args.split} split of {args.data}; batches of {args.batch_tokens} source tokens x beam.",
         "Forced runs decode exactly forced_len pieces per hypothesis (HF: random weights, same dims)."])
    return records


def add_mfu(records: list[dict], meta: dict, src_path: Path, refs: list[str], args) -> None:
    """Approximate model GFLOP/s of each run and its share of the matmul peak of its dtype
    (float32 / bf16 runs only): the encoder over every source piece, plus one decoder step
    per output piece and EOS for each of the ``beam`` rows of a sentence."""
    from nmtkit.data.vocab import Vocab

    vocab = Vocab(Path(args.model) / meta["spm"]["src"])
    lines = src_path.read_text(encoding="utf-8").splitlines()[:args.max_sentences or None]
    src_pieces = sum(len(ids) for ids in vocab.encode_batch(lines))
    tgt_len = sum(len(ids) for ids in vocab.encode_batch(refs[:len(lines)])) / len(lines)
    flops = common.transformer_flops(meta["model"], len(vocab), src_pieces / len(lines), tgt_len)
    peaks = {}
    for record in records:
        work = src_pieces * flops["encoder_per_src_token"] + \
            (record["tgt_tokens"] + record["sentences"]) * record["beam"] * flops["decode_step_per_row"]
        record["model_gflops"] = round(work / record["decode_s"] / 1e9, 1)
        if record["dtype"] in ("float32", "bf16"):
            if record["dtype"] not in peaks:
                peaks[record["dtype"]] = common.matmul_peak(record["dtype"], args.threads, args.peak_seconds)["gflops"]
            record["mfu_pct"] = round(100 * record["model_gflops"] / peaks[record["dtype"]], 1)
            record["matmul_peak_seconds"] = args.peak_seconds


def add_ratios(records: list[dict]) -> None:
    """Speed relative to the torch float32 run of the same beam and kind (natural / forced)."""
    for record in records:
        base = next((r for r in records if r["engine"] == "torch" and r["dtype"] == "float32"
                     and r["beam"] == record["beam"] and r["forced_len"] == record["forced_len"]), None)
        record["vs_torch_fp32"] = round(record["sent_s"] / base["sent_s"], 2) if base else None


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # one configuration, run by main() in a fresh process
        child(json.loads(sys.argv[2]))
    else:
        main()
