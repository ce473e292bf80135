"""int8 Linear layers for CPU translation (``nmtkit translate --dtype int8``).

Each ``nn.Linear`` gets int8 weights, one scale per output feature, and quantises its input
row by row, each row (one token of one hypothesis) with a scale of its own. Products sum in
int32, exactly, so a row's result depends on that row alone. PyTorch's dynamic quantisation,
which nmtkit used before, takes one activation scale per batch, and a line's translation changed
with the lines batched with it. What batching can still change (float32 attention over other
padding, carried into a token by rounding), the speed and the BLEU: benchmarks/RESULTS.md,
"int8 scaled per row"; where that padding's difference comes from: "Attention that ignores the
padding". Embeddings, norms, attention and softmax stay float32, and so do LSTM/GRU cells.
Where fbgemm's kernels are missing (ARM, x86 without AVX2), ``quantize_int8`` falls back to
PyTorch's dynamic quantisation, per-batch scale and all.

How: fbgemm's int8 product takes one input scale, so each row is divided by its largest
magnitude, quantised with the scale 1/63 (7 bits: x86's 8-bit kernels sum pairs of products
in 16 bits, which full 8-bit inputs can overflow), multiplied, and scaled back by the same
magnitude before the bias is added.
"""
from __future__ import annotations

import copy
import functools
import warnings

import torch
from torch import Tensor, nn

from nmtkit.errors import ConfigError
from nmtkit.models.prepack import children_of_type

STEPS = 63  # quantised input levels each side of zero (7 bits)
ZERO_POINT = 64  # unsigned 8-bit storage: 1 .. 127 after scaling


def _int8_product(rows: Tensor, packed) -> Tensor:
    """``rows [N, in] @ weight.T`` for float32 rows already within [-1, 1] (no bias)."""
    return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(rows, 1.0 / STEPS, ZERO_POINT, packed)


def _pack(weight: Tensor):
    """fbgemm's packed int8 form of a float32 ``[out, in]`` weight, a scale per output row."""
    scales = (weight.abs().amax(1).double() / 127).clamp_min(1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantised tensors' deprecation notice is not the user's concern
        qweight = torch.quantize_per_channel(weight, scales, torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(qweight, None)


class Int8Linear(nn.Module):
    """``nn.Linear``'s inference forward, ``x [..., in] -> [..., out]``, in int8 (CPU only)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        self.packed = _pack(weight.contiguous())
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()

    def forward(self, x: Tensor) -> Tensor:
        if x.size(-1) != self.in_features:
            raise ValueError(f"input of width {x.size(-1)} for a Linear layer of {self.in_features} inputs")
        rows = x.reshape(-1, self.in_features).float()
        if rows.size(0) == 0:
            return x.new_zeros(*x.shape[:-1], self.out_features, dtype=torch.float32)
        # each row's largest magnitude [N, 1]: two reductions make no [N, in] temporary as abs()
        # would (vector_norm(ord=inf) was ~10x slower on a Zen 3, in a throwaway timing)
        peak = torch.maximum(rows.amax(1, keepdim=True), rows.amin(1, keepdim=True).neg_()).clamp_min_(1e-30)
        out = _int8_product(rows * peak.reciprocal(), self.packed)
        # in place: a fresh [N, out] tensor took ~3x as long at 280 x 8,000 (page faults; a throwaway timing)
        out = out.mul_(peak) if self.bias is None else torch.addcmul(self.bias, out, peak, out=out)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


@functools.lru_cache(maxsize=None)
def int8_available() -> bool:
    """Whether this torch and CPU run the row-by-row int8 product, checked on one tiny layer
    against float32 (a torch without fbgemm's kernels, or one that dropped quantised tensors,
    says no)."""
    gen = torch.Generator().manual_seed(0)
    linear = nn.Linear(16, 24, device="meta").to_empty(device="cpu")  # no draw from the global stream
    with torch.no_grad():
        linear.weight.copy_(torch.randn(24, 16, generator=gen) / 4)
        linear.bias.copy_(torch.randn(24, generator=gen))
        x = torch.randn(3, 5, 16, generator=gen)
        try:
            got = Int8Linear(linear)(x)
        except (RuntimeError, AttributeError, NotImplementedError):
            return False
        return got.shape == (3, 5, 24) and bool(torch.allclose(got, linear(x), atol=0.1, rtol=0.05))


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of float32 ``model`` on the CPU whose Linear layers run in int8 (row by row where
    ``int8_available``, else with PyTorch's per-batch dynamic quantisation)."""
    if not int8_available():
        return _quantize_dynamic(model)
    model = copy.deepcopy(model)
    for parent, name, child in children_of_type(model, nn.Linear):
        setattr(parent, name, Int8Linear(child))
    return model


def _quantize_dynamic(model: nn.Module) -> nn.Module:
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError:  # torch.ao.quantization is deprecated in favour of torchao
        raise ConfigError("--dtype int8 needs fbgemm's int8 kernels or torch.ao.quantization, which this torch "
                          "or CPU lacks; use --engine ctranslate2 --dtype int8") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notices are not the user's concern
        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
