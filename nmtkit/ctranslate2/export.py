"""Export a Transformer model directory to CTranslate2 (``nmtkit export --format ctranslate2``).

The weights go straight from our modules into CTranslate2's Python spec
(``ctranslate2.specs.TransformerSpec``); no other toolkit's converter is involved.

    OUT/model.bin, OUT/config.json, OUT/shared_vocabulary.json   CTranslate2's own files
    OUT/spm*.model                                               our SentencePiece model(s)
    OUT/nmtkit.json                                              what our CTranslate2 engine needs
    OUT/checksums.json                                           size and sha256 of all the above

How our Transformer maps onto the spec:
- post-norm (the paper) or pre-norm: the spec's ``pre_norm`` flag; pre-norm stacks end in
  our final ``encoder_norm`` / ``decoder_norm``, which are the spec's ``layer_norm``.
- sinusoidal (either layout) or learned positions: our own tables are written as the spec's
  position encodings (one per side), so no two sinusoid conventions can disagree; embeddings
  are scaled by sqrt(d_model) in both, or in neither (``embed_scale``).
- RoPE: the spec's rotary self-attention in encoder and decoder (all head dimensions, base
  10000, the half-split pairing: ``rotary_interleave=False``); no position table.
- fused projections line up: self-attention q|k|v is one [3D, D] matrix in both, cross-
  attention is q then a fused k|v [2D, D]; tied embeddings are aliased by CTranslate2.
- an output bias (``output_bias``) is the projection's bias.
- LayerNorm (eps 1e-5) or RMSNorm (eps 1e-6); ReLU, GELU (erf) or SiLU FFN, or SwiGLU as a gated
  FFN whose gate half goes through SiLU ("swish").
- vocabulary: the SentencePiece pieces in the order of our ids, so ids agree one to one;
  our specials (pad 0, unk 1, bos 2, eos 3) are named to CTranslate2 by their pieces.
What the spec cannot represent is refused with a one-line error naming the setting (see
``UNSUPPORTED``): RNN models, ALiBi (the spec's encoder has no ALiBi) and Mixture-of-Experts
layers (its encoder-decoder layers have one dense FFN).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from nmtkit.data.mapped_vocab import vocab_files
from nmtkit.errors import ConfigError, NmtkitError
from nmtkit.modeldir import load_model_dir
from nmtkit.storage.checksums import MANIFEST, write_manifest
from nmtkit.storage.files import atomic_write_text, read_regular, replace_directory, temp_beside

UNSUPPORTED = {  # setting -> why CTranslate2's TransformerSpec cannot hold it (ctranslate2 4.x)
    "positions=alibi": "its TransformerEncoderSpec has no ALiBi (only its decoder does)",
    "moe_experts": "its encoder and decoder layers have one dense feed-forward network, no experts",
    "key_dim": "its attention has one head size for queries, keys and values (d_model / heads)",
}
QUANTIZATIONS = ("float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16")
META = "nmtkit.json"  # our metadata beside CTranslate2's config.json
# what an export directory holds besides the SentencePiece model(s): CTranslate2's files and META
EXPORT_FILES = frozenset({"model.bin", "config.json", "shared_vocabulary.json", "source_vocabulary.json",
                          "target_vocabulary.json", META})
LAYERNORM_EPS, RMSNORM_EPS = 1e-5, 1e-6  # nn.LayerNorm's default; layers.RMSNorm's


def import_ctranslate2():
    """The ctranslate2 module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise NmtkitError("CTranslate2 is not installed: pip install 'nmtkit[ct2]' (or ctranslate2>=4)") from None
    return ctranslate2


def _array(tensor):
    return tensor.detach().to("cpu").float().numpy().copy()


def _linear(spec, linear) -> None:
    spec.weight = _array(linear.weight)
    if linear.bias is not None:
        spec.bias = _array(linear.bias)


def _norm(spec, norm) -> None:
    spec.gamma = _array(norm.weight)
    if getattr(norm, "bias", None) is not None:  # LayerNorm; RMSNorm has no beta
        spec.beta = _array(norm.bias)


def _ffn(spec, ffn, norm) -> None:
    _norm(spec.layer_norm, norm)
    if ffn.kind == "swiglu":  # h = silu(gate) * value, gate the first half of fc_in
        hidden = ffn.fc_out.in_features
        weight, bias = ffn.fc_in.weight, ffn.fc_in.bias
        spec.linear_0.weight, spec.linear_0.bias = _array(weight[:hidden]), _array(bias[:hidden])
        spec.linear_0_noact.weight, spec.linear_0_noact.bias = _array(weight[hidden:]), _array(bias[hidden:])
    else:
        _linear(spec.linear_0, ffn.fc_in)
    _linear(spec.linear_1, ffn.fc_out)


def unsupported_setting(cfg) -> Optional[str]:
    """The first of ``cfg``'s settings CTranslate2 cannot represent, as 'model.KEY=VALUE: why'."""
    if cfg.positions == "alibi":
        return f"model.positions=alibi: {UNSUPPORTED['positions=alibi']}"
    if cfg.moe_experts:
        return f"model.moe_experts={cfg.moe_experts}: {UNSUPPORTED['moe_experts']}"
    if cfg.key_size != cfg.d_model // cfg.heads:
        return f"model.key_dim={cfg.key_dim}: {UNSUPPORTED['key_dim']}"
    return None


def _empty_spec(cfg):
    """The spec's layout for ``cfg``: layers, heads, norms, activation, rotary or table positions."""
    from ctranslate2.specs import common_spec, transformer_spec

    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
                  "silu": common_spec.Activation.SWISH, "swiglu": common_spec.Activation.SWISH}[cfg.ffn]
    shared = dict(pre_norm=cfg.pre_norm, activation=activation, ffn_glu=cfg.ffn == "swiglu",
                  rms_norm=cfg.norm == "rmsnorm")
    if cfg.positions == "rope":  # ROPE_BASE and the half-split pairing of positions.rotate
        from nmtkit.models.positions import ROPE_BASE  # torch: exporting loads the model anyway

        shared.update(rotary_dim=0, rotary_interleave=False, rotary_base=ROPE_BASE)  # 0: every head dimension
    encoder = transformer_spec.TransformerEncoderSpec(cfg.encoder_layers, cfg.heads, **shared)
    if cfg.positions == "rope":
        del encoder.position_encodings  # (the decoder spec leaves it out itself when rotary)
    decoder = transformer_spec.TransformerDecoderSpec(cfg.decoder_layers, cfg.heads, alignment_layer=-1,
                                                      alignment_heads=cfg.heads, **shared)  # mean of all heads
    return transformer_spec.TransformerSpec(encoder, decoder)


def build_spec(model, vocab_pieces: tuple[list[str], list[str]]):
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights and vocabularies."""
    ctranslate2 = import_ctranslate2()
    cfg = model.cfg
    if unsupported_setting(cfg):
        raise ConfigError(f"cannot export to CTranslate2: {unsupported_setting(cfg)}")
    spec = _empty_spec(cfg)
    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = _array(model.src_embed.weight)
    dec.embeddings.weight = _array(model.tgt_embed.weight)
    enc.scale_embeddings = dec.scale_embeddings = cfg.embed_scale  # x sqrt(d_model) or not, as Transformer._embed
    if cfg.positions != "rope":
        enc.position_encodings.encodings = _array(model.positions.table_of("src"))
        dec.position_encodings.encodings = _array(model.positions.table_of("tgt"))
    _linear(dec.projection, model.output_proj)  # with its bias when model.output_bias
    if cfg.pre_norm:
        _norm(enc.layer_norm, model.encoder_norm)
        _norm(dec.layer_norm, model.decoder_norm)
    for layer_spec, layer in zip(enc.layer, model.encoder):
        _norm(layer_spec.self_attention.layer_norm, layer.attn_block.norm)
        _linear(layer_spec.self_attention.linear[0], layer.self_attn.qkv_proj)
        _linear(layer_spec.self_attention.linear[1], layer.self_attn.out_proj)
        _ffn(layer_spec.ffn, layer.ffn, layer.ffn_block.norm)
    for layer_spec, layer in zip(dec.layer, model.decoder):
        _norm(layer_spec.self_attention.layer_norm, layer.self_block.norm)
        _linear(layer_spec.self_attention.linear[0], layer.self_attn.qkv_proj)
        _linear(layer_spec.self_attention.linear[1], layer.self_attn.out_proj)
        _norm(layer_spec.attention.layer_norm, layer.cross_block.norm)
        _linear(layer_spec.attention.linear[0], layer.cross_attn.q_proj)
        _linear(layer_spec.attention.linear[1], layer.cross_attn.kv_proj)
        _linear(layer_spec.attention.linear[2], layer.cross_attn.out_proj)
        _ffn(layer_spec.ffn, layer.ffn, layer.ffn_block.norm)
    src_pieces, tgt_pieces = vocab_pieces
    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(tgt_pieces)
    config = spec.config
    config.unk_token, config.bos_token, config.eos_token = tgt_pieces[1], tgt_pieces[2], tgt_pieces[3]
    config.decoder_start_token = tgt_pieces[2]
    config.add_source_bos = config.add_source_eos = False  # our sources carry no specials
    config.layer_norm_epsilon = RMSNORM_EPS if cfg.norm == "rmsnorm" else LAYERNORM_EPS
    spec.validate()
    return spec, ctranslate2.__version__


def export_dir_problem(path: Path) -> Optional[str]:
    """Why ``path`` is not a complete export as ``export_ctranslate2`` writes it (None: it is
    one, so an explicit ``-o`` may replace it)."""
    try:
        meta = json.loads(read_regular(path / META, error=ConfigError).decode("utf-8"))
        spm = set(map(str, vocab_files(meta)))
    except (NmtkitError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return f"is not a CTranslate2 export of nmtkit (no readable {META})"
    if not (path / "model.bin").is_file():
        return "is an incomplete CTranslate2 export (no model.bin)"
    for entry in sorted(path.iterdir()):
        if entry.name not in EXPORT_FILES | spm | {MANIFEST} or entry.is_symlink() or not entry.is_file():
            return f"holds {entry.name}, which is not part of a CTranslate2 export"
    return None


def export_ctranslate2(model_dir: str | Path, out_dir: str | Path, quantization: Optional[str] = None) -> Path:
    """Write ``model_dir`` as a CTranslate2 model directory ``out_dir`` (atomically: a temp
    sibling renamed into place). ``quantization`` None keeps float32 weights."""
    from nmtkit.storage.outputs import check_output_dir

    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ConfigError(f"--quantization must be one of {', '.join(QUANTIZATIONS)}, not {quantization!r}")
    out_dir = check_output_dir(out_dir, export_dir_problem)
    loaded = load_model_dir(model_dir)
    cfg = loaded.model_cfg
    if cfg.arch != "transformer":
        raise ConfigError(f"{model_dir}: only Transformer models export to CTranslate2 (this is {cfg.arch!r})")
    if unsupported_setting(cfg):  # before any file is written
        raise ConfigError(f"{model_dir}: cannot export to CTranslate2: {unsupported_setting(cfg)}")
    pieces = tuple(vocab.pieces(range(len(vocab))) for vocab in (loaded.src_vocab, loaded.tgt_vocab))
    spec, ct2_version = build_spec(loaded.model, pieces)
    spec.optimize(quantization=quantization)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with temp_beside(out_dir, directory=True) as tmp:
        spec.save(str(tmp))
        for name in vocab_files(loaded.meta):
            shutil.copyfile(Path(model_dir) / name, tmp / name)
        meta = {"format": "ctranslate2", "ctranslate2_version": ct2_version, "quantization": quantization or "float32",
                "source_model": str(Path(model_dir).resolve()), "spm": loaded.meta["spm"],
                **({"id_maps": loaded.meta["id_maps"]} if loaded.meta.get("id_maps") else {}),
                "source_weights_sha256": loaded.meta.get("weights_sha256"),  # is the source still this model?
                "max_positions": loaded.model.max_positions, "heads": cfg.heads,  # None: no limit (RoPE)
                "model": loaded.meta["model"], "checksums": MANIFEST,
                **{k: loaded.meta[k] for k in ("src_lang", "tgt_lang", "decode") if k in loaded.meta}}
        atomic_write_text(tmp / META, json.dumps(meta, indent=2) + "\n")
        write_manifest(tmp, [path.name for path in tmp.iterdir() if path.is_file()])
        replace_directory(tmp, out_dir)
    return out_dir
