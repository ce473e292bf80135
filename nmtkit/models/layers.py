"""Building blocks of the Transformer: norms, feed-forward, attention (positions: positions.py)."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmtkit.models.positions import rotate


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019): no centring, no bias."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def make_norm(kind: str, dim: int) -> nn.Module:
    return RMSNorm(dim) if kind == "rmsnorm" else nn.LayerNorm(dim)


class FeedForward(nn.Module):
    """Position-wise FFN: ReLU (the paper), GELU (Hendrycks & Gimpel 2016, exact erf form),
    SiLU (Marian's "swish", x * sigmoid(x)) or SwiGLU (Shazeer 2020, the hidden layer doubled into a SiLU gate and a value)."""

    def __init__(self, dim: int, hidden: int, kind: str = "relu", activation_dropout: float = 0.0) -> None:
        super().__init__()
        self.kind = kind
        self.fc_in = nn.Linear(dim, hidden * (2 if kind == "swiglu" else 1))
        self.fc_out = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc_in(x)
        if self.kind == "swiglu":
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        else:
            h = F.gelu(h) if self.kind == "gelu" else F.silu(h) if self.kind == "silu" else F.relu(h)
        return self.fc_out(self.dropout(h))


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout: float, causal: bool = False) -> Tensor:
    """Scaled dot-product attention: ``F.scaled_dot_product_attention`` (flash / memory-
    efficient kernels on GPU), except on CPU in bf16, where explicit bf16 matmuls with a
    float32 softmax run ~10x faster than the CPU SDPA kernels (measured, torch 2.13, AMX).
    ``mask`` is bool (True = attend) or a float bias added to the scores (ALiBi)."""
    additive = mask is not None and mask.dtype != torch.bool
    if q.device.type != "cpu" or q.dtype != torch.bfloat16:
        if additive and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)  # SDPA wants a float mask in the query's dtype
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)
    scores = (q * q.size(-1) ** -0.5) @ k.transpose(-1, -2)  # (B, H, T, S)
    if causal:
        t, s_len = scores.shape[-2:]
        mask = torch.ones(t, s_len, dtype=torch.bool, device=q.device).tril(s_len - t)
    if additive:
        probs = (scores.float() + mask).softmax(-1)  # the bias in float32, like the softmax
    else:
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = scores.float().softmax(-1)
    if dropout > 0:
        probs = F.dropout(probs, dropout)
    return probs.to(v.dtype) @ v


class Attention(nn.Module):
    """Multi-head scaled dot-product attention on ``F.scaled_dot_product_attention``.

    Self-attention projects q, k, v with one fused matrix; cross-attention projects
    k, v of the memory once per sentence (``project_kv``) and reuses them every step.
    ``key_dim`` is the per-head size of queries and keys (the paper's d_k, Table 3 row B);
    0 keeps d_k = d_v = dim / heads. Values and the output always keep dim / heads per head.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, cross: bool = False, key_dim: int = 0) -> None:
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, dim // heads, dropout
        self.key_dim = key_dim or self.head_dim
        self.sizes = (heads * self.key_dim, heads * self.key_dim, dim)  # q, k, v widths
        if cross:
            self.q_proj = nn.Linear(dim, self.sizes[0])
            self.kv_proj = nn.Linear(dim, self.sizes[1] + dim)
        else:
            self.qkv_proj = nn.Linear(dim, sum(self.sizes))
        self.out_proj = nn.Linear(dim, dim)

    def _split(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, -1).transpose(1, 2)  # (B, H, T, Dk or Dh)

    def _merge(self, x: Tensor) -> Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, -1)  # (B, T, D)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Memory [B, S, D] -> keys [B, H, S, Dk], values [B, H, S, Dh] (cross-attention only)."""
        k, v = self.kv_proj(memory).split(self.sizes[1:], dim=-1)
        return self._split(k), self._split(v)

    def project_qkv(self, x: Tensor, rotary: Optional[tuple[Tensor, Tensor]] = None) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention q, k [B, H, T, Dk] and v [B, H, T, Dh]; with RoPE tables, q and k come out rotated."""
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        q, k, v = self._split(q), self._split(k), self._split(v)
        if rotary is not None:
            q, k = rotate(q, rotary), rotate(k, rotary)
        return q, k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
        """q [B, H, T, Dk], k [B, H, S, Dk], v [B, H, S, Dh], mask broadcastable to [B, H, T, S]: bool (True =
        attend) or an additive float bias."""
        p = self.dropout if self.training else 0.0
        out = sdpa(q, k, v, mask, p, causal and mask is None)
        return self.out_proj(self._merge(out))

    def weights(self, q: Tensor, k: Tensor, mask: Optional[Tensor]) -> Tensor:
        """Explicit attention probabilities [B, H, T, S] (for alignments and plots)."""
        scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(self.key_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1)
