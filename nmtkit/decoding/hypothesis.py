"""What every search returns, and the two rules every engine shares: the GNMT length penalty
and the output length limit. No torch here: the CTranslate2 engine translates without it."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Optional

from nmtkit.specials import EOS, UNK


@dataclass
class Hypothesis:
    tokens: list[int]  # output pieces, without BOS/EOS
    score: float  # logprob / lp(len(tokens)): what hypotheses are ranked by
    logprob: float  # sum of log-probabilities, EOS included
    attention: Optional[Any] = None  # a tensor [len(tokens), source positions], when asked for


def length_penalty(length, alpha: float):
    """GNMT length normaliser ((5 + L) / 6) ** alpha (1 when alpha is 0), for an int or a tensor
    (computed in float64 as the int path, then rounded to float32)."""
    if hasattr(length, "double"):  # a tensor
        return (((5.0 + length.double()) / 6.0) ** alpha).float()
    return ((5.0 + length) / 6.0) ** alpha


def output_limit(source: list[int], max_len_a: float, max_len_b: int, max_positions: Optional[int],
                 prefix_length: int = 0) -> int:
    """The longest output of one sentence (pieces, EOS excluded): a * |x| + b over its real
    source pieces (BOS, EOS and PAD not counted; an unknown piece is a word of the input), at least its
    prefix, within max_positions. In float32, as
    ``search.output_limits`` computes it for a batch of tensors, so both give the same limit."""
    pieces = float(sum(1 for piece in source if piece > EOS or piece == UNK))  # exact in float32 (< 2 ** 24)
    limit = math.floor(_f32(_f32(pieces * _f32(max_len_a)) + _f32(max_len_b)))
    limit = max(limit, 0, prefix_length)
    return limit if max_positions is None else min(limit, max_positions - 1)


def _f32(value: float) -> float:
    """``value`` rounded to float32. A product of two float32 values is exact in float64, so rounding
    it gives float32's product; a sum rounded to float64 and then to float32 is still float32's
    correctly rounded sum (53 >= 2 * 24 + 2 bits)."""
    return struct.unpack("f", struct.pack("f", value))[0]
