"""MarianMT tensors <-> nmtkit Transformer tensors, both ways (names: marian_layout.py).

Rows of the token tables and the output layer are renumbered by the id orders of
``marian_layout.id_order``: our id i is Marian's ``order[i]``; our added PAD row (None) is
zero, with an output bias of ``PAD_BIAS`` so that it takes no probability (exp(-100) is
below float32's resolution next to any real logit) and the log-probabilities of every other
token stay exactly Marian's. Fused projections (q|k|v, k|v) are concatenated on import and
split on export.
"""
from __future__ import annotations

from typing import Optional

import torch

from nmtkit.errors import DataError
from nmtkit.pretrained.marian_layout import DEC_LAYER, ENC_LAYER, FUSED

PAD_BIAS = -100.0
EMBEDDINGS = {"src": ("model.encoder.embed_tokens.weight", "model.shared.weight"),
              "tgt": ("model.decoder.embed_tokens.weight", "model.shared.weight")}


def _rows(table: torch.Tensor, order: list[Optional[int]], fill: float = 0.0) -> torch.Tensor:
    """[len(order), ...] rows of ``table`` in our order; ``fill`` in the added row."""
    index = torch.tensor([0 if i is None else i for i in order])
    out = table.index_select(0, index).clone()
    out[[k for k, i in enumerate(order) if i is None]] = fill
    return out


def _unrows(table: torch.Tensor, order: list[Optional[int]]) -> torch.Tensor:
    """The inverse of ``_rows``: Marian's rows from ours, the added row dropped."""
    out = table.new_zeros(sum(i is not None for i in order), *table.shape[1:])
    for ours, theirs in enumerate(order):
        if theirs is not None:
            out[theirs] = table[ours]
    return out


def _first(weights: dict, names: tuple[str, ...], where: str) -> torch.Tensor:
    for name in names:
        if name in weights:
            return weights[name]
    raise DataError(f"{where}: no {names[0]} tensor (not a MarianMT checkpoint, or a damaged one)")


def _layer_names(stack: str, count: int):
    """(our name, Marian's names) of every tensor of ``stack``'s ``count`` layers."""
    plain = ENC_LAYER if stack == "encoder" else DEC_LAYER
    for i in range(count):
        for theirs, ours in plain.items():
            for kind in ("weight", "bias"):
                yield f"{stack}.{i}.{ours}.{kind}", (f"model.{stack}.layers.{i}.{theirs}.{kind}",)
        for ours, parts in FUSED[stack].items():
            for kind in ("weight", "bias"):
                yield f"{stack}.{i}.{ours}.{kind}", tuple(f"model.{stack}.layers.{i}.{p}.{kind}" for p in parts)


def to_nmtkit(weights: dict, cfg, config: dict, orders: dict, where: str) -> dict[str, torch.Tensor]:
    """Our state dict (every name, tied ones included) from a MarianMT state dict ``weights``."""
    used = set()

    def take(name: str) -> torch.Tensor:
        if name not in weights:
            raise DataError(f"{where}: no {name} tensor (the config.json asks for it)")
        used.add(name)
        return weights[name].float()

    out = {}
    for stack, count in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for ours, parts in _layer_names(stack, count):
            tensors = [take(part) for part in parts]
            if len({t.shape[1:] for t in tensors}) > 1:
                raise DataError(f"{where}: mismatched shapes: {', '.join(parts)} are "
                                f"{' and '.join(str(tuple(t.shape)) for t in tensors)}")
            out[ours] = torch.cat(tensors)
    src, tgt = (_first(weights, EMBEDDINGS[side], where).float() for side in ("src", "tgt"))
    tied = config.get("tie_word_embeddings", True) is not False
    head = tgt if tied else take("lm_head.weight")
    bias = weights.get("final_logits_bias", torch.zeros(1, head.size(0))).float().reshape(-1)
    for name, table, side in (("src", src, "src"), ("tgt", tgt, "tgt"), ("head", head, "tgt"), ("bias", bias, "tgt")):
        pieces = sum(i is not None for i in orders[side])  # Marian's own rows (ours may add a padding row)
        if table.size(0) != pieces:
            raise DataError(f"{where}: mismatched shapes: the {name} table has {table.size(0)} rows, the "
                            f"{'source' if side == 'src' else 'target'} vocabulary {pieces} pieces")
    out["src_embed.weight"] = _rows(src, orders["src"])
    out["tgt_embed.weight"] = _rows(tgt, orders["tgt"])
    out["output_proj.weight"] = _rows(head, orders["tgt"])
    out["output_proj.bias"] = _rows(bias, orders["tgt"], PAD_BIAS)
    used |= {"final_logits_bias", "lm_head.weight", *EMBEDDINGS["src"], *EMBEDDINGS["tgt"]}
    unknown = sorted(name for name in weights if name not in used and "embed_positions" not in name)
    if unknown:
        raise DataError(f"{where}: tensor {unknown[0]} has no place in a MarianMT model nmtkit imports")
    return out


def to_marian(state: dict, cfg, orders: dict) -> dict[str, torch.Tensor]:
    """A MarianMT state dict (tied tensors once, as transformers saves them) from our ``state``."""
    out = {}
    for stack, count in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for ours, parts in _layer_names(stack, count):
            sizes = [state[ours].size(0) // len(parts)] * len(parts)
            for part, tensor in zip(parts, state[ours].split(sizes)):
                out[part] = tensor.contiguous()
    if cfg.tie_embeddings == "all":
        out["model.shared.weight"] = _unrows(state["src_embed.weight"], orders["src"])
    else:
        out["model.encoder.embed_tokens.weight"] = _unrows(state["src_embed.weight"], orders["src"])
        out["model.decoder.embed_tokens.weight"] = _unrows(state["tgt_embed.weight"], orders["tgt"])
    if cfg.tie_embeddings == "none":
        out["lm_head.weight"] = _unrows(state["output_proj.weight"], orders["tgt"])
    if cfg.output_bias:
        out["final_logits_bias"] = _unrows(state["output_proj.bias"], orders["tgt"])[None]
    else:
        out["final_logits_bias"] = state["src_embed.weight"].new_zeros(1, sum(i is not None for i in orders["tgt"]))
    return out
