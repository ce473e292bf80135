"""The Transformer of Vaswani et al. 2017 ("Attention Is All You Need").

Post-norm as in the paper by default (``pre_norm`` for the now-common variant, with a
final norm on each stack); sinusoidal positions (or learned, ALiBi, RoPE: positions.py);
embeddings scaled by sqrt(d_model); optional RMSNorm, GELU and SwiGLU. Incremental decoding
caches self-attention keys/values per layer in an explicit ``TransformerState`` (RoPE keys
are cached already rotated); cross-attention keys/values are computed once per sentence in
``encode`` and never copied per beam.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
from torch import Tensor, nn

from nmtkit.config import ModelConfig
from nmtkit.models.base import EncoderOut, Selectable, Seq2Seq
from nmtkit.models.layers import Attention, make_norm, sdpa
from nmtkit.models.moe import MoEFeedForward, make_ffn
from nmtkit.models.positions import Positions
from nmtkit.specials import PAD


@dataclasses.dataclass
class TransformerEncoderOut(EncoderOut):
    cross_kv: list  # per decoder layer: (keys [B, H, S, Dk], values [B, H, S, Dh])
    padded: bool = True  # False: no source padding, attention runs without a mask (flash kernels)


@dataclasses.dataclass
class TransformerState(Selectable):
    self_kv: list  # per decoder layer: (keys [R, H, t, Dk], values [R, H, t, Dh]), R stored rows: this state's are self_kv[order]
    step: int = 0
    attn: Optional[Tensor] = None  # [rows, S] cross-attention of the last layer, head-averaged
    order: Optional[Tensor] = None  # [rows]: the stored rows this state's rows are, None: all, in order
    deferred = ("self_kv", "order")  # not a field: what the base select leaves alone (select composes order)

    def select(self, index: Tensor) -> "TransformerState":
        """Rows ``index`` of this state. The caches are not copied here: the next step reads
        their rows in the new order and appends its keys in one copy (``extend_cache``), where
        reordering and then appending would copy every cache twice a step."""
        order = index if self.order is None else self.order.index_select(0, index)
        return dataclasses.replace(super().select(index), order=order)


def extend_cache(past: Tensor, new: Tensor, order: Optional[Tensor]) -> Tensor:
    """``past`` [R, H, t, D] at rows ``order`` (None: all R, as stored) with ``new`` [N, H, 1, D]
    appended along time: [N, H, t + 1, D], each past value copied once."""
    if order is None:
        return torch.cat([past, new], dim=2)
    if torch.compiler.is_compiling() or past.dtype != new.dtype:
        # the compiler fuses the two itself and wants no out=; under autocast a float32 cache
        # (an empty one starts in the encoder output's dtype) meets bf16 keys, which cat promotes
        return torch.cat([past.index_select(0, order), new], dim=2)
    t = past.size(2)
    out = new.new_empty(new.size(0), new.size(1), t + new.size(2), new.size(3))
    torch.index_select(past, 0, order, out=out[:, :, :t])
    out[:, :, t:] = new
    return out


class Sublayer(nn.Module):
    """Residual connection around a sublayer with post-norm (paper) or pre-norm placement."""

    def __init__(self, dim: int, norm: str, pre_norm: bool, dropout: float) -> None:
        super().__init__()
        self.norm = make_norm(norm, dim)
        self.pre_norm = pre_norm
        self.dropout = nn.Dropout(dropout)

    def inputs(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.pre_norm else x

    def output(self, x: Tensor, y: Tensor) -> Tensor:
        out = x + self.dropout(y)
        return out if self.pre_norm else self.norm(out)


def feed_forward(ffn: nn.Module, x: Tensor, keep: Optional[Tensor], router_stats: Optional[list]) -> Tensor:
    """Dense FFNs see every token alike; MoE layers also take the real-token mask [B, T] (padding
    is not routed) and append their RouterStats to ``router_stats``."""
    return ffn(x, keep, router_stats) if isinstance(ffn, MoEFeedForward) else ffn(x)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg.d_model, cfg.heads, cfg.attention_dropout, key_dim=cfg.key_size)
        self.ffn = make_ffn(cfg, index, "encoder")
        self.attn_block = Sublayer(cfg.d_model, cfg.norm, cfg.pre_norm, cfg.dropout)
        self.ffn_block = Sublayer(cfg.d_model, cfg.norm, cfg.pre_norm, cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor, rotary=None, keep=None, router_stats=None) -> Tensor:
        """x [B, S, D]; mask bool or ALiBi bias (see Positions.encoder); rotary: RoPE tables."""
        q, k, v = self.self_attn.project_qkv(self.attn_block.inputs(x), rotary)
        x = self.attn_block.output(x, self.self_attn.attend(q, k, v, mask))
        return self.ffn_block.output(x, feed_forward(self.ffn, self.ffn_block.inputs(x), keep, router_stats))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg.d_model, cfg.heads, cfg.attention_dropout, key_dim=cfg.key_size)
        self.cross_attn = Attention(cfg.d_model, cfg.heads, cfg.attention_dropout, cross=True, key_dim=cfg.key_size)
        self.ffn = make_ffn(cfg, index, "decoder")
        self.self_block = Sublayer(cfg.d_model, cfg.norm, cfg.pre_norm, cfg.dropout)
        self.cross_block = Sublayer(cfg.d_model, cfg.norm, cfg.pre_norm, cfg.dropout)
        self.ffn_block = Sublayer(cfg.d_model, cfg.norm, cfg.pre_norm, cfg.dropout)

    def cross(self, x: Tensor, kv: tuple[Tensor, Tensor], src_mask: Optional[Tensor], need_attn: bool):
        """Cross-attention of x [N, T, D] where N = B * beam, against memory kv of B rows
        (``src_mask`` None: no padding to mask)."""
        keys, values = kv
        batch, heads, _, key_dim = keys.shape
        head_dim = values.size(-1)
        beam = x.size(0) // batch
        q = self.cross_attn._split(self.cross_attn.q_proj(self.cross_block.inputs(x)))  # (N, H, T, Dk)
        t = q.size(2)
        # group the beam hypotheses of a sentence as extra queries: (B, H, beam*T, Dk)
        q = q.view(batch, beam, heads, t, key_dim).transpose(1, 2).reshape(batch, heads, beam * t, key_dim)
        mask = None if src_mask is None else src_mask[:, None, None, :]  # (B, 1, 1, S)
        attn = None
        if need_attn:
            attn = self.cross_attn.weights(q, keys, mask).mean(1)  # (B, beam*T, S)
            attn = attn.view(batch, beam, t, -1).reshape(batch * beam, t, -1)
        p = self.cross_attn.dropout if self.training else 0.0
        out = sdpa(q, keys, values, mask, p)
        out = out.view(batch, heads, beam, t, head_dim).transpose(1, 2).reshape(batch * beam, heads, t, head_dim)
        out = self.cross_attn.out_proj(self.cross_attn._merge(out))
        return self.cross_block.output(x, out), attn

    def forward(self, x: Tensor, kv, src_mask: Optional[Tensor], cache=None, need_attn: bool = False, self_mask=None,
                rotary=None, keep=None, router_stats=None, order: Optional[Tensor] = None):
        """Full sequence (cache None, causal) or one incremental step (cache = past k, v, RoPE
        keys already rotated, read at rows ``order``). ``self_mask``: ALiBi's causal bias, or
        None for a plain causal mask."""
        q, k, v = self.self_attn.project_qkv(self.self_block.inputs(x), rotary)
        if cache is not None:
            k, v = extend_cache(cache[0], k, order), extend_cache(cache[1], v, order)
        y = self.self_attn.attend(q, k, v, self_mask, causal=cache is None)  # a step's query sees every past key
        x = self.self_block.output(x, y)
        x, attn = self.cross(x, kv, src_mask, need_attn)
        x = self.ffn_block.output(x, feed_forward(self.ffn, self.ffn_block.inputs(x), keep, router_stats))
        return x, (k, v), attn


def cross_mask(enc: TransformerEncoderOut) -> Optional[Tensor]:
    """The source mask cross-attention needs: None when the batch has no padding."""
    return enc.src_mask if enc.padded else None


class Transformer(Seq2Seq):
    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.embed_scale = math.sqrt(d) if cfg.embed_scale else 1.0
        self.src_embed = nn.Embedding(src_vocab_size, d, padding_idx=PAD)
        if cfg.tie_embeddings == "all":
            if src_vocab_size != tgt_vocab_size:
                raise ValueError("tie_embeddings=all needs one joint vocabulary")
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(tgt_vocab_size, d, padding_idx=PAD)
        self.output_proj = nn.Linear(d, tgt_vocab_size, bias=cfg.output_bias)
        self.positions = Positions(cfg.positions, cfg.max_positions, d, cfg.heads, cfg.key_size, cfg.sinusoid_layout)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg, i) for i in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.decoder_layers))
        self.encoder_norm = make_norm(cfg.norm, d) if cfg.pre_norm else nn.Identity()
        self.decoder_norm = make_norm(cfg.norm, d) if cfg.pre_norm else nn.Identity()
        self._reset_parameters()
        if cfg.tie_embeddings != "none":
            self.output_proj.weight = self.tgt_embed.weight

    def _reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, std=self.cfg.d_model ** -0.5)  # so scaled embeddings have unit variance
            with torch.no_grad():
                emb.weight[PAD].zero_()

    @property
    def max_positions(self) -> Optional[int]:
        """The position table's length; None for ALiBi and RoPE, which have no table."""
        return None if self.positions.unbounded else self.cfg.max_positions

    def _embed(self, embedding: nn.Embedding, tokens: Tensor, side: str, start: int = 0) -> Tensor:
        x = self.positions.embed(embedding(tokens) * self.embed_scale, side, start)
        return self.dropout(x)

    def encode(self, src: Tensor, src_mask: Tensor, router_stats: Optional[list] = None) -> TransformerEncoderOut:
        """``router_stats``: a list that MoE layers append their RouterStats to (training)."""
        x = self._embed(self.src_embed, src, "src")  # (B, S, D)
        # a batch without padding attends with no mask at all: SDPA's flash kernel takes none (one
        # host sync per batch; compiled code keeps the mask rather than break its graph)
        padded = torch.compiler.is_compiling() or not bool(src_mask.all())
        mask, rotary = self.positions.encoder(src_mask, padded)  # keys that may be attended (+ ALiBi bias)
        for layer in self.encoder:
            x = layer(x, mask, rotary, src_mask, router_stats)
        memory = self.encoder_norm(x)
        cross_kv = [layer.cross_attn.project_kv(memory) for layer in self.decoder]
        return TransformerEncoderOut(memory=memory, src_mask=src_mask, cross_kv=cross_kv, padded=padded)

    def decode(self, tgt_in: Tensor, enc: TransformerEncoderOut, router_stats: Optional[list] = None) -> Tensor:
        """Teacher-forced decoder states [B, T, D] (before the output projection)."""
        x = self._embed(self.tgt_embed, tgt_in, "tgt")
        self_mask, rotary = self.positions.decoder(0, tgt_in.size(1), tgt_in.device)
        keep = tgt_in.ne(PAD)
        for layer, kv in zip(self.decoder, enc.cross_kv):
            x, _, _ = layer(x, kv, cross_mask(enc), self_mask=self_mask, rotary=rotary, keep=keep,
                            router_stats=router_stats)
        return self.decoder_norm(x)

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, router_stats: Optional[list] = None) -> Tensor:
        """Logits [B, T, V]; MoE layers append their RouterStats to ``router_stats`` if given."""
        return self.output_proj(self.features(src, src_mask, tgt_in, router_stats))  # (B, T, V)

    def features(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, router_stats: Optional[list] = None) -> Tensor:
        """Teacher-forced decoder states [B, T, D], the output layer's input."""
        return self.decode(tgt_in, self.encode(src, src_mask, router_stats), router_stats)

    def init_state(self, enc: EncoderOut, beam: int = 1) -> TransformerState:
        rows = enc.src_mask.size(0) * beam
        heads, head_dim = self.cfg.heads, self.cfg.d_model // self.cfg.heads
        keys = enc.memory.new_zeros(rows, heads, 0, self.cfg.key_size)
        values = enc.memory.new_zeros(rows, heads, 0, head_dim)
        return TransformerState(self_kv=[(keys, values) for _ in self.decoder], step=0)

    def decode_step(self, prev: Tensor, enc: TransformerEncoderOut, state: TransformerState,
                    need_attn: bool = False) -> tuple[Tensor, TransformerState]:
        x = self._embed(self.tgt_embed, prev[:, None], "tgt", start=state.step)  # (rows, 1, D)
        self_mask, rotary = self.positions.decoder(state.step, 1, prev.device)
        new_kv, attn = [], None
        last = len(self.decoder) - 1
        for i, (layer, kv, cache) in enumerate(zip(self.decoder, enc.cross_kv, state.self_kv)):
            x, kv_step, layer_attn = layer(x, kv, cross_mask(enc), cache=cache, need_attn=need_attn and i == last,
                                           self_mask=self_mask, rotary=rotary, order=state.order)
            new_kv.append(kv_step)
            attn = layer_attn if layer_attn is not None else attn
        logits = self.output_proj(self.decoder_norm(x))[:, 0]  # (rows, V)
        return logits, TransformerState(self_kv=new_kv, step=state.step + 1,
                                        attn=None if attn is None else attn[:, 0])

    def active_parameters(self) -> int:
        """Parameters one token uses: all but, in each MoE layer, the experts it is not routed to."""
        idle = sum((len(m.experts) - m.top_k) * sum(p.numel() for p in m.experts[0].parameters())
                   for m in self.modules() if isinstance(m, MoEFeedForward))
        return self.num_parameters() - idle

    @torch.no_grad()
    def cross_attention_maps(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Cross-attention probabilities [layers, B, H, T, S] of every decoder layer and head
        in a teacher-forced pass over ``tgt_in`` [B, T] (BOS + output), for inspection.
        ``decode_step`` keeps only the head-averaged last layer; this sees them all."""
        enc = self.encode(src, src_mask)
        queries: list[Tensor] = []  # per layer, the cross-attention query projection (B, T, D)
        hooks = [layer.cross_attn.q_proj.register_forward_hook(lambda _mod, _inp, out: queries.append(out))
                 for layer in self.decoder]
        try:
            self.decode(tgt_in, enc)
        finally:
            for hook in hooks:
                hook.remove()
        mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        maps = [layer.cross_attn.weights(layer.cross_attn._split(q), keys, mask)  # (B, H, T, S)
                for layer, q, (keys, _) in zip(self.decoder, queries, enc.cross_kv)]
        return torch.stack(maps)
