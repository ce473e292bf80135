"""Where a Transformer gets word order from (``model.positions``).

sinusoidal  Vaswani et al. 2017 sec. 3.5: a fixed table added to the embeddings.
learned     a trained table of ``max_positions`` rows per side (Gehring et al. 2017; the
            paper's Table 3 row E): no sentence can be longer than the table.
alibi       no embedding; each head's attention scores get ``-slope * distance`` (Press et
            al. 2022); nothing is tied to a length, so it works past ``max_positions``.
            Decoder self-attention: the paper's causal bias. Encoder: the distance |i - j|
            both ways, but half of the heads look left (j <= i) and half right (j >= i),
            as the ALiBi authors suggest for bidirectional attention: with every head
            symmetric the encoder is mirror-blind (a sentence and its reverse give the
            same set of memory vectors, so "dog bites man" = "man bites dog" to
            cross-attention; measured on reversal after 600 updates: 4% exact with symmetric
            heads, 77.5% one-sided; tests/test_transformer.py has the figures).
rope        queries and keys of self-attention rotated by their absolute position (Su et al.
            2021), so q.k depends only on the relative position; no length limit either.

Cross-attention gets no position signal under ALiBi or RoPE: a source and a target
position are not comparable (a target word's source is not at its own index), so a
distance between them would only bias attention towards the diagonal. Word order reaches
cross-attention through the queries (decoder self-attention) and the keys (encoder).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

KINDS = ("sinusoidal", "learned", "alibi", "rope")
ROPE_BASE = 10000.0


def sinusoidal_positions(length: int, dim: int, layout: str = "interleaved") -> Tensor:
    """[length, dim] table of Vaswani et al. 2017 sec. 3.5: sin on even, cos on odd dims; with
    ``layout="halves"`` the same frequencies as all sines then all cosines (Marian's layout),
    computed in float64 so that it equals a float64 reference table rounded once."""
    if layout == "halves":
        position64 = torch.arange(length, dtype=torch.float64)[:, None]
        freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
        angles = position64 * freq  # (length, dim/2)
        return torch.cat([angles.sin(), angles.cos()], dim=-1)[:, :dim].float()
    position = torch.arange(length, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: dim // 2])
    return table


def alibi_slopes(heads: int) -> Tensor:
    """[heads] slopes of Press et al. 2022: the geometric sequence 2^(-8/n), 2^(-16/n), ...
    for n a power of two; otherwise the n' = 2^floor(log2 n) slopes, then every other slope
    of 2n' until there are ``heads`` (the paper's rule for other head counts)."""
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    base = 2 ** int(math.floor(math.log2(heads)))
    slopes = geometric(base) + geometric(2 * base)[0::2][:heads - base]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: Tensor, query_positions: Tensor, key_positions: Tensor, causal: bool) -> Tensor:
    """[H, T, S] additive scores ``-slope * |i - j|``; with ``causal``, -inf where j > i."""
    distance = (query_positions[:, None] - key_positions[None, :]).float()  # (T, S)
    bias = -slopes[:, None, None] * distance.abs()
    if causal:
        bias = bias.masked_fill(distance < 0, float("-inf"))
    return bias


def alibi_encoder_slopes(heads: int) -> tuple[Tensor, Tensor]:
    """Slopes of the ceil(H/2) heads looking left and of the H/2 looking right (each half has
    the slopes of its own head count)."""
    return alibi_slopes((heads + 1) // 2), alibi_slopes(heads // 2) if heads > 1 else torch.zeros(0)


def alibi_encoder_bias(heads: int, length: int, device=None,
                       slopes: Optional[tuple[Tensor, Tensor]] = None) -> Tensor:
    """[H, S, S] encoder bias: ``-slope * |i - j|``, the first ceil(H/2) heads seeing keys
    j <= i, the others j >= i, so the right half is the mirror image of the left. ``slopes``:
    ``alibi_encoder_slopes(heads)`` already on ``device`` (a model's buffers: no host-to-device
    copy, and so no GPU sync, per batch)."""
    left, right = slopes if slopes is not None else [t.to(device) for t in alibi_encoder_slopes(heads)]
    positions = torch.arange(length, device=device)
    looking_left = alibi_bias(left, positions, positions, causal=True)
    if not right.numel():
        return looking_left
    looking_right = alibi_bias(right, positions, positions, causal=True).transpose(1, 2)
    return torch.cat([looking_left, looking_right])


def rotary_tables(positions: Tensor, head_dim: int) -> tuple[Tensor, Tensor]:
    """cos, sin [T, Dh] for RoPE at ``positions`` [T]: pair (d, d + Dh/2) turns by the angle
    position * ROPE_BASE^(-2d/Dh) (the half-split pairing, as GPT-NeoX and LLaMA)."""
    inv_freq = ROPE_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (T, Dh/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, Dh)
    return angles.cos(), angles.sin()


def rotate(x: Tensor, rotary: tuple[Tensor, Tensor]) -> Tensor:
    """x [B, H, T, Dh] rotated by the tables of ``rotary_tables`` (in float32, back to x's dtype)."""
    cos, sin = rotary
    x32 = x.float()
    first, second = x32.chunk(2, dim=-1)
    return (x32 * cos + torch.cat([-second, first], dim=-1) * sin).to(x.dtype)


class Positions(nn.Module):
    """The position scheme of one Transformer: what embeddings get, and what each
    self-attention gets (a mask or additive bias, and RoPE tables)."""

    def __init__(self, kind: str, max_positions: int, dim: int, heads: int, rotary_dim: int,
                 layout: str = "interleaved") -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown positions {kind!r}")
        self.kind, self.heads = kind, heads
        self.rotary_dim = rotary_dim  # RoPE rotates queries and keys: their per-head size
        if kind == "sinusoidal":
            self.register_buffer("table", sinusoidal_positions(max_positions, dim, layout),
                                 persistent=False)
        elif kind == "learned":  # one table per side, at the sinusoid's scale (variance 1/2)
            # nn.init, not torch.randn: build_model(random_init=False) skips nn.init's fills
            self.src_embed = nn.Parameter(nn.init.normal_(torch.empty(max_positions, dim), std=0.5 ** 0.5))
            self.tgt_embed = nn.Parameter(nn.init.normal_(torch.empty(max_positions, dim), std=0.5 ** 0.5))
        elif kind == "alibi":
            self.register_buffer("slopes", alibi_slopes(heads), persistent=False)
            left, right = alibi_encoder_slopes(heads)
            self.register_buffer("encoder_left_slopes", left, persistent=False)
            self.register_buffer("encoder_right_slopes", right, persistent=False)

    @property
    def unbounded(self) -> bool:
        """True when no table limits the length (ALiBi, RoPE)."""
        return self.kind in ("alibi", "rope")

    def table_of(self, side: str) -> Optional[Tensor]:
        """[max_positions, D] rows added to the ``side`` ("src" / "tgt") embeddings, if any."""
        if self.kind == "sinusoidal":
            return self.table
        if self.kind == "learned":
            return self.src_embed if side == "src" else self.tgt_embed
        return None

    def embed(self, x: Tensor, side: str, start: int = 0) -> Tensor:
        """Scaled token embeddings x [B, T, D] plus the rows of positions start .. start+T-1."""
        table = self.table_of(side)
        return x if table is None else x + table[start:start + x.size(1)]

    def encoder(self, src_mask: Tensor, padded: bool = True) -> tuple[Optional[Tensor], Optional[tuple[Tensor, Tensor]]]:
        """Encoder self-attention: (mask: bool [B, 1, 1, S], None when not ``padded``, or ALiBi's
        float bias [B, H, S, S], rotary)."""
        keep = src_mask[:, None, None, :]  # (B, 1, 1, S)
        length = src_mask.size(1)
        if self.kind == "alibi":
            bias = alibi_encoder_bias(self.heads, length, src_mask.device,
                                      (self.encoder_left_slopes, self.encoder_right_slopes))  # (H, S, S)
            # a padding query sees itself, or a one-sided head would see nothing (NaN rows)
            keep = keep | torch.eye(length, dtype=torch.bool, device=src_mask.device)
            return bias[None].masked_fill(~keep, float("-inf")), None
        return keep if padded else None, self._rotary(torch.arange(length, device=src_mask.device))

    def decoder(self, start: int, length: int, device) -> tuple[Optional[Tensor], Optional[tuple[Tensor, Tensor]]]:
        """Decoder self-attention of queries at start .. start+length-1 over keys 0 .. start+length-1:
        (ALiBi's causal bias [H, length, start+length] or None for a plain causal mask, rotary)."""
        queries = torch.arange(start, start + length, device=device)
        if self.kind == "alibi":
            return alibi_bias(self.slopes, queries, torch.arange(start + length, device=device), causal=True), None
        return None, self._rotary(queries)

    def _rotary(self, positions: Tensor) -> Optional[tuple[Tensor, Tensor]]:
        return rotary_tables(positions, self.rotary_dim) if self.kind == "rope" else None
