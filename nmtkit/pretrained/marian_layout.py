"""What a Hugging Face MarianMT model is, in nmtkit's terms: its config as a ModelConfig,
its vocabulary as an id map, its tensor names as ours. Shared by import and export, so
that the two directions cannot disagree (no torch here beyond tensor reshuffling).

Facts this relies on (transformers' ``modeling_marian.py`` / ``tokenization_marian.py``):
- post-norm layers (norm after each residual), no norm after either stack; LayerNorm eps 1e-5;
- token embeddings times sqrt(d_model) when ``scale_embedding``; sinusoidal positions, all
  sines then all cosines, counted from 0 on both sides, not scaled, not stored in the weights;
- q/k/v/out projections and fc1/fc2 all with biases; ``activation_function`` relu, gelu
  (erf) or swish (SiLU); logits = lm_head(x) + ``final_logits_bias``;
- ``share_encoder_decoder_embeddings``: one table for both sides (``model.shared``), else
  separate vocabularies (``decoder_vocab_size``, target_vocab.json); ``tie_word_embeddings``:
  lm_head is the decoder's table;
- decoding starts from ``decoder_start_token_id`` (the pad id, the last of vocab.json);
  sources end in ``</s>``; a multilingual model's ``>>xx<<`` code is the first source token.
"""
from __future__ import annotations

from typing import Optional

from nmtkit.config import ModelConfig
from nmtkit.errors import DataError

# Marian's activation_function -> our model.ffn
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu"}
ACTIVATION_NAMES = {"relu": "relu", "gelu": "gelu", "silu": "swish"}
SPECIAL_PIECES = ("<unk>", "</s>", "<pad>")
ADDED_PAD = "<nmtkit:pad>"  # our PAD: a row the Marian model does not have (padding only)

ENC_LAYER = {"self_attn_layer_norm": "attn_block.norm", "self_attn.out_proj": "self_attn.out_proj",
             "fc1": "ffn.fc_in", "fc2": "ffn.fc_out", "final_layer_norm": "ffn_block.norm"}
DEC_LAYER = {"self_attn_layer_norm": "self_block.norm", "self_attn.out_proj": "self_attn.out_proj",
             "encoder_attn.q_proj": "cross_attn.q_proj", "encoder_attn.out_proj": "cross_attn.out_proj",
             "encoder_attn_layer_norm": "cross_block.norm",
             "fc1": "ffn.fc_in", "fc2": "ffn.fc_out", "final_layer_norm": "ffn_block.norm"}
# fused projections: ours -> Marian's parts, in our order
FUSED = {"encoder": {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")},
         "decoder": {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                     "cross_attn.kv_proj": ("encoder_attn.k_proj", "encoder_attn.v_proj")}}


def _int(config: dict, key: str, where: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise DataError(f"{where}: {key} must be a non-negative integer, not {value!r}")
    return value


def model_config(config: dict, where: str) -> ModelConfig:
    """Our ModelConfig for a MarianMT ``config.json``; a setting we cannot express is a DataError naming it."""
    if config.get("model_type") != "marian":
        raise DataError(f"{where}: a {config.get('model_type')!r} model, not MarianMT (model_type 'marian'); "
                        f"nmtkit imports MarianMT models only")
    for ours, enc, dec in (("heads", "encoder_attention_heads", "decoder_attention_heads"),
                           ("ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim")):
        if _int(config, enc, where) != _int(config, dec, where):
            raise DataError(f"{where}: {enc} ({config[enc]}) differs from {dec} ({config[dec]}): "
                            f"nmtkit's model.{ours} is one value for both stacks")
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise DataError(f"{where}: activation_function {activation!r} is not one nmtkit has "
                        f"({', '.join(ACTIVATIONS)})")
    if config.get("normalize_before") or config.get("add_final_layer_norm"):
        raise DataError(f"{where}: pre-norm MarianMT variants (normalize_before) are not imported")
    shared = config.get("share_encoder_decoder_embeddings", True) is not False
    tied = config.get("tie_word_embeddings", True) is not False
    tie = "all" if shared and tied else "decoder" if tied else "none"
    return ModelConfig(
        arch="transformer", d_model=_int(config, "d_model", where), ffn_dim=config["encoder_ffn_dim"],
        heads=config["encoder_attention_heads"], encoder_layers=_int(config, "encoder_layers", where),
        decoder_layers=_int(config, "decoder_layers", where), dropout=float(config.get("dropout", 0.1)),
        attention_dropout=float(config.get("attention_dropout", 0.0)),
        activation_dropout=float(config.get("activation_dropout", 0.0)), pre_norm=False, norm="layernorm",
        ffn=ACTIVATIONS[activation], embed_scale=bool(config.get("scale_embedding", False)),
        positions="sinusoidal", sinusoid_layout="halves", output_bias=True, tie_embeddings=tie,
        max_positions=_int(config, "max_position_embeddings", where))


def id_order(vocab: dict, where: str, start: Optional[int] = None, eos: Optional[int] = None) -> list[Optional[int]]:
    """Marian id of each of our ids: our PAD, unk, bos (the decoder start: Marian's pad), eos,
    then every other piece in Marian's order. ``vocab`` maps piece -> Marian id. Our PAD is an
    added row (None), except in a model nmtkit exported, which carries it as ``ADDED_PAD``."""
    ids = sorted(vocab.values())
    if ids != list(range(len(vocab))):
        raise DataError(f"{where}: ids must number the pieces 0 .. {len(vocab) - 1} once each")
    missing = [piece for piece in SPECIAL_PIECES if piece not in vocab]
    if missing:
        raise DataError(f"{where}: no {missing[0]} piece (a MarianMT vocabulary has <unk>, </s> and <pad>)")
    start = vocab["<pad>"] if start is None else start
    eos = vocab["</s>"] if eos is None else eos
    for name, value in (("decoder_start_token_id", start), ("eos_token_id", eos)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(vocab):
            raise DataError(f"{where}: config.json's {name} {value!r} is not one id of its {len(vocab)} pieces")
    specials = [vocab["<unk>"], start, eos]
    if len(set(specials)) < 3:
        raise DataError(f"{where}: <unk>, the decoder start and </s> must be three different ids")
    own_pad = vocab.get(ADDED_PAD)  # an nmtkit export: its padding row is a piece of the model
    if own_pad in specials:
        raise DataError(f"{where}: {ADDED_PAD} shares an id with <unk>, the decoder start or </s>")
    return [own_pad, *specials, *(i for i in range(len(vocab)) if i not in specials and i != own_pad)]


def pieces_in_order(vocab: dict, order: list[Optional[int]]) -> list[str]:
    by_id = {i: piece for piece, i in vocab.items()}
    return [ADDED_PAD if i is None else by_id[i] for i in order]


def language_codes(vocab: dict) -> list[str]:
    return [piece for piece in vocab if piece.startswith(">>") and piece.endswith("<<")]
