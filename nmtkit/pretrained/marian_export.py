"""`nmtkit export MODEL --format marian -o DIR`: a Transformer as a Hugging Face MarianMT
directory that ``MarianMTModel.from_pretrained`` and ``MarianTokenizer.from_pretrained`` load.

What MarianMT cannot express is refused naming the setting (``marian_problem``). Our
interleaved sinusoids (the paper's) are Marian's sines-then-cosines up to an order of the
model dimensions, so a model trained with them is exported with every residual-stream
dimension permuted (embeddings, projections, norms alike): the same function, exactly.
An imported model goes back under its own ids (its id maps); a model trained here keeps
ours, with vocab.json naming BOS "<pad>" (Marian starts decoding from the pad id) and our
PAD "<nmtkit:pad>" (both never generated: generation_config's bad_words_ids).
Written beside the weights: config.json, generation_config.json, tokenizer_config.json,
vocab.json (and target_vocab.json for separate vocabularies), source.spm, target.spm,
nmtkit-marian.json (what we exported, from where) and checksums.json.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import torch

from nmtkit.storage.checksums import MANIFEST, write_manifest
from nmtkit.errors import ConfigError, NmtkitError
from nmtkit.storage.files import atomic_write_text, read_regular, replace_directory, temp_beside
from nmtkit.pretrained.marian_layout import ACTIVATION_NAMES, ADDED_PAD
from nmtkit.pretrained.marian_weights import to_marian
from nmtkit.specials import BOS, EOS, PAD, UNK

META = "nmtkit-marian.json"  # not nmtkit.json: that names a CTranslate2 export
FILES = frozenset({"config.json", "generation_config.json", "tokenizer_config.json", "vocab.json",
                   "target_vocab.json", "source.spm", "target.spm", "model.safetensors", META, MANIFEST})
OUR_NAMES = {PAD: ADDED_PAD, UNK: "<unk>", BOS: "<pad>", EOS: "</s>"}


def marian_problem(cfg) -> Optional[str]:
    """The first setting of ``cfg`` MarianMT cannot hold, as 'model.KEY=VALUE: why' (None: all fit)."""
    checks = [(cfg.arch != "transformer", f"model.arch={cfg.arch}: MarianMT is a Transformer"),
              (cfg.pre_norm, "model.pre_norm=true: MarianMT layers are post-norm"),
              (cfg.norm != "layernorm", f"model.norm={cfg.norm}: MarianMT normalises with LayerNorm"),
              (cfg.positions != "sinusoidal", f"model.positions={cfg.positions}: MarianMT has sinusoidal positions"),
              (cfg.ffn not in ACTIVATION_NAMES, f"model.ffn={cfg.ffn}: MarianMT's feed-forward is relu, gelu "
                                                f"or swish"),
              (cfg.moe_experts > 0, f"model.moe_experts={cfg.moe_experts}: MarianMT layers have one dense "
                                    f"feed-forward"),
              (cfg.key_size != cfg.d_model // cfg.heads, f"model.key_dim={cfg.key_dim}: MarianMT's heads are "
                                                         f"d_model / heads wide"),
              (cfg.d_model % 2 == 1, f"model.d_model={cfg.d_model}: sinusoids need an even width")]
    return next((why for bad, why in checks if bad), None)


def halves_order(dim: int) -> torch.Tensor:
    """Residual dimensions in Marian's order: our even (sine) dimensions, then our odd (cosine) ones."""
    return torch.cat([torch.arange(0, dim, 2), torch.arange(1, dim, 2)])


def permute_residual(state: dict, order: torch.Tensor) -> dict:
    """``state`` with its residual-stream dimensions taken in ``order``: rows of the Linear
    layers writing to the stream, columns of those reading it, embeddings and norm vectors."""
    d = len(order)
    out = {}
    for name, tensor in state.items():
        writes = name.endswith(("out_proj.weight", "out_proj.bias", "fc_out.weight", "fc_out.bias", "norm.weight",
                                "norm.bias"))
        if name.endswith("embed.weight"):
            tensor = tensor[:, order]
        elif writes:
            tensor = tensor[order]
        if name.endswith(("qkv_proj.weight", "q_proj.weight", "kv_proj.weight", "fc_in.weight",
                          "output_proj.weight")) and tensor.size(-1) == d and "embed" not in name:
            tensor = tensor[:, order]
        out[name] = tensor.contiguous()
    return out


def _orders(loaded) -> dict:
    """Marian's id of each of our ids per side: an imported model's own, else ours unchanged."""
    return {side: list(getattr(vocab, "original_ids", range(len(vocab))))
            for side, vocab in (("src", loaded.src_vocab), ("tgt", loaded.tgt_vocab))}


def _vocab_json(vocab, order: list) -> dict:
    pieces = vocab.pieces(range(len(vocab)))
    if not hasattr(vocab, "original_ids"):
        pieces = [OUR_NAMES.get(i, piece) for i, piece in enumerate(pieces)]
    return {piece: theirs for piece, theirs in zip(pieces, order) if theirs is not None}


def _config(cfg, orders: dict, tgt_vocab: dict) -> dict:
    pad, eos = tgt_vocab["<pad>"], tgt_vocab["</s>"]
    return {"model_type": "marian", "architectures": ["MarianMTModel"], "d_model": cfg.d_model,
            "encoder_layers": cfg.encoder_layers, "decoder_layers": cfg.decoder_layers,
            "encoder_attention_heads": cfg.heads, "decoder_attention_heads": cfg.heads,
            "encoder_ffn_dim": cfg.ffn_dim, "decoder_ffn_dim": cfg.ffn_dim,
            "activation_function": ACTIVATION_NAMES[cfg.ffn], "scale_embedding": cfg.embed_scale,
            "max_position_embeddings": cfg.max_positions, "dropout": cfg.dropout,
            "attention_dropout": cfg.attention_dropout, "activation_dropout": cfg.activation_dropout,
            "vocab_size": sum(i is not None for i in orders["src"]),
            "decoder_vocab_size": sum(i is not None for i in orders["tgt"]),
            "share_encoder_decoder_embeddings": cfg.tie_embeddings == "all",
            "tie_word_embeddings": cfg.tie_embeddings != "none", "pad_token_id": pad,
            "decoder_start_token_id": pad, "eos_token_id": eos, "forced_eos_token_id": eos,
            "is_encoder_decoder": True, "dtype": "float32"}


def export_marian(model_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``model_dir`` as the MarianMT directory ``out_dir`` (a temp sibling renamed into place)."""
    from nmtkit.modeldir import load_model_dir, saved_decode, state_dict_for_save, write_weights
    from nmtkit.storage.outputs import check_output_dir

    out_dir = check_output_dir(out_dir, export_dir_problem)
    loaded = load_model_dir(model_dir)
    cfg = loaded.model_cfg
    if marian_problem(cfg):
        raise ConfigError(f"{model_dir}: cannot export to MarianMT: {marian_problem(cfg)}")
    state = state_dict_for_save(loaded.model)
    state.update({name: t.detach().cpu() for name, t in loaded.model.state_dict().items()
                  if name.endswith("embed.weight") or name.startswith("output_proj")})
    if cfg.sinusoid_layout == "interleaved":
        state = permute_residual(state, halves_order(cfg.d_model))
    orders = _orders(loaded)
    vocabs = {side: _vocab_json(vocab, orders[side])
              for side, vocab in (("src", loaded.src_vocab), ("tgt", loaded.tgt_vocab))}
    config = _config(cfg, orders, vocabs["tgt"])
    joint = config["share_encoder_decoder_embeddings"]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with temp_beside(out_dir, directory=True) as tmp:
        write_weights(tmp / "model.safetensors", to_marian(state, cfg, orders))  # metadata format "pt", as HF wants
        for side, name in (("src", "source.spm"), ("tgt", "target.spm")):
            shutil.copyfile(loaded.src_vocab.path if side == "src" else loaded.tgt_vocab.path, tmp / name)
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "vocab.json", vocabs["src"])
        if not joint:
            _write_json(tmp / "target_vocab.json", vocabs["tgt"])
        _write_json(tmp / "tokenizer_config.json", {
            "tokenizer_class": "MarianTokenizer", "separate_vocabs": not joint, "unk_token": "<unk>",
            "eos_token": "</s>", "pad_token": "<pad>", "model_max_length": cfg.max_positions,
            "source_lang": loaded.meta.get("src_lang") or None, "target_lang": loaded.meta.get("tgt_lang") or None})
        banned = [[config["pad_token_id"]]] + ([[vocabs["tgt"][ADDED_PAD]]] if ADDED_PAD in vocabs["tgt"] else [])
        decode = saved_decode(loaded.meta, model_dir)
        # min_new_tokens is our min_len (both block EOS before that many output pieces); no length_penalty:
        # generate's (logprob / L ** alpha) is not our GNMT lenpen, so generate keeps its own default
        _write_json(tmp / "generation_config.json", {
            "bad_words_ids": banned, "decoder_start_token_id": config["pad_token_id"],
            "eos_token_id": config["eos_token_id"], "forced_eos_token_id": config["eos_token_id"],
            "pad_token_id": config["pad_token_id"], "num_beams": decode.beam_size,
            "min_new_tokens": decode.min_len, "max_length": cfg.max_positions})
        _write_json(tmp / META, {"format": "marian", "source_model": str(Path(model_dir).resolve()),
                                 "source_weights_sha256": loaded.meta.get("weights_sha256")})
        write_manifest(tmp, [path.name for path in tmp.iterdir() if path.is_file()])
        replace_directory(tmp, out_dir)
    return out_dir


def _write_json(path: Path, value: dict) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def export_dir_problem(path: Path) -> Optional[str]:
    """Why ``path`` is not a MarianMT export nmtkit wrote (None: it is one, so -o may replace it)."""
    try:  # a regular file of a record's size (a named pipe there would wait forever), parsed within depth
        meta = json.loads(read_regular(path / META, error=ConfigError).decode("utf-8"))
        assert meta["format"] == "marian"
    except (NmtkitError, ValueError, TypeError, KeyError, AssertionError, RecursionError):
        return f"is not a MarianMT export of nmtkit (no readable {META})"
    for entry in sorted(path.iterdir()):
        if entry.name not in FILES or entry.is_symlink() or not entry.is_file():
            return f"holds {entry.name}, which is not part of a MarianMT export"
    return None
