"""Linear layers with their weights laid out once for oneDNN, for translation on a CPU.

PyTorch's ``nn.Linear`` on a CPU hands float32 products to MKL and bf16 ones to oneDNN, which
re-lays out the weight for its kernels on every call. A translation's weights never change,
so ``prepack_linears`` swaps each Linear for a ``PackedLinear`` that holds its weight in
oneDNN's blocked layout, made once, and calls oneDNN's matmul directly. Results match
``nn.Linear`` to rounding (a different order of summation), and each row's result does not
depend on the other rows of the batch, which MKL's float32 path does not promise for batches of
one to a few rows. Only translation packs (``TorchEngine``, ``nmtkit attention``); training and
its dev BLEU use PyTorch's Linear. ``NMTKIT_PREPACK=0`` keeps PyTorch's Linear everywhere.
Speed: benchmarks/RESULTS.md, "Packed Linear weights for CPU translation".
"""
from __future__ import annotations

import functools
import os
from typing import Optional

import torch
from torch import Tensor, nn


def packing_wanted() -> bool:
    """False where the user turned packing off (``NMTKIT_PREPACK`` 0, false, off or no)."""
    return os.environ.get("NMTKIT_PREPACK", "1").strip().lower() not in ("0", "false", "off", "no")


def packing_available(dtype: torch.dtype) -> bool:
    """Whether packing is wanted and this torch and CPU run oneDNN's packed matmul in ``dtype``
    (float32 or bf16)."""
    return packing_wanted() and _supported(dtype)


@functools.lru_cache(maxsize=None)
def _supported(dtype: torch.dtype) -> bool:
    if dtype not in (torch.float32, torch.bfloat16):
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
    once for oneDNN. The packed weight is not a parameter (nothing here trains), but the module
    still reads and saves like a Linear: ``weight`` gives the plain matrix back (exactly),
    ``state_dict`` holds ``weight`` and ``bias``, and ``.to(dtype or device)`` repacks, or keeps
    the plain matrix where oneDNN cannot pack (a GPU, fp16)."""

    def __init__(self, linear: nn.Linear, tied: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # a weight shared with another module (an embedding) is that module's parameter: kept by
        # reference, outside this module's parameters, so saving and unpacking keep the tie
        self._tied = (linear.weight,) if tied else ()
        self._store(linear.weight.detach(), None if linear.bias is None else linear.bias.detach().clone())

    def _store(self, weight: Tensor, bias: Optional[Tensor]) -> None:
        self.bias = bias
        pack = weight.device.type == "cpu" and packing_available(weight.dtype)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None) if pack else None
        self.plain = None if pack else weight

    def _values(self) -> Tensor:
        """The plain matrix this layer multiplies by (unpacked exactly)."""
        return self.plain if self.packed is None else self.packed.to_dense()

    @property
    def weight(self) -> Tensor:
        return self._tied[0] if self._tied else self._values()

    def forward(self, x: Tensor) -> Tensor:
        if self.packed is None:
            return nn.functional.linear(x, self.plain, self.bias)
        return _packed_linear(x, self.packed, self.bias)

    def to_linear(self) -> nn.Linear:
        """The plain ``nn.Linear`` again (same values, dtype and device)."""
        weight = self.weight
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            if self._tied:
                linear.weight = self._tied[0]
            else:
                linear.weight.copy_(weight)
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear

    def _apply(self, fn, recurse=True):
        # a tied weight is converted by the module that owns it; this layer repacks from the
        # packed values, which are the same
        self._store(fn(self._values()), None if self.bias is None else fn(self.bias))
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.weight
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def children_of_type(model: nn.Module, kind: type) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute name, child) for every module of exactly type ``kind`` in ``model``."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child) is kind]


def prepack_linears(model: nn.Module, dtype: torch.dtype) -> int:
    """Replace, in place, every ``nn.Linear`` of ``model`` (on the CPU, weights already in
    ``dtype``) by a ``PackedLinear``; the number replaced, 0 where packing is not available.
    Tied weights (an output layer sharing the embedding) are copied into the packed layout;
    the embedding keeps its own."""
    if not packing_available(dtype) or any(p.device.type != "cpu" or p.dtype != dtype for p in model.parameters()):
        return 0
    linears = children_of_type(model, nn.Linear)
    elsewhere = {id(p) for module in model.modules() if type(module) is not nn.Linear
                 for p in module.parameters(recurse=False)}
    with torch.no_grad():
        for parent, name, child in linears:
            setattr(parent, name, PackedLinear(child, tied=id(child.weight) in elsewhere))
    return len(linears)


def unpack_linears(model: nn.Module) -> int:
    """Undo ``prepack_linears`` in place (a model translated once, then cast, quantised or
    saved); the number of layers given back."""
    packed = children_of_type(model, PackedLinear)
    for parent, name, child in packed:
        setattr(parent, name, child.to_linear())
    return len(packed)
