"""Where and in which precision to run: one place for device and dtype choices."""
from __future__ import annotations

import functools

import torch

from nmtkit.errors import ConfigError
from nmtkit.limits import DEVICE_NAME


def resolve_device(name: str = "auto") -> torch.device:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` as a torch device. Other torch device types
    (mps, meta, xla, ...) are refused here: nothing else is tested, and ``meta`` computes nothing."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not DEVICE_NAME.fullmatch(name):
        raise ConfigError(f"unknown device {name!r} (use auto, cpu, cuda or cuda:N)")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"device {name!r} requested but there are only {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "cuda":
        shape_free_attention()
    return device


@functools.lru_cache(maxsize=1)
def shape_free_attention() -> None:
    """Keep SDPA off cuDNN's attention kernels. cuDNN sets up every new batch shape once (a bf16
    attention call on an unseen shape took 115 ms on an H100, against 0.4 ms for flash), and
    translation batches change shape all the time: with it on, bf16 training of transformer-base
    ran at 37.6k target tokens/s against 254k with it off, and bf16 beam search 6.7x slower
    (benchmarks/RESULTS.md, GPU). Flash and memory-efficient kernels need no per-shape set-up."""
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


@functools.lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    """True on CPUs with AMX or AVX-512 bf16 units, where bf16 matmuls beat float32."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            flags = next((line for line in handle if line.startswith("flags")), "")
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def resolve_dtype(name: str, device: torch.device, cpu_fp16: bool = False) -> torch.dtype:
    """The autocast dtype; ``auto`` = bf16 on GPUs that have it and on CPUs with AMX/AVX-512
    bf16, float32 otherwise. Weights and optimizer state always stay float32. fp16 is for
    GPUs; ``cpu_fp16`` lets training use it on CPU too (slow, but the same loss scaling)."""
    if name == "float32":
        return torch.float32
    if name == "fp16":
        if device.type != "cuda" and not cpu_fp16:
            raise ConfigError("fp16 needs a CUDA device (use bf16 on CPU)")
        return torch.float16
    if name == "bf16":
        return torch.bfloat16
    if name != "auto":
        raise ConfigError(f"unknown dtype {name!r} (use auto, float32, bf16 or fp16)")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


@functools.lru_cache(maxsize=None)
def autocast_runs(module_class: type, dtype: torch.dtype, training: bool) -> bool:
    """Whether ``module_class`` (nn.LSTM, nn.GRU, nn.RNN) runs under CPU autocast to ``dtype``,
    in training or inference mode: one tiny call. PyTorch hands an autocast LSTM to oneDNN,
    which lacks bf16 and fp16 LSTM kernels on some CPUs (a Zen 3) and raises there. The probe's
    random weights come from a forked generator: training's random stream (and exact resume)
    is untouched."""
    with torch.random.fork_rng(devices=[]):
        probe = module_class(4, 4, batch_first=True).train(training)
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            probe(torch.zeros(1, 2, 4))
    except RuntimeError:
        return False
    return True


def autocast(device: torch.device, dtype: torch.dtype):
    """An autocast context (a no-op for float32)."""
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype != torch.float32)
