"""The PyTorch search engine behind ``Translator``: loaded models (an ensemble when several)
on the options' device and dtype, searched with ``search.py``.

An engine is what ``Translator`` needs besides its options: ``src_vocab``, ``tgt_vocab``,
``max_positions`` (longer inputs are truncated), ``device`` (where source ids are padded),
``description`` (one line for the console) and ``search(src, src_mask)``. The CTranslate2
engine (``nmtkit/ctranslate2/engine.py``) offers the same.
"""
from __future__ import annotations

from typing import Sequence

import torch

from nmtkit.decoding.ensemble import EnsembleModel
from nmtkit.decoding.search import Hypothesis, beam_search, greedy_search, sample
from nmtkit.device import resolve_device, resolve_dtype
from nmtkit.errors import ConfigError
from nmtkit.files import sha256_file


def inference_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype weights are cast to for translation: ``auto`` is bf16 on a CUDA device that
    has it and float32 on CPU (where bf16 must be asked for)."""
    if name == "auto" and device.type == "cpu":
        return torch.float32
    if name == "int8":  # float32 weights, then quantised (TorchEngine)
        if device.type != "cpu":
            raise ConfigError("--dtype int8 runs on CPU only (use --device cpu)")
        return torch.float32
    return resolve_dtype(name, device)


def load_models(model_dirs: Sequence[str], device: torch.device) -> list:
    """Load model directories for translation; an ensemble must share both vocabularies."""
    from nmtkit.modeldir import load_model_dir

    if not model_dirs:
        raise ConfigError("no model given (-m MODEL_DIR)")
    loaded = [load_model_dir(path, device=device) for path in model_dirs]
    first = loaded[0]
    for path, item in zip(model_dirs[1:], loaded[1:]):
        for side in ("src_vocab", "tgt_vocab"):
            if sha256_file(getattr(item, side).path) != sha256_file(getattr(first, side).path):
                raise ConfigError(f"cannot ensemble {path} with {model_dirs[0]}: their "
                                  f"{side.replace('_vocab', '')} SentencePiece models differ")
    return loaded


class TorchEngine:
    """Loaded models (``nmtkit.modeldir.LoadedModel``) moved, in place, to ``options.device``
    and ``options.dtype``, set to eval mode, and searched as the options say."""

    def __init__(self, loaded_models: Sequence, options) -> None:
        if not loaded_models:
            raise ConfigError("no model given (-m MODEL_DIR)")
        self.device = resolve_device(options.device)
        self.dtype = inference_dtype(options.dtype, self.device)
        models = [item.model.to(device=self.device, dtype=self.dtype).eval() for item in loaded_models]
        if options.dtype == "int8":
            from nmtkit.models.quantize import quantize_int8

            models = [quantize_int8(model) for model in models]
        self.model = models[0] if len(models) == 1 else EnsembleModel(models)
        self.max_positions = self.model.max_positions
        self.src_vocab, self.tgt_vocab = loaded_models[0].src_vocab, loaded_models[0].tgt_vocab
        self.options = options
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(options.seed)
        dtype = "int8" if options.dtype == "int8" else str(self.dtype).replace("torch.", "")
        self.description = f"on {self.device} in {dtype}"

    @classmethod
    def open(cls, model_dirs: Sequence[str], options) -> "TorchEngine":
        """Load ``model_dirs`` (on the CPU: the constructor moves them once); bad device or
        dtype settings fail before any model loads."""
        inference_dtype(options.dtype, resolve_device(options.device))
        return cls(load_models(model_dirs, torch.device("cpu")), options)

    def search(self, src, src_mask) -> list[list[Hypothesis]]:
        o = self.options
        common = dict(lenpen=o.lenpen, max_len_a=o.max_len_a, max_len_b=o.max_len_b, min_len=o.min_len,
                      need_attn=o.alignments)
        if o.sample:
            return sample(self.model, src, src_mask, topk=o.topk, topp=o.topp, temperature=o.temperature,
                          nbest=o.nbest, generator=self.generator, **common)
        if o.beam_size == 1:
            return greedy_search(self.model, src, src_mask, **common)
        return beam_search(self.model, src, src_mask, o.beam_size, nbest=o.nbest, **common)
