"""``torch.compile`` (TorchInductor) where it can run: a C++ compiler on CPU, Triton on CUDA.

Every training batch has its own (sentences, length) shape, so the model is compiled with
``dynamic=True``: one graph with symbolic sizes instead of one per shape, and without "duck
sizing" (which gives two sizes that happen to be equal at the first call one symbol, then compiles
again at the first batch whose source and target lengths differ: 62 s more on an H200 for
transformer-base). Sizes 0 and 1 are still specialised, so a batch of a single sentence compiles
once more (benchmarks/compile_speed.py counts the graphs). Training compiles the model's ``features`` method (the chunked output layer
and loss after it stay eager); checkpoints keep saving the module itself, so their weight names
never carry a wrapper's ``_orig_mod.`` prefix.
"""
from __future__ import annotations

from typing import Optional

import torch


def missing_compiler(device: torch.device) -> Optional[str]:
    """Why inductor cannot compile for ``device`` on this machine, or None if it can."""
    if device.type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()  # the search inductor itself does: $CXX, else g++
        except Exception:  # InvalidCxxCompiler (or a torch whose private API moved): treat as absent
            return "inductor needs a C++ compiler on CPU and found none (install g++ or set CXX)"
        return None
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "inductor needs Triton on CUDA (pip install triton)"
    return f"inductor does not compile for {device.type} devices"


def maybe_compile(function, device: torch.device, console, setting: str):
    """``torch.compile(function, dynamic=True)`` (a module or a method), or ``function`` itself
    with one warning naming ``setting`` when no compiler is available (training still runs,
    uncompiled)."""
    reason = missing_compiler(device)
    if reason is not None:
        console.warn(f"{setting}: {reason}; running uncompiled")
        return function
    return compile_dynamic(function)


def compile_dynamic(function, backend="inductor"):
    """``torch.compile(function, dynamic=True)``, traced with every size its own symbol."""
    import torch.fx.experimental._config  # noqa: F401 (the duck-sizing switch)

    compiled = torch.compile(function, dynamic=True, backend=backend)

    def call(*args, **kwargs):
        # read when dynamo traces, i.e. on a call, so it is set around each call
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            return compiled(*args, **kwargs)

    return call


class CompiledDecoder:
    """A model for search whose ``decode_step`` is compiled; ``encode`` and ``init_state``,
    which run once per batch, stay as they are. Search sees the same contract."""

    def __init__(self, model) -> None:
        self.model = model
        self._compiled_step = compile_dynamic(model.decode_step)

    def decode_step(self, prev, enc, state, need_attn: bool = False):
        # search passes a column of its token history, whose stride grows every step; compiled
        # code is specialised on strides, so a contiguous copy avoids a recompile per step
        return self._compiled_step(prev.contiguous(), enc, state, need_attn)

    def __getattr__(self, name: str):  # encode, init_state, max_positions, ...: the model's own
        return getattr(self.model, name)


def compile_decoder(model, device: torch.device, console, setting: str = "--compile"):
    """``model`` with its decode step compiled (dynamic shapes: the batch shrinks and the
    self-attention cache grows every step), or ``model`` itself with one warning."""
    reason = missing_compiler(device)
    if reason is not None:
        console.warn(f"{setting}: {reason}; translating uncompiled")
        return model
    return CompiledDecoder(model)
