"""A small random attentional model for search tests (float64, honours the beam layout), random
batches, and reference computations: every output up to a length, and a sequence's score by
teacher forcing; and a scripted model whose distributions a test writes out, so that what a
search must find is known by hand."""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import Tensor, nn

from nmtkit.models.base import EncoderOut, Selectable, Seq2Seq, group_beams
from nmtkit.specials import BOS, EOS, PAD


@dataclasses.dataclass
class TinyState(Selectable):
    hidden: Tensor  # [rows, D]
    attn: Optional[Tensor] = None


class TinyModel(Seq2Seq):
    """A small attentional GRU in float64: random, cheap, honours the beam layout."""

    def __init__(self, seed: int, vocab: int = 12, dim: int = 16, sharpness: float = 3.0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab, dim)
        self.enc_proj = nn.Linear(dim, dim)
        self.cell = nn.GRUCell(dim, dim)
        self.out = nn.Linear(2 * dim, vocab)
        self.sharpness = sharpness
        self.double()

    def encode(self, src, src_mask):
        memory = torch.tanh(self.enc_proj(self.embed(src))) * src_mask[:, :, None]
        return EncoderOut(memory, src_mask)

    def init_state(self, enc, beam=1):
        mean = enc.memory.sum(1) / enc.src_mask.sum(1, keepdim=True)
        return TinyState(mean.repeat_interleave(beam, 0))

    def decode_step(self, prev, enc, state, need_attn=False):
        hidden = self.cell(self.embed(prev), state.hidden)
        batch = enc.memory.size(0)
        query = group_beams(hidden, batch)  # (B, beam, D)
        scores = (query @ enc.memory.transpose(1, 2)).masked_fill(~enc.src_mask[:, None, :], float("-inf"))
        weights = scores.softmax(-1)  # (B, beam, S)
        context = (weights @ enc.memory).reshape(hidden.shape)
        logits = self.out(torch.cat([hidden, context], -1)) * self.sharpness
        return logits, TinyState(hidden, weights.reshape(hidden.size(0), -1) if need_attn else None)


A, B_, C = 4, 5, 6  # the scripted model's pieces "a", "b", "c"
SCRIPTED_VOCAB = 8


@dataclasses.dataclass
class ScriptedEnc(EncoderOut):
    key: Tensor  # [B] which script a sentence follows (its first source token)


@dataclasses.dataclass
class ScriptedState(Selectable):
    key: Tensor  # [rows]
    prefix: Tensor  # [rows, t] pieces so far (BOS excluded)
    attn: Optional[Tensor] = None


class ScriptedModel(Seq2Seq):
    """decode_step returns fixed distributions: script[(key, prefix)] = {piece: p}.

    Unlisted prefixes end (EOS with probability 1). Zero probabilities become 1e-12 so
    every log-probability stays finite. Records the rows of every decode_step call.
    """

    def __init__(self, script: dict) -> None:
        super().__init__()
        self.script = script
        self.calls: list[int] = []

    def encode(self, src, src_mask):
        return ScriptedEnc(memory=src_mask[:, :, None].float(), src_mask=src_mask, key=src[:, 0].clone())

    def init_state(self, enc, beam=1):
        rows = enc.key.size(0) * beam
        return ScriptedState(enc.key.repeat_interleave(beam), torch.zeros(rows, 0, dtype=torch.long))

    def decode_step(self, prev, enc, state, need_attn=False):
        self.calls.append(prev.size(0))
        prefix = torch.cat([state.prefix, prev[:, None]], 1)  # BOS y1 .. yt
        probs = torch.full((prev.size(0), SCRIPTED_VOCAB), 1e-12, dtype=torch.float64)
        for row, (key, pre) in enumerate(zip(state.key.tolist(), prefix.tolist())):
            for piece, p in self.script.get((key, tuple(pre[1:])), {EOS: 1.0}).items():
                probs[row, piece] = p
        attn = None
        if need_attn:  # attend to source position (step mod |x|): a known alignment
            mask = enc.src_mask.repeat_interleave(prev.size(0) // enc.key.size(0), 0)
            attn = nn.functional.one_hot((prefix.size(1) - 1) % mask.sum(1), mask.size(1)).double()
        return probs.log(), ScriptedState(state.key, prefix, attn)


def src_of(keys: list[int], length: int = 3) -> tuple[Tensor, Tensor]:
    """Sources whose first token is the script key, padded out with "a"."""
    src = torch.tensor([[k] + [A] * (length - 1) for k in keys])
    return src, src.ne(PAD)


def random_batch(seed: int, batch: int = 6, vocab: int = 12, max_len: int = 7) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (batch,), generator=gen)
    src = torch.randint(4, vocab, (batch, max_len), generator=gen)
    src = src.masked_fill(torch.arange(max_len)[None] >= lengths[:, None], PAD)
    return src, src.ne(PAD)


def all_outputs(pieces: list[int], max_len: int) -> list[list[int]]:
    outputs, frontier = [], [[]]
    for _ in range(max_len + 1):
        outputs += frontier
        frontier = [seq + [p] for seq in frontier for p in pieces]
    return outputs


def sequence_score(model: Seq2Seq, src: Tensor, mask: Tensor, tokens: list[int], lenpen: float) -> float:
    """logprob(tokens + EOS) / lp(|tokens|), by teacher forcing through decode_step."""
    enc = model.encode(src, mask)
    state, prev, total = model.init_state(enc, 1), torch.tensor([BOS]), 0.0
    for token in tokens + [EOS]:
        logits, state = model.decode_step(prev, enc, state)
        total += float(torch.log_softmax(logits.float(), -1)[0, token])
        prev = torch.tensor([token])
    return total / ((5 + len(tokens)) / 6) ** lenpen
