"""Which scaled-dot-product-attention kernel each Transformer variant runs on CUDA (gpu_check.py's
``kernels`` part). Inside ``torch.nn.attention.sdpa_kernel([backend])`` SDPA may use only that
backend and raises when it cannot, so a step that completes there is proof the backend serves
every attention call of the step. Cases: a training step (forward + backward) on a batch without
padding, one with padding, and greedy decoding of a padded batch; bf16 autocast throughout.
"""
from __future__ import annotations

import statistics
import time

import torch

import common
from nmtkit.config import ModelConfig
from nmtkit.decoding.options import SearchSettings
from nmtkit.decoding.search import greedy_search
from nmtkit.runtime.device import autocast
from nmtkit.models.build import build_model
from nmtkit.specials import BOS, PAD
from nmtkit.training.loss import TrainingLoss

VARIANTS = {"paper": {}, "pre-norm": {"pre_norm": True}, "rope": {"positions": "rope"},
            "alibi": {"positions": "alibi"}, "rmsnorm-swiglu": {"norm": "rmsnorm", "ffn": "swiglu"},
            "moe": {"moe_experts": 4, "moe_top_k": 2}}
VOCAB = 1000


def backend_sets() -> dict:
    from torch.nn.attention import SDPBackend

    return {"flash": [SDPBackend.FLASH_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
            "flash+efficient": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
            "math": [SDPBackend.MATH]}


def batch(device, padded: bool, rows: int = 32, length: int = 40):
    """src, src_mask, tgt_in, tgt_out [rows, length]; with ``padded`` rows of lengths 20..length."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB, (rows, length), generator=g)
    tgt = torch.randint(4, VOCAB, (rows, length), generator=g)
    if padded:
        lengths = torch.randint(length // 2, length + 1, (rows, 1), generator=g)
        beyond = torch.arange(length)[None] >= lengths  # (rows, length)
        src, tgt = src.masked_fill(beyond, PAD), tgt.masked_fill(beyond, PAD)
    tgt_in = torch.cat([torch.full((rows, 1), BOS), tgt[:, :-1]], 1).masked_fill(tgt.eq(PAD), PAD)
    return [t.to(device) for t in (src, src.ne(PAD), tgt_in, tgt)]


def case_runner(model, case: str, device):
    """A function running one instance of ``case`` (train-unpadded / train-padded / decode-padded)."""
    tensors = batch(device, padded=case != "train-unpadded")
    objective = TrainingLoss(model, 0.1)

    def train_step():
        model.train()
        with autocast(device, torch.bfloat16):
            loss, _ = objective(*tensors)
        loss.backward()
        model.zero_grad(set_to_none=True)

    def decode():
        model.eval()
        with torch.inference_mode(), autocast(device, torch.bfloat16):
            greedy_search(model, tensors[0], tensors[1], SearchSettings(min_len=8, max_len_a=0.0, max_len_b=8))

    return decode if case.startswith("decode") else train_step


def timed(function, device, repeats: int = 3) -> float:
    """Median milliseconds of ``repeats`` runs after one warm-up (the device drained before and
    after each: CUDA kernels run after the call returns)."""
    function()
    times = []
    for _ in range(repeats):
        common.synchronize(device)
        start = time.perf_counter()
        function()
        common.synchronize(device)
        times.append(1000 * (time.perf_counter() - start))
    return round(statistics.median(times), 2)


def probe(model, case: str, device) -> dict:
    """Per backend set: the median ms of ``case`` restricted to it, or the error that shows it cannot."""
    from torch.nn.attention import sdpa_kernel

    run = case_runner(model, case, device)
    out = {"default_ms": timed(run, device)}
    for name, backends in backend_sets().items():
        try:
            with sdpa_kernel(backends):
                out[f"{name}_ms"] = timed(run, device)
        except RuntimeError as err:
            out[f"{name}_ms"] = None
            out[f"{name}_error"] = str(err).strip().splitlines()[0][:200]
    return out


def new_shape_cost(device, tiny: bool) -> dict:
    """Per backend: milliseconds of SDPA forward + backward (bf16, causal) on a shape it has not
    seen, and again on the same shape. Translation batches change shape at every step, so a
    backend that sets up per shape (cuDNN builds a graph) pays its first-call cost all the time."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, dim = (2, 64) if tiny else (8, 64)
    shapes = [(24 + i, 37 + 3 * i) for i in range(4)]  # (rows, length), none seen before
    out = {}
    for name in ("cudnn", "flash", "efficient"):
        backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]
        first, again = [], []
        try:
            with sdpa_kernel([backend]):
                for rows, length in shapes:
                    q, k, v = (torch.randn(rows + len(name), heads, length, dim, device=device, dtype=torch.bfloat16,
                                           requires_grad=True) for _ in range(3))  # rows differ per backend too
                    for times in (first, again):
                        common.synchronize(device)
                        start = time.perf_counter()
                        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
                        common.synchronize(device)
                        times.append(1000 * (time.perf_counter() - start))
        except RuntimeError as err:
            out[name] = {"error": str(err).strip().splitlines()[0][:200]}
            continue
        out[name] = {"first_call_ms": round(statistics.median(first), 2),
                     "seen_shape_ms": round(statistics.median(again), 2)}
    return out


def kernels(settings: dict) -> dict:
    device = torch.device(settings["device"])
    tiny = settings["tiny"]
    shape_cost = new_shape_cost(device, tiny)
    d, heads = (128, 2) if tiny else (512, 8)  # head size 64, as transformer-base
    records = []
    for name, variant in VARIANTS.items():
        torch.manual_seed(0)
        cfg = ModelConfig(d_model=d, ffn_dim=4 * d, heads=heads, encoder_layers=2, decoder_layers=2, dropout=0.0,
                          max_positions=256, **variant)
        model = build_model(cfg, VOCAB, VOCAB).to(device)
        for case in ("train-unpadded", "train-padded", "decode-padded"):
            record = {"variant": name, "case": case, **probe(model, case, device)}
            fused = record.get("flash+efficient_ms")
            record["fused"] = fused is not None
            if fused and record.get("math_ms"):
                record["math_over_fused"] = round(record["math_ms"] / fused, 2)
            records.append(record)
    paper = [r for r in records if r["variant"] == "paper"]
    return {"records": records, "new_shape_cost": shape_cost,
            "cudnn_attention_enabled": torch.backends.cuda.cudnn_sdp_enabled(),
            "paper_on_fused_kernels": all(r["fused"] for r in paper),
            "paper_unpadded_training_on_flash": next(r["flash_ms"] is not None for r in paper
                                                     if r["case"] == "train-unpadded"),
            "math_fallbacks": sorted({f"{r['variant']} {r['case']}" for r in records if not r["fused"]}),
            "passed": all(r["fused"] for r in paper)}
