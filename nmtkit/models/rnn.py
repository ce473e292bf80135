"""The recurrent encoder-decoder baseline (Bahdanau et al. 2015; Luong et al. 2015).

Encoder: embeddings -> (bi)directional LSTM/GRU/tanh-RNN over packed sequences, so padding
never enters a state. The two directions are concatenated or summed (``merge``) and
projected to ``hidden_dim``; the decoder starts from the encoder's final states through a
learned bridge, tanh(Linear(final states of every encoder layer)).

Decoder, one step (s = top-layer decoder state, c = context, h~ = attentional vector):

    bahdanau       c_t = attend(s_{t-1}); s_t = RNN([y_{t-1}; c_t (; h~_{t-1})])
    luong-dot/gen  s_t = RNN([y_{t-1} (; h~_{t-1})]); c_t = attend(s_t)
    none           s_t = RNN([y_{t-1} (; h~_{t-1})]); c_t = the final encoder state (fixed)
    all:           h~_t = tanh(W_c [s_t; c_t]); logits = output(readout(h~_t))

``(; h~_{t-1})`` is Luong input feeding (``input_feed``). Scores: bahdanau
v^T tanh(W s + U h_j), luong-dot s . h_j, luong-general s^T W h_j; U h_j and W h_j are
computed once per sentence in ``encode``. ``none`` is the fixed-context bottleneck model:
it never reads the memory, and reports as attention a one-hot on the last real source
token (where the forward encoder ends).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmtkit.config import ModelConfig
from nmtkit.models.base import EncoderOut, Selectable, Seq2Seq, group_beams
from nmtkit.runtime.device import autocast_runs
from nmtkit.specials import PAD

CELLS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}


@dataclasses.dataclass
class RNNEncoderOut(EncoderOut):
    keys: Optional[Tensor]  # [B, S, H] attention keys: memory (dot), W h_j (general), U h_j (bahdanau); None (none)
    final: Tensor  # [B, H] final encoder state projected like the memory: the context of `none`
    init_h: Tensor  # [B, L_dec, H] bridged initial decoder state
    init_c: Optional[Tensor]  # [B, L_dec, H] LSTM cell state; None for gru/rnn


@dataclasses.dataclass
class RNNState(Selectable):
    h: Tensor  # [rows, L_dec, H] (batch-first; transposed to [L, rows, H] around the cuDNN call)
    c: Optional[Tensor]  # [rows, L_dec, H] LSTM only
    input_feed: Optional[Tensor]  # [rows, H] previous attentional vector h~; None without input feeding
    attn: Optional[Tensor] = None  # [rows, S] attention of the last step when asked for


def _call_rnn(rnn: nn.RNNBase, inputs, hx=None):
    """``rnn(inputs, hx)``; under CPU autocast where this cell cannot run (``autocast_runs``: an
    LSTM on a CPU without oneDNN's bf16 kernels), in its weights' dtype outside autocast, while
    the rest of the model keeps the autocast dtype."""
    weight = rnn.weight_ih_l0
    if weight.device.type != "cpu" or not torch.is_autocast_enabled("cpu") or \
            autocast_runs(type(rnn), torch.get_autocast_dtype("cpu"), rnn.training):
        return rnn(inputs, hx)
    if isinstance(hx, tuple):
        hx = tuple(h.to(weight.dtype) for h in hx)
    elif hx is not None:
        hx = hx.to(weight.dtype)
    with torch.autocast("cpu", enabled=False):
        return rnn(inputs.to(weight.dtype), hx)


def _make_rnn(cell: str, input_dim: int, hidden: int, layers: int, dropout: float, bidirectional: bool = False):
    kwargs = dict(nonlinearity="tanh") if cell == "rnn" else {}
    return CELLS[cell](input_dim, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional,
                       dropout=dropout if layers > 1 else 0.0, **kwargs)


class RNNAttention(nn.Module):
    """Additive (bahdanau), dot or general (luong) scores over a B-row memory.

    ``keys`` (the query-independent half) are precomputed by ``project_keys`` once per sentence.
    """

    def __init__(self, kind: str, dim: int) -> None:
        super().__init__()
        self.kind = kind
        if kind == "bahdanau":
            self.key_proj = nn.Linear(dim, dim, bias=False)  # U
            self.query_proj = nn.Linear(dim, dim)  # W (its bias is the additive layer's bias)
            self.score = nn.Linear(dim, 1, bias=False)  # v
        elif kind == "luong-general":
            self.key_proj = nn.Linear(dim, dim, bias=False)  # W of s^T W h = s . (W h)

    def project_keys(self, memory: Tensor) -> Tensor:
        return memory if self.kind == "luong-dot" else self.key_proj(memory)

    def forward(self, queries: Tensor, keys: Tensor, memory: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        """queries [B, N, H], keys/memory [B, S, H] -> context [B, N, H], weights [B, N, S] (float32).

        N is the beam (decode_step) or the target length (teacher forcing)."""
        if self.kind == "bahdanau":
            hidden = torch.tanh(self.query_proj(queries)[:, :, None] + keys[:, None])  # (B, N, S, H)
            scores = self.score(hidden).squeeze(-1)  # (B, N, S)
        else:
            scores = queries @ keys.transpose(1, 2)  # (B, N, S)
        # float32 softmax even under autocast; exactly 0 on padding
        weights = scores.masked_fill(~src_mask[:, None], float("-inf")).softmax(-1, dtype=torch.float32)
        return weights.to(memory.dtype) @ memory, weights


class RNNSeq2Seq(Seq2Seq):
    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        embed, hidden, directions = cfg.embed_dim, cfg.hidden_dim, 2 if cfg.bidirectional else 1
        self.src_embed = nn.Embedding(src_vocab_size, embed, padding_idx=PAD)
        if cfg.tie_embeddings == "all":
            if src_vocab_size != tgt_vocab_size:
                raise ValueError("tie_embeddings=all needs one joint vocabulary")
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(tgt_vocab_size, embed, padding_idx=PAD)
        self.dropout = nn.Dropout(cfg.dropout)

        self.encoder = _make_rnn(cfg.cell, embed, hidden, cfg.encoder_layers, cfg.dropout, cfg.bidirectional)
        merged = hidden * directions if cfg.merge == "concat" else hidden
        self.memory_proj = nn.Linear(merged, hidden) if merged != hidden else nn.Identity()
        finals, starts = cfg.encoder_layers * merged, cfg.decoder_layers * hidden  # all layers' final states in
        self.bridge_h = nn.Linear(finals, starts)
        self.bridge_c = nn.Linear(finals, starts) if cfg.cell == "lstm" else None

        self.attention = RNNAttention(cfg.attention, hidden) if cfg.attention != "none" else None
        decoder_input = embed + (hidden if cfg.attention == "bahdanau" else 0) + (hidden if cfg.input_feed else 0)
        self.decoder = _make_rnn(cfg.cell, decoder_input, hidden, cfg.decoder_layers, cfg.dropout)
        self.combine = nn.Linear(2 * hidden, hidden, bias=False)  # W_c of h~ = tanh(W_c [s; c])

        tied = cfg.tie_embeddings != "none"
        # a tied output layer reads embed_dim vectors, so h~ is projected down to it first
        self.readout_proj = nn.Linear(hidden, embed, bias=False) if tied and hidden != embed else nn.Identity()
        self.output_proj = nn.Linear(embed if tied else hidden, tgt_vocab_size)
        self._reset_parameters()
        if tied:
            self.output_proj.weight = self.tgt_embed.weight

    def _reset_parameters(self) -> None:
        """Uniform in [-0.1, 0.1] as in Luong et al. 2015 (sec. 4.1); PAD embeddings zero."""
        for param in self.parameters():
            nn.init.uniform_(param, -0.1, 0.1)
        with torch.no_grad():
            self.src_embed.weight[PAD].zero_()
            self.tgt_embed.weight[PAD].zero_()

    # ---- encoder -------------------------------------------------------------------------

    def _merge(self, fwd: Tensor, bwd: Optional[Tensor]) -> Tensor:
        if bwd is None:
            return fwd
        return torch.cat([fwd, bwd], -1) if self.cfg.merge == "concat" else fwd + bwd

    def encode(self, src: Tensor, src_mask: Tensor) -> RNNEncoderOut:
        """src [B, S] -> memory [B, S, H] (0 on padding), attention keys, bridged decoder start.

        Packed sequences: padding never enters a state. Every sentence needs one real token."""
        batch, length = src.shape
        hidden, layers = self.cfg.hidden_dim, self.cfg.encoder_layers
        lengths = src_mask.sum(1).cpu()
        packed = pack_padded_sequence(self.dropout(self.src_embed(src)), lengths, batch_first=True,
                                      enforce_sorted=False)
        outputs, final = _call_rnn(self.encoder, packed)
        outputs, _ = pad_packed_sequence(outputs, batch_first=True, total_length=length)  # (B, S, dirs*H), 0 on pad
        bidir = self.cfg.bidirectional
        memory = self._merge(outputs[..., :hidden], outputs[..., hidden:] if bidir else None)
        memory = self.dropout(self.memory_proj(memory)) * src_mask[..., None]  # (B, S, H), still 0 on pad

        def merged_finals(states: Tensor) -> Tensor:  # [L*dirs, B, H] -> [B, L, merged]
            states = states.view(layers, 2 if bidir else 1, batch, hidden)
            return self._merge(states[:, 0], states[:, 1] if bidir else None).transpose(0, 1)

        h_n, c_n = final if self.cfg.cell == "lstm" else (final, None)
        finals_h = merged_finals(h_n)  # (B, L_enc, merged)
        init_h = torch.tanh(self.bridge_h(finals_h.reshape(batch, -1))).view(batch, self.cfg.decoder_layers, hidden)
        init_c = None
        if c_n is not None:
            init_c = torch.tanh(self.bridge_c(merged_finals(c_n).reshape(batch, -1)))
            init_c = init_c.view(batch, self.cfg.decoder_layers, hidden)
        keys = self.attention.project_keys(memory) if self.attention is not None else None
        return RNNEncoderOut(memory=memory, src_mask=src_mask, keys=keys, final=self.memory_proj(finals_h[:, -1]),
                             init_h=init_h, init_c=init_c)

    # ---- decoder -------------------------------------------------------------------------

    def _attend(self, queries: Tensor, enc: RNNEncoderOut, need_weights: bool) -> tuple[Tensor, Optional[Tensor]]:
        """queries [B, N, H] -> context [B, N, H], weights [B, N, S] (None unless asked, for `none`)."""
        if self.attention is not None:
            return self.attention(queries, enc.keys, enc.memory, enc.src_mask)
        batch, n, _ = queries.shape
        context = enc.final[:, None].expand(batch, n, -1)
        if not need_weights:
            return context, None
        last = F.one_hot(enc.src_mask.sum(1) - 1, enc.src_mask.size(1)).to(context.dtype)  # (B, S)
        return context, last[:, None].expand(batch, n, -1)

    def _attend_rows(self, query: Tensor, enc: RNNEncoderOut, need_weights: bool):
        """One query per decoder row [B*beam, H]: the beam of a sentence shares its B-row memory."""
        batch = enc.src_mask.size(0)
        context, weights = self._attend(group_beams(query, batch), enc, need_weights)  # (B, beam, H), (B, beam, S)
        rows = query.size(0)
        return context.reshape(rows, -1), None if weights is None else weights.reshape(rows, -1)

    def _run_decoder(self, inputs: Tensor, h: Tensor, c: Optional[Tensor]):
        """inputs [rows, T, in], h/c [rows, L, H] -> outputs [rows, T, H], new h, c (batch-first)."""
        hx = h.transpose(0, 1).contiguous()  # (L, rows, H) as torch's RNNs want it
        if c is not None:
            outputs, (h, c) = _call_rnn(self.decoder, inputs, (hx, c.transpose(0, 1).contiguous()))
            return outputs, h.transpose(0, 1), c.transpose(0, 1)
        outputs, h = _call_rnn(self.decoder, inputs, hx)
        return outputs, h.transpose(0, 1), None

    def _readout(self, top: Tensor, context: Tensor) -> tuple[Tensor, Tensor]:
        """Attentional vector h~ = tanh(W_c [s; c]) and what the output layer reads from it."""
        attentional = torch.tanh(self.combine(torch.cat([top, context], -1)))
        return self.readout_proj(self.dropout(attentional)), attentional

    def init_state(self, enc: RNNEncoderOut, beam: int = 1) -> RNNState:
        h = enc.init_h.repeat_interleave(beam, 0)  # (B*beam, L, H): rows b*beam.. are sentence b
        c = None if enc.init_c is None else enc.init_c.repeat_interleave(beam, 0)
        feed = h.new_zeros(h.size(0), self.cfg.hidden_dim) if self.cfg.input_feed else None
        return RNNState(h=h, c=c, input_feed=feed)

    def decode_step(self, prev: Tensor, enc: RNNEncoderOut, state: RNNState,
                    need_attn: bool = False) -> tuple[Tensor, RNNState]:
        readout, state = self._step(prev, enc, state, need_attn)
        return self.output_proj(readout), state

    def _step(self, prev: Tensor, enc: RNNEncoderOut, state: RNNState, need_attn: bool) -> tuple[Tensor, RNNState]:
        """One decoder step up to the output layer: (readout [rows, E or H], new state)."""
        inputs = [self.dropout(self.tgt_embed(prev))]  # (rows, E)
        bahdanau = self.cfg.attention == "bahdanau"
        if bahdanau:  # attend with the previous top-layer state s_{t-1}
            context, weights = self._attend_rows(state.h[:, -1], enc, need_attn)
            inputs.append(context)
        if state.input_feed is not None:
            inputs.append(state.input_feed)
        outputs, h, c = self._run_decoder(torch.cat(inputs, -1)[:, None], state.h, state.c)
        top = outputs[:, 0]  # (rows, H) = s_t
        if not bahdanau:
            context, weights = self._attend_rows(top, enc, need_attn)
        readout, attentional = self._readout(top, context)
        return readout, RNNState(h=h, c=c, input_feed=attentional if self.cfg.input_feed else None,
                                attn=weights if need_attn else None)

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits [B, T, V]."""
        return self.output_proj(self.features(src, src_mask, tgt_in))

    def features(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced readouts [B, T, E or H] (the output layer's input): the decoder RNN runs
        over the whole sequence at once when no step depends on the previous step's attention,
        else ``_step`` in a loop."""
        enc = self.encode(src, src_mask)
        state = self.init_state(enc)
        if self.cfg.attention == "bahdanau" or self.cfg.input_feed:
            steps = []
            for t in range(tgt_in.size(1)):
                readout, state = self._step(tgt_in[:, t], enc, state, need_attn=False)
                steps.append(readout)
            return torch.stack(steps, 1)
        outputs, _, _ = self._run_decoder(self.dropout(self.tgt_embed(tgt_in)), state.h, state.c)  # (B, T, H)
        context, _ = self._attend(outputs, enc, need_weights=False)  # the T steps act as T queries
        return self._readout(outputs, context)[0]

    @property
    def max_positions(self) -> Optional[int]:
        return None  # recurrence has no position table
