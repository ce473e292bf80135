"""Training on synthetic batches for gpu_check.py: one update exactly as ``Trainer._step`` makes it
(autocast, the chunked output layer and loss, fp16 loss scaling, clipping, the fused optimizer),
without data files, so that devices, dtypes and sizes can be compared on the same batches.

Parts: ``training`` (float32 on the device follows the CPU, bf16 and fp16 end near float32) and
``train_speed`` (tokens/s, MFU, peak memory of transformer-base and -big at WMT-like lengths).
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch

import common
from nmtkit.config import Config, ModelConfig, load_config
from nmtkit.data.batching import Batch, make_batches
from nmtkit.runtime.compiler import compile_dynamic
from nmtkit.runtime.device import autocast
from nmtkit.models.build import build_model
from nmtkit.specials import BOS, EOS, PAD
from nmtkit.training.loss import TrainingLoss, label_smoothed_loss
from nmtkit.training.optim import make_optimizer
from nmtkit.training.precision import LossScaler

DTYPES = {"float32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def wmt_lengths(n: int, seed: int, limit: int = 250) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths (pieces) shaped like WMT14 en-de under a 37k BPE: log-normal,
    median ~25, mean ~29, a tail to ``limit``; targets ~5% longer with their own spread."""
    rng = np.random.default_rng(seed)
    src = np.clip(np.rint(np.exp(rng.normal(3.2, 0.6, n))), 1, limit).astype(np.int64)
    tgt = np.clip(np.rint(src * np.exp(rng.normal(0.05, 0.15, n))), 1, limit - 1).astype(np.int64)
    return src, tgt


def synthetic_batches(src_lens, tgt_lens, max_tokens: int, vocab: int, count: int, device, seed: int,
                      copy: bool = False) -> list[Batch]:
    """``count`` batches cut by the trainer's own ``make_batches``, random ids (or, with ``copy``,
    targets equal to sources: a task whose loss falls), on ``device``."""
    if copy:
        tgt_lens = src_lens
    g = torch.Generator().manual_seed(seed)
    out = []
    for indices in make_batches(src_lens, tgt_lens, max_tokens, seed, 0)[:count]:
        s_len, t_len = src_lens[indices], tgt_lens[indices]
        src = torch.randint(4, vocab, (len(indices), int(s_len.max())), generator=g)
        src[torch.arange(src.size(1))[None] >= torch.from_numpy(s_len)[:, None]] = PAD  # (B, S)
        words = src if copy else torch.randint(4, vocab, (len(indices), int(t_len.max())), generator=g)
        tgt_out = torch.cat([words, torch.full((len(indices), 1), PAD)], 1)  # (B, T+1)
        tgt_out[torch.arange(len(indices)), torch.from_numpy(t_len)] = EOS
        tgt_out[torch.arange(tgt_out.size(1))[None] > torch.from_numpy(t_len)[:, None]] = PAD
        tgt_in = torch.cat([torch.full((len(indices), 1), BOS), tgt_out[:, :-1]], 1).masked_fill(tgt_out.eq(PAD), PAD)
        batch = Batch(src, src.ne(PAD), tgt_in.masked_fill(tgt_in.eq(EOS), PAD), tgt_out, int(t_len.sum() + len(t_len)))
        out.append(batch.to(device))
    return out


class WholeLogitsLoss(torch.nn.Module):
    """The output layer before chunking: [tokens, V] logits, then the loss (``chunked: false``)."""

    def __init__(self, model, smoothing: float) -> None:
        super().__init__()
        self.model, self.smoothing = model, smoothing

    def forward(self, src, src_mask, tgt_in, tgt_out):
        return label_smoothed_loss(self.model(src, src_mask, tgt_in), tgt_out, self.smoothing)


class Updates:
    """A model, its optimizer and loss scaler, making updates as ``Trainer._step`` does."""

    def __init__(self, model, device, dtype_name: str, lr: float = 1e-3, chunked: bool = True,
                 compiled: bool = False, smoothing: float = 0.1, clip: float = 0.0) -> None:
        self.model, self.device, self.dtype = model.to(device), device, DTYPES[dtype_name]
        if device.type == "cuda":  # TF32 only when asked for: float32 means float32
            torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
            torch.backends.cudnn.allow_tf32 = dtype_name == "tf32"
        features = compile_dynamic(model.features) if compiled else model.features
        self.objective = TrainingLoss(model, smoothing, features) if chunked else WholeLogitsLoss(model, smoothing)
        cfg = Config()
        self.optimizer = make_optimizer(model, cfg, device)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.scaler = LossScaler(self.dtype, device)
        self.clip = clip

    def step(self, batch: Batch):
        """One update; returns the summed loss (a tensor: no sync) or None when skipped."""
        self.model.train()
        with autocast(self.device, self.dtype):
            loss, _ = self.objective(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out)
        self.scaler.scaled(loss / batch.ntokens).backward()
        self.scaler.unscale(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        gnorm = torch.nn.utils.clip_grad_norm_(params, self.clip if self.clip > 0 else float("inf"))
        if not torch.isfinite(gnorm):  # the trainer's one sync per update, kept
            self.scaler.skip()
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.scaler.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach() / batch.ntokens


def loss_curve(cfg: ModelConfig, vocab: int, device, dtype_name: str, batches: list[Batch], steps: int) -> dict:
    """Per-token losses of ``steps`` updates from the seed-0 model, cycling over ``batches``."""
    torch.manual_seed(0)
    updates = Updates(build_model(cfg, vocab, vocab), device, dtype_name)
    losses, skipped = [], 0
    for i in range(steps):
        loss = updates.step(batches[i % len(batches)])
        skipped += loss is None
        losses.append(None if loss is None else float(loss))
    return {"losses": losses, "skipped": skipped, "loss_scale": updates.scaler.scale}


def training_part(settings: dict) -> dict:
    """float32 on the device against the CPU (TF32 off), then bf16 and fp16 on the device."""
    device = torch.device(settings["device"])
    tiny = settings["tiny"]
    vocab, steps = (64, 8) if tiny else (1000, 20)
    cfg = ModelConfig(d_model=32 if tiny else 256, ffn_dim=64 if tiny else 1024, heads=2 if tiny else 4,
                      encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=256)
    src_lens, _ = wmt_lengths(400, seed=1, limit=60)
    cpu_batches = synthetic_batches(src_lens, src_lens, 400 if tiny else 2000, vocab, 4, torch.device("cpu"), 1,
                                    copy=True)
    reference = loss_curve(cfg, vocab, torch.device("cpu"), "float32", cpu_batches, steps)
    batches = [b.to(device) for b in cpu_batches]
    runs = {dtype: loss_curve(cfg, vocab, device, dtype, batches, steps) for dtype in ("float32", "bf16", "fp16")}
    ref, f32 = reference["losses"], runs["float32"]["losses"]
    rel = max(abs(a - b) / abs(a) for a, b in zip(ref, f32))
    out = {"steps": steps, "cpu_float32": ref, "max_rel_diff_vs_cpu": rel, "tolerance": 1e-3,
           "same_device": device.type == "cpu"}
    ends = {}
    for dtype in ("float32", "bf16", "fp16"):
        finite = [x for x in runs[dtype]["losses"] if x is not None]
        ends[dtype] = float(np.mean(finite[-3:])) if finite else float("nan")
        out[dtype] = {**runs[dtype], "end_loss": ends[dtype],
                      "end_rel_diff_vs_float32": abs(ends[dtype] - ends["float32"]) / ends["float32"]}
    nonfinite = {d: sum(x is not None and not np.isfinite(x) for x in runs[d]["losses"]) for d in runs}
    out["passed"] = bool(rel <= out["tolerance"] and all(v == 0 for v in nonfinite.values())
                         and runs["bf16"]["skipped"] == 0 and runs["fp16"]["skipped"] <= 2
                         and out["bf16"]["end_rel_diff_vs_float32"] <= 0.05
                         and out["fp16"]["end_rel_diff_vs_float32"] <= 0.05)
    out["criteria"] = ("float32 losses within 1e-3 relative of the CPU's at every update; bf16 no skipped "
                       "update, fp16 at most 2 (the scaler's first search); both end (mean of the last 3) "
                       "within 5% of float32")
    return out


# -- training speed ----------------------------------------------------------------------------
def recipe_model(name: str) -> tuple[ModelConfig, int, int]:
    """The model, vocabulary size and micro-batch (max_tokens) of a recipe under recipes/."""
    cfg = load_config(str(common.REPO / "recipes" / f"{name}.yaml"))
    return cfg.model, cfg.vocab.size, cfg.train.max_tokens


def tiny_model_of(cfg: ModelConfig) -> ModelConfig:
    import dataclasses

    return dataclasses.replace(cfg, preset="", d_model=32, ffn_dim=64, heads=2, encoder_layers=1, decoder_layers=1)


def wmt_model(size: str, tiny: bool) -> tuple[ModelConfig, int, int]:
    """transformer-``size`` (base / big) of the WMT recipes: model, vocabulary, micro-batch; with
    ``tiny``, the same model shrunk for a CPU (64 pieces, 300-token batches)."""
    cfg, vocab, max_tokens = recipe_model(f"wmt14-en-de-transformer-{size}")
    return (tiny_model_of(cfg), 64, 300) if tiny else (cfg, vocab, max_tokens)


def measure(cfg: ModelConfig, vocab: int, device, dtype: str, max_tokens: int, steps: int, warmup: int,
            chunked: bool = True, compiled: bool = False) -> dict:
    """Throughput of ``steps`` timed updates after ``warmup`` (all together): target tokens/s
    (EOS included, padding not), model TFLOP/s, peak device memory."""
    torch.manual_seed(0)
    src_lens, tgt_lens = wmt_lengths(150_000, seed=2)  # ~4.5M tokens: 16 batches even of the largest tried
    batches = synthetic_batches(src_lens, tgt_lens, max_tokens, vocab, 16, device, 2)  # a sample of the lengths
    updates = Updates(build_model(cfg, vocab, vocab), device, dtype, lr=1e-4, chunked=chunked, compiled=compiled)
    start_compile = time.perf_counter()
    for i in range(warmup):
        updates.step(batches[i % len(batches)])
        if compiled:  # a compile's progress in the log: a part cut short still says how far it got
            common.synchronize(device)
            print(f"gpu_check: compiled warm-up update {i + 1}/{warmup} at {time.perf_counter() - start_compile:.1f} s",
                  file=sys.stderr, flush=True)
    common.synchronize(device)
    warmup_s = time.perf_counter() - start_compile
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    chosen = [batches[i % len(batches)] for i in range(steps)]
    tokens = sum(batch.ntokens for batch in chosen)
    src_tokens = sum(int(batch.src_mask.sum()) for batch in chosen)  # counted before the clock: no sync in it
    common.synchronize(device)
    start = time.perf_counter()
    for batch in chosen:
        updates.step(batch)
    common.synchronize(device)
    seconds = time.perf_counter() - start
    sentences = sum(batch.src.size(0) for batch in chosen)
    flops = common.transformer_flops(vars(cfg), vocab, src_tokens / sentences, tokens / sentences)
    record = {"tgt_tok_s": round(tokens / seconds, 1), "step_s": round(seconds / steps, 4),
              "warmup_s": round(warmup_s, 2), "model_tflops": round(tokens / seconds * flops["train_per_tgt_token"] / 1e12, 3),
              "mean_tgt_len": round(tokens / sentences, 1)}
    if device.type == "cuda":
        record["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2)
    del updates, batches
    return record


def largest_batch(cfg, vocab, device, dtype, start_tokens: int, most: int, deadline: float) -> dict:
    """Double the micro-batch from ``start_tokens`` until out of memory, ``most`` times
    ``start_tokens`` or the deadline; the throughput at the largest that ran."""
    best, tokens = None, start_tokens * 2
    while tokens <= most * start_tokens and time.time() < deadline:
        try:
            best = {"max_tokens": tokens, **measure(cfg, vocab, device, dtype, tokens, steps=3, warmup=1)}
        except torch.cuda.OutOfMemoryError:
            break
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        tokens *= 2
    return best or {"max_tokens": None, "note": "no larger batch fitted in time or memory"}


# train_speed's runs by name, in their default order: compiled second, as it needs the most time
# and run 2 on an H100 never reached it in last place
TRAIN_RUNS = {f"{size}-{dtype}" + "".join(f"-{k}" for k in options): (size, dtype, options) for size, dtype, options in (
    ("base", "bf16", {}), ("base", "bf16", {"compiled": True}), ("big", "bf16", {}), ("base", "fp16", {}),
    ("base", "tf32", {}), ("base", "float32", {}), ("base", "bf16", {"unchunked": True}),
    ("base", "bf16", {"largest": True}), ("big", "bf16", {"largest": True}))}


def train_speed_part(settings: dict) -> dict:
    """Transformer-base and -big of the WMT recipes: dtypes, compile, chunked output, batch size."""
    device = torch.device(settings["device"])
    tiny, deadline = settings["tiny"], settings["deadline"]
    steps, warmup = (2, 1) if tiny else (16, 16)  # warm-up and timing each pass over the 16 batches: steady state
    peak = common.cuda_matmul_peak("bf16") if device.type == "cuda" else {"gflops": None}
    records, margin = [], 5 if tiny else 20
    for name in settings.get("train_runs") or TRAIN_RUNS:  # chosen ones may repeat: run-to-run noise
        size, dtype, options = TRAIN_RUNS[name]
        if options.get("compiled") and (tiny or time.time() > deadline - 75):
            why = "the tiny mode (inductor compiles for minutes on 2 CPU cores)" if tiny else "under 75 s left"
            records.append({"run": name, "status": f"skipped: {why}"})
            continue
        if time.time() > deadline - margin:
            records.append({"run": name, "status": "not reached: the part's time limit"})
            continue
        cfg, vocab, max_tokens = wmt_model(size, tiny)
        try:
            if options.get("largest"):
                result = largest_batch(cfg, vocab, device, dtype, max_tokens, 4 if tiny else 16, deadline - margin)
            else:
                result = {"max_tokens": max_tokens, **measure(cfg, vocab, device, dtype, max_tokens, steps, warmup,
                                                              chunked=not options.get("unchunked"),
                                                              compiled=options.get("compiled", False))}
        except Exception as err:  # one configuration failing (compile, OOM) leaves the others
            result = {"status": "error", "cause": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
        if peak["gflops"] and result.get("model_tflops"):
            result["mfu_pct"] = round(100 * result["model_tflops"] * 1000 / peak["gflops"], 1)
        records.append({"run": name, "model": size, "dtype": dtype, **result})
        common.save_partial(settings["partial"], {"records": records})  # if cut short
    return {"bf16_matmul_peak_gflops": peak["gflops"], "records": records,
            "targets": {"base_bf16_mfu_pct": 40, "big_bf16_mfu_pct": 45}}


def profile_part(settings: dict) -> dict:
    """Where a transformer-base bf16 update at the recipe's micro-batch spends its time: the
    share of the wall time the device is busy (the rest is the host launching and waiting), the
    kernels launched per update, and the operations that take the most device and host time."""
    from torch.profiler import ProfilerActivity, profile

    device, tiny = torch.device(settings["device"]), settings["tiny"]
    cfg, vocab, max_tokens = wmt_model("base", tiny)
    src_lens, tgt_lens = wmt_lengths(20_000, seed=2)
    # tiny: 4, as the profiler's handling of its events (thousands per update) is most of the part on a CPU
    batches = synthetic_batches(src_lens, tgt_lens, max_tokens, vocab, 4 if tiny else 8, device, 2)
    torch.manual_seed(0)
    updates = Updates(build_model(cfg, vocab, vocab), device, "bf16", lr=1e-4)
    for batch in batches:  # warm-up over every shape profiled
        updates.step(batch)
    common.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for batch in batches:
            updates.step(batch)
        common.synchronize(device)
        wall_us = 1e6 * (time.perf_counter() - start)
    events = prof.key_averages()

    def device_us(event) -> float:
        return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)))

    kernels = [e for e in events if device_us(e) > 0 and e.device_type.name == "CUDA"]
    busy_us = sum(device_us(e) for e in kernels)

    def top(key, count: int = 15) -> list:
        chosen = sorted(events, key=key, reverse=True)[:count]
        return [{"name": e.key[:90], "calls_per_update": round(e.count / len(batches), 1),
                 "ms_per_update": round(key(e) / 1000 / len(batches), 3)} for e in chosen if key(e) > 0]

    return {"model": "base" if not tiny else "tiny", "dtype": "bf16", "max_tokens": max_tokens,
            "updates": len(batches), "wall_ms_per_update": round(wall_us / 1000 / len(batches), 2),
            "device_busy_pct": round(100 * busy_us / wall_us, 1) if kernels else None,
            "kernels_per_update": round(sum(e.count for e in kernels) / len(batches)),
            "top_device": top(device_us), "top_host": top(lambda e: float(e.self_cpu_time_total))}
