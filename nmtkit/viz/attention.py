"""The attention of one translated sentence: which source pieces each target piece looked at.

The sentence is translated with beam search. Each target row is the attention of the
decoder step that produced that piece (EOS not shown), over the source pieces (columns);
every row sums to 1. The Transformer shows any decoder layer and head through
``Transformer.cross_attention_maps``, a teacher-forced pass over the translation; the RNN
has one attention, the ``state.attn`` that the search collects. Layers and heads are
numbered from 1; the default is the last layer averaged over heads (what ``translate
--alignments`` uses).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from nmtkit.errors import ConfigError, DataError, NmtkitError
from nmtkit.limits import check_range
from nmtkit.specials import cut_source
from nmtkit.viz.figure import check_image_path, new_figure, save_figure

DEFAULT_IMAGE = "attention.png"  # what -o is without one, for an image


@dataclass
class SentenceAttention:
    source_pieces: list[str]
    target_pieces: list[str]
    translation: str
    maps: Tensor  # [layers, heads, T, S] float32 on the CPU; the RNN has one layer and one head

    def check(self, layer: Optional[int], head: Optional[int]) -> int:
        """Validate 1-based ``layer``/``head`` (None: last layer / all heads); the layer index."""
        layers, heads = self.maps.shape[:2]
        layer = layers if layer is None else layer
        if not 1 <= layer <= layers:
            raise ConfigError(f"--layer {layer}: this model has {layers} attention layer(s), numbered from 1")
        if head is not None and not 1 <= head <= heads:
            raise ConfigError(f"--head {head}: this model has {heads} attention head(s), numbered from 1")
        return layer

    def matrix(self, layer: Optional[int] = None, head: Optional[int] = None) -> Tensor:
        """[T, S]: one head of a layer, or (head None) the mean over its heads."""
        per_head = self.maps[self.check(layer, head) - 1]  # (H, T, S)
        return per_head.mean(0) if head is None else per_head[head - 1]

    def heads(self, layer: Optional[int] = None) -> Tensor:
        """[H, T, S]: every head of a layer."""
        return self.maps[self.check(layer, None) - 1]


@torch.inference_mode()
def sentence_attention(loaded, sentence: str, beam_size: int = 4, settings=None, tag: str = "") -> SentenceAttention:
    """Translate ``sentence`` with a ``LoadedModel`` and collect its attention maps. ``settings``
    (a decode section or translate's options: length penalty, length limits) default to
    ``DecodeConfig``'s; ``tag`` (a multilingual model's <2xx>) goes before the sentence, as
    ``translate --target-lang`` puts it, so the maps are those of the translation translate gives."""
    from nmtkit.config.schema import DecodeConfig
    from nmtkit.data.vocab import with_tag
    from nmtkit.decoding.options import SearchSettings
    from nmtkit.decoding.search import beam_search
    from nmtkit.specials import BOS

    model, s = loaded.model, settings if settings is not None else DecodeConfig()
    if not sentence.strip():
        raise DataError("the sentence is empty: nothing to translate")
    ids = loaded.src_vocab.encode(with_tag(sentence, tag))
    if not ids:
        raise DataError("the sentence holds nothing the model's vocabulary encodes: nothing to translate")
    if model.max_positions is not None:
        ids = cut_source(ids, model.max_positions)
    device = next(model.parameters()).device
    src = torch.tensor([ids], dtype=torch.long, device=device)  # (1, S)
    src_mask = torch.ones_like(src, dtype=torch.bool)
    search = SearchSettings.of(s, beam_size=beam_size, nbest=1, need_attn=True)
    best = beam_search(model, src, src_mask, search)[0][0]
    if loaded.model_cfg.arch == "transformer":
        tgt_in = torch.tensor([[BOS] + best.tokens], dtype=torch.long, device=device)  # (1, T + 1)
        maps = model.cross_attention_maps(src, src_mask, tgt_in)[:, 0, :, :len(best.tokens)]  # (L, H, T, S)
    else:  # the RNN's one attention, as the search collected it from decode_step
        maps = best.attention[None, None]  # (1, 1, T, S)
    return SentenceAttention(loaded.src_vocab.pieces(ids), loaded.tgt_vocab.pieces(best.tokens),
                             loaded.tgt_vocab.decode(best.tokens), maps.float().cpu())


def attention_json(att: SentenceAttention, layer: Optional[int] = None, head: Optional[int] = None,
                   grid: bool = False) -> dict:
    """The JSON form: pieces and the [T][S] matrix (with ``grid``: [H][T][S], every head)."""
    layer = att.check(layer, head)
    values = att.heads(layer) if grid else att.matrix(layer, head)
    return {"source_pieces": att.source_pieces, "target_pieces": att.target_pieces,
            "translation": att.translation, "layer": layer,
            "head": "all" if grid else ("mean" if head is None else head),
            "attention": values.double().round(decimals=6).tolist()}


def _auto_size(att: SentenceAttention, columns: int, rows: int) -> tuple[int, int]:
    """Pixels that give every piece a readable cell: ~26 px per piece plus label margins."""
    src, tgt = len(att.source_pieces), len(att.target_pieces)
    width = columns * (26 * src + 140) + 120
    height = rows * (26 * tgt + 140) + 60
    return max(width, 400), max(height, 300)


def _heatmap(ax, matrix: Tensor, att: SentenceAttention, fontsize: float, vmax: float,
             labels: tuple[bool, bool] = (True, True)):
    """Target pieces down, source pieces across (on top), darker = more attention."""
    image = ax.imshow(matrix.numpy(), cmap="Blues", vmin=0.0, vmax=max(vmax, 1e-6), aspect="auto",
                      interpolation="nearest")
    ax.xaxis.tick_top()
    ax.set_xticks(range(len(att.source_pieces)), labels=att.source_pieces if labels[0] else [],
                  rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(att.target_pieces)), labels=att.target_pieces if labels[1] else [], fontsize=fontsize)
    return image


def plot_attention(att: SentenceAttention, out: str | Path, layer: Optional[int] = None,
                   head: Optional[int] = None, grid: bool = False,
                   size: Optional[tuple[int, int]] = None) -> Path:
    """Draw one heatmap (a head, or the head mean) or, with ``grid``, every head of ``layer``."""
    if not att.target_pieces:
        raise NmtkitError("the translation is empty: there is no attention to draw")
    layer = att.check(layer, head)
    fontsize = 9 if max(len(att.source_pieces), len(att.target_pieces)) <= 40 else 6
    if not grid:
        fig = new_figure(*(size or _auto_size(att, 1, 1)))
        ax = fig.subplots()
        matrix = att.matrix(layer, head)
        image = _heatmap(ax, matrix, att, fontsize, float(matrix.max()))
        ax.set_title(f"layer {layer}, {'mean of heads' if head is None else f'head {head}'}", fontsize=10)
        fig.colorbar(image, ax=ax, shrink=0.8)
        return save_figure(fig, out)
    maps = att.heads(layer)
    columns = min(len(maps), 4)
    rows = math.ceil(len(maps) / columns)
    fig = new_figure(*(size or _auto_size(att, columns, rows)))
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for index, ax in enumerate(axes):
        if index >= len(maps):
            ax.set_axis_off()
            continue
        image = _heatmap(ax, maps[index], att, fontsize, float(maps.max()),  # one scale for every head
                         labels=(index < columns, index % columns == 0))
        ax.set_title(f"head {index + 1}", fontsize=10)
    fig.colorbar(image, ax=axes.tolist(), shrink=0.8)
    fig.suptitle(f"layer {layer}: every head")
    return save_figure(fig, out)


def attention_command(model_dir: Path, sentence: str, out: Optional[str], layer: Optional[int], head: Optional[int],
                      grid: bool, fmt: str, beam_size: Optional[int], size: Optional[tuple[int, int]], device: str,
                      console, target_lang: str = "") -> None:
    """``nmtkit attention``: translate one sentence as ``translate`` would (the model's saved
    decode settings, ``beam_size`` where given), then draw its attention at ``out`` (None:
    DEFAULT_IMAGE) or write it as JSON there (None: stdout)."""
    import json

    from nmtkit.decoding.translate import target_tag_for
    from nmtkit.modeldir import CONFIG, load_model_dir, saved_decode
    from nmtkit.models.prepack import prepack_linears
    from nmtkit.runtime.device import resolve_device
    from nmtkit.storage.outputs import check_output_file, open_output

    if fmt not in ("png", "json"):
        raise ConfigError(f"--format {fmt!r}: expected png (an image at -o) or json (at -o, else stdout)")
    if head is not None and grid:
        raise ConfigError("--grid shows every head: leave out --head")
    if fmt == "json" and size is not None:
        raise ConfigError("--size sets the image's pixels: --format json draws no image; leave it out")
    if beam_size is not None:
        check_range("decode.beam_size", beam_size, "--beam-size")
    if fmt == "json":  # -o checked before translating
        target = check_output_file(out)  # None: stdout
    else:
        check_image_path(out or DEFAULT_IMAGE)
    loaded = load_model_dir(model_dir, device=resolve_device(device))
    prepack_linears(loaded.model.eval(), torch.float32)  # on a CPU, translate's packed products (models/prepack.py)
    settings = saved_decode(loaded.meta, Path(model_dir) / CONFIG)  # what translate uses for this model
    tag = target_tag_for(loaded.src_vocab, target_lang)
    att = sentence_attention(loaded, sentence, beam_size or settings.beam_size, settings, tag)
    att.check(layer, head)
    if fmt == "json":
        text = json.dumps(attention_json(att, layer, head, grid), ensure_ascii=False)
        if target is None:
            print(text)
            return
        with open_output(target) as handle:  # atomically, as the image is written
            handle.write((text + "\n").encode("utf-8"))
        console.info(f"wrote {out}")
        return
    console.info(f"translation: {att.translation}")
    console.info(f"wrote {plot_attention(att, out or DEFAULT_IMAGE, layer, head, grid, size)}")
