"""Training FLOPs of a model counted from its shapes (``train.max_flops``, the sweep's cost columns).

What is counted: every matrix product of the forward pass at 2 FLOPs per multiply-add, for the
real tokens of each sentence (padding is not counted, though the kernels compute it): the
linear layers, the attention scores and the weighted sums of values (Transformer), the recurrent
cells' input and hidden matrices, the attention layers, the bridge and the output layer (RNN).
Norms, activations, softmax, biases and embedding lookups are left out (a few per cent at the
sizes we train). Training costs 3 x forward: the backward pass multiplies each matrix twice more
(the gradient of its input and of its weight), the rule of Kaplan et al. 2020 and Hoffmann et
al. 2022. Self-attention counts the whole T x T score matrix, as the kernels compute it.

The count of a batch is linear in six sums over its sentences (source length S, target length
T, i.e. the target pieces plus EOS), so one ``FlopCount`` per model gives any batch's count from
its lengths: flops = sentences c0 + ΣS c_s + ΣT c_t + ΣS² c_ss + ΣT² c_tt + ΣST c_st.
tests/test_budgets.py checks these counts against torch's own FlopCounterMode.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nmtkit.models.moe import is_moe_layer

BACKWARD_FACTOR = 3  # forward + backward = 3 x forward
GATES = {"lstm": 4, "gru": 3, "rnn": 1}


@dataclass(frozen=True)
class FlopCount:
    """Forward FLOPs of a batch as a linear function of its length sums (see the module docstring)."""

    per_sentence: int = 0
    per_src: int = 0
    per_tgt: int = 0
    per_src_src: int = 0
    per_tgt_tgt: int = 0
    per_src_tgt: int = 0

    def forward(self, src_lengths, tgt_lengths) -> int:
        """Forward FLOPs of sentences with these source and target lengths (the target's with EOS)."""
        s = np.asarray(src_lengths, dtype=np.int64)
        t = np.asarray(tgt_lengths, dtype=np.int64)
        return int(self.per_sentence * len(s) + self.per_src * s.sum() + self.per_tgt * t.sum()
                   + self.per_src_src * (s * s).sum() + self.per_tgt_tgt * (t * t).sum()
                   + self.per_src_tgt * (s * t).sum())

    def training(self, src_lengths, tgt_lengths) -> int:
        """Forward + backward FLOPs of one training pass over these sentences."""
        return BACKWARD_FACTOR * self.forward(src_lengths, tgt_lengths)


def flop_count(cfg, src_vocab: int, tgt_vocab: int) -> FlopCount:
    """The forward count of the model ``cfg`` (a ModelConfig) with these vocabulary sizes."""
    return _transformer(cfg, tgt_vocab) if cfg.arch == "transformer" else _rnn(cfg, tgt_vocab)


def _ffn(cfg, index: int) -> int:
    """Per token: the FFN of layer ``index`` (its k experts and the router when MoE)."""
    d, hidden = cfg.d_model, cfg.ffn_dim
    dense = 2 * d * hidden * (2 if cfg.ffn == "swiglu" else 1) + 2 * hidden * d
    if cfg.moe_experts and is_moe_layer(index, cfg.moe_every):
        return cfg.moe_top_k * dense + 2 * d * cfg.moe_experts
    return dense


def _transformer(cfg, tgt_vocab: int) -> FlopCount:
    d, qk = cfg.d_model, cfg.heads * cfg.key_size  # query/key width; values keep d
    self_proj = 2 * d * (2 * qk + d) + 2 * d * d  # fused q, k, v and the output projection
    scores = 2 * (qk + d)  # per (query, key) pair: q.k and the weighted value
    per_src = sum(self_proj + _ffn(cfg, i) for i in range(cfg.encoder_layers))
    per_src += cfg.decoder_layers * 2 * d * (qk + d)  # cross-attention keys and values of the memory
    per_tgt = sum(self_proj + 2 * d * qk + 2 * d * d + _ffn(cfg, i) for i in range(cfg.decoder_layers))
    per_tgt += 2 * d * tgt_vocab  # output layer
    return FlopCount(per_src=per_src, per_tgt=per_tgt, per_src_src=cfg.encoder_layers * scores,
                     per_tgt_tgt=cfg.decoder_layers * scores, per_src_tgt=cfg.decoder_layers * scores)


def _rnn_stack(gates: int, input_dim: int, hidden: int, layers: int, directions: int = 1) -> int:
    """Per token: a stack of recurrent layers (input and hidden matrices of every gate)."""
    total = 0
    for layer in range(layers):
        inputs = input_dim if layer == 0 else hidden * directions
        total += directions * (2 * inputs * gates * hidden + 2 * hidden * gates * hidden)
    return total


def _rnn(cfg, tgt_vocab: int) -> FlopCount:
    gates, hidden, embed = GATES[cfg.cell], cfg.hidden_dim, cfg.embed_dim
    directions = 2 if cfg.bidirectional else 1
    merged = hidden * directions if cfg.merge == "concat" else hidden
    per_src = _rnn_stack(gates, embed, hidden, cfg.encoder_layers, directions)
    per_src += 2 * merged * hidden if merged != hidden else 0  # memory projection
    bridge = 2 * (cfg.encoder_layers * merged) * (cfg.decoder_layers * hidden) * (2 if cfg.cell == "lstm" else 1)
    decoder_input = embed + (hidden if cfg.attention == "bahdanau" else 0) + (hidden if cfg.input_feed else 0)
    per_tgt = _rnn_stack(gates, decoder_input, hidden, cfg.decoder_layers)
    per_tgt += 2 * (2 * hidden) * hidden  # combine: h~ = tanh(W_c [s; c])
    tied = cfg.tie_embeddings != "none"
    if tied and hidden != embed:
        per_tgt += 2 * hidden * embed  # readout projection down to the tied embedding
    per_tgt += 2 * (embed if tied else hidden) * tgt_vocab  # output layer
    per_pair = 0
    if cfg.attention == "bahdanau":  # keys U h once per source token, W s per step, v . tanh(.), sum of values
        per_src += 2 * hidden * hidden
        per_tgt += 2 * hidden * hidden
        per_pair = 2 * hidden + 2 * hidden
    elif cfg.attention in ("luong-dot", "luong-general"):
        per_src += 2 * hidden * hidden if cfg.attention == "luong-general" else 0
        per_pair = 2 * hidden + 2 * hidden  # s . k, and the weighted sum of the memory
    if merged != hidden:  # the last encoder state, projected (the context without attention)
        bridge += 2 * merged * hidden
    return FlopCount(per_sentence=bridge, per_src=per_src, per_tgt=per_tgt, per_src_tgt=per_pair)
