"""Linear layers with their weights laid out once for oneDNN, for translation on a CPU.

PyTorch's ``nn.Linear`` on a CPU hands float32 products to MKL and bf16 ones to oneDNN, which
re-lays out the weight for its kernels on every call. A translation's weights never change,
so ``prepack_linears`` swaps each Linear for a ``PackedLinear`` that holds its weight in
oneDNN's blocked layout, made once, and calls oneDNN's matmul directly. Results match
``nn.Linear`` to rounding (a different order of summation), and each row's result does not
depend on the other rows of the batch, which MKL's float32 path does not promise for batches of
one to a few rows. Training never sees these layers: they are made only for translation
(``TorchEngine``); ``NMTKIT_PREPACK=0`` keeps PyTorch's own Linear (for comparisons).
Speed: benchmarks/RESULTS.md, "Packed Linear weights".
"""
from __future__ import annotations

import os
from typing import Optional

import torch
from torch import Tensor, nn


def packing_available(dtype: torch.dtype) -> bool:
    """Whether this torch and CPU run oneDNN's packed matmul in ``dtype`` (float32 or bf16)."""
    if os.environ.get("NMTKIT_PREPACK", "1") == "0" or dtype not in (torch.float32, torch.bfloat16):
        return False
    ops = getattr(torch.ops, "mkldnn", None)
    if not torch.backends.mkldnn.is_available() or not all(
            hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise")):
        return False
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    return _probe(dtype)


def _probe(dtype: torch.dtype) -> bool:
    """One tiny product through the packed path, checked against ``nn.functional.linear``: a
    torch build or CPU whose oneDNN lacks the kernel keeps PyTorch's Linear instead of failing
    mid-translation."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(24, 16, generator=gen).to(dtype)
    bias, x = torch.randn(24, generator=gen).to(dtype), torch.randn(3, 5, 16, generator=gen).to(dtype)
    try:
        with torch.inference_mode():
            got = _packed_linear(x, torch.ops.mkldnn._reorder_linear_weight(weight, None), bias)
    except RuntimeError:
        return False
    want = nn.functional.linear(x.float(), weight.float(), bias.float())
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    return got.shape == want.shape and bool(torch.allclose(got.float(), want, atol=tolerance, rtol=tolerance))


def _packed_linear(x: Tensor, packed: Tensor, bias: Optional[Tensor]) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """``nn.Linear``'s inference forward, ``x [..., in] -> [..., out]``, from a weight reordered
    once for oneDNN. Nothing to train or save: the packed weight and the bias are plain
    attributes. A packed layout is one dtype's and the CPU's, so converting the module to
    another (``.to(dtype)``, ``.cuda()``) is refused rather than left to corrupt it."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.dtype, self.device = weight.dtype, weight.device
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: Tensor) -> Tensor:
        return _packed_linear(x, self.packed, self.bias)

    def _apply(self, fn, recurse=True):
        after = fn(torch.empty(0, dtype=self.dtype, device=self.device))
        if (after.dtype, after.device) != (self.dtype, self.device):
            raise RuntimeError(f"a Linear layer packed for {self.dtype} on {self.device} cannot become "
                               f"{after.dtype} on {after.device}: load the model again")
        return self

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def prepack_linears(model: nn.Module, dtype: torch.dtype) -> int:
    """Replace, in place, every ``nn.Linear`` of ``model`` (on the CPU, weights already in
    ``dtype``) by a ``PackedLinear``; the number replaced, 0 where packing is not available.
    Tied weights (an output layer sharing the embedding) are copied into the packed layout;
    the embedding keeps its own."""
    if not packing_available(dtype):
        return 0
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear and child.weight.device.type == "cpu" and child.weight.dtype == dtype]
    with torch.no_grad():
        for parent, name, child in swaps:
            setattr(parent, name, PackedLinear(child))
    return len(swaps)
