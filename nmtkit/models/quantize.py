"""Dynamic int8 quantisation for CPU inference (``nmtkit translate --dtype int8``).

Every ``nn.Linear`` gets int8 weights (per-tensor scale) and quantises its input per batch
on the fly; embeddings, norms and softmax stay float32. On the quickstart model, beam 4 on
one CPU thread ran 1.65x faster than float32 at +0.1 BLEU (benchmarks/RESULTS.md).
"""
from __future__ import annotations

import warnings

from torch import nn

from nmtkit.errors import ConfigError


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of float32 ``model`` whose Linear layers run in int8 (CPU only)."""
    try:
        import torch
        from torch.ao.quantization import quantize_dynamic
    except ImportError:  # torch.ao.quantization is deprecated in favour of torchao
        raise ConfigError("--dtype int8 needs torch.ao.quantization, which this torch lacks; "
                          "use --engine ctranslate2 --dtype int8") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notices are not the user's concern
        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
