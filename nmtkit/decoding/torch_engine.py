"""The PyTorch search engine behind ``Translator``: loaded models (an ensemble when several)
on the options' device and dtype, searched with ``search.py``.

An engine is what ``Translator`` needs besides its options: ``src_vocab``, ``tgt_vocab``,
``max_positions`` (longer inputs are truncated), ``description`` (one line for the console),
``batch_workers`` (search calls that may run at once, on threads of their own), ``batch(sources)``
(a batch of source ids as its ``search`` takes them: here padded tensors on the device; the
CTranslate2 engine takes the ids as they are, and needs no torch), ``search(*batch)`` (with
``prefixes=`` and ``constraints=`` per sentence when a batch has them), ``constrained_search`` (whether it
takes constraints), ``with_options(options)`` (the same loaded model under other decode
settings, for a server whose requests choose them) and ``reseed(seed)`` (sampling restarted:
each chunk of a file samples from a seed of its own). The CTranslate2 engine
(``nmtkit/ctranslate2/engine.py``) offers the same.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch

from nmtkit.decoding.batching import pad_sources
from nmtkit.decoding.ensemble import EnsembleModel
from nmtkit.decoding.options import SearchSettings
from nmtkit.decoding.search import Hypothesis, beam_search, greedy_search, sample
from nmtkit.errors import ConfigError
from nmtkit.models.base import Seq2Seq
from nmtkit.runtime.device import resolve_device, resolve_dtype
from nmtkit.storage.files import sha256_file


def inference_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype weights are cast to for translation: ``auto`` is what training's ``auto`` is,
    bf16 on GPUs that have it and on CPUs with bf16 units (AMX, AVX-512 bf16), float32
    elsewhere. On a Zen 4 the quickstart model's beam 4 ran 1.35x float32's speed in bf16 at
    -0.12 test BLEU, and its translations did not depend on the batch (benchmarks/RESULTS.md,
    "Translate's default dtype"). ``--dtype int8`` (``models/quantize.py``) is an option, not
    ``auto``'s choice (RESULTS.md, "int8 scaled per row", says why)."""
    if name == "int8":  # float32 weights, then quantised (TorchEngine)
        if device.type != "cpu":
            raise ConfigError("--dtype int8 runs on CPU only (use --device cpu)")
        return torch.float32
    return resolve_dtype(name, device)


def placement(options) -> tuple[torch.device, torch.dtype]:
    """Where and in what type the options say to translate, resolved once per engine (before
    any model loads: a --workers the device cannot use is refused here)."""
    device = resolve_device(options.device)
    if options.workers > 1 and device.type != "cpu":
        raise ConfigError(f"--workers applies to decoding on a CPU: on {device} batches are searched one at a time")
    return device, inference_dtype(options.dtype, device)


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


def input_limit(model: Seq2Seq) -> int:
    """The most source pieces translation reads: the position table's length, or for a model
    without one (RoPE, ALiBi, recurrence) its ``max_positions`` setting all the same, so one
    runaway line (a minified file, a missing newline) cannot take hours or all memory."""
    members = getattr(model, "members", [model])  # an ensemble: its tightest member
    return min(m.max_positions if m.max_positions is not None else m.cfg.max_positions for m in members)


class TorchEngine:
    """A model in eval mode on ``device``, searched as the options say. ``from_loaded`` and
    ``open`` make one for translation; validation during training makes one around the live
    model, so dev BLEU decodes with translate's search and settings (translate's Linear layers
    are packed for oneDNN on a CPU, ``models/prepack.py``: the same products up to rounding)."""

    constrained_search = True  # beam_search takes lexical constraints

    def __init__(self, model: Seq2Seq, src_vocab, tgt_vocab, options, device: torch.device,
                 description: str = "") -> None:
        self.model, self.src_vocab, self.tgt_vocab = model.eval(), src_vocab, tgt_vocab
        self.options, self.device, self.description = options, device, description
        self.max_positions = model.max_positions
        self.input_limit = input_limit(model)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(options.seed)
        self.bound_search = bind_search(options, self.generator)

    @classmethod
    def from_loaded(cls, loaded_models: Sequence, options) -> "TorchEngine":
        """Loaded models (``nmtkit.modeldir.LoadedModel``; an ensemble when several) moved, in
        place, to ``options.device`` and ``options.dtype``."""
        return cls._placed(loaded_models, options, *placement(options))

    @classmethod
    def open(cls, model_dirs: Sequence[str], options) -> "TorchEngine":
        """Load ``model_dirs`` on the CPU and move them once; bad device or dtype settings fail
        before any model loads."""
        device, dtype = placement(options)
        return cls._placed(load_models(model_dirs, torch.device("cpu")), options, device, dtype)

    @classmethod
    def _placed(cls, loaded_models: Sequence, options, device: torch.device, dtype: torch.dtype) -> "TorchEngine":
        from nmtkit.models.prepack import prepack_linears, unpack_linears

        if not loaded_models:
            raise ConfigError("no model given (-m MODEL_DIR)")
        for item in loaded_models:  # a model translated before starts plain again: cast, quantised, packed anew
            unpack_linears(item.model)
        models = [item.model.to(device=device, dtype=dtype) for item in loaded_models]
        shown = str(dtype).replace("torch.", "")
        if options.dtype == "int8":
            from nmtkit.models.quantize import int8_available, quantize_int8

            models = [quantize_int8(model.eval()) for model in models]
            shown = "int8" if int8_available() else "int8 (a scale per batch: this torch or CPU lacks fbgemm's kernels)"
        elif device.type == "cpu" and not options.compile:  # compiled code cannot take oneDNN's packed weights
            for model in models:
                prepack_linears(model.eval(), dtype)
        return cls(models[0] if len(models) == 1 else EnsembleModel(models), loaded_models[0].src_vocab,
                   loaded_models[0].tgt_vocab, options, device, f"on {device} in {shown}")

    @property
    def batch_workers(self) -> int:
        """How many search calls ``Translator`` may run at once (``parallel.py``): on a CPU the
        options' ``workers``, 0 meaning one per thread; one on a GPU, when sampling (one random
        stream, drawn in order) and with a compiled decoder."""
        o = self.options
        if self.device.type != "cpu" or o.sample or o.compile:
            return 1
        return o.workers or torch.get_num_threads()

    def with_options(self, options) -> "TorchEngine":
        """The same model (device, dtype, weights shared) searched with other decode settings."""
        return TorchEngine(self.model, self.src_vocab, self.tgt_vocab, options, self.device, self.description)

    def reseed(self, seed: int) -> None:
        """Restart sampling from ``seed`` (per chunk of a file, so a resumed run samples alike)."""
        self.generator.manual_seed(seed)

    def batch(self, sources: Sequence[Sequence[int]]) -> tuple:
        """What ``search`` takes for these source ids: right-padded ids and their mask on the device."""
        return pad_sources(sources, self.device)

    def search(self, src, src_mask, **targets) -> list[list[Hypothesis]]:
        """Hypotheses per sentence; ``targets``: ``prefixes`` and/or ``constraints`` per sentence
        (pieces; see ``search.py``), given only when some sentence of the batch has them."""
        return self.bound_search(self.model, src, src_mask, **targets)  # each search enters inference mode itself


def bind_search(o, generator: torch.Generator) -> Callable[..., list[list[Hypothesis]]]:
    """The search ``o`` (TranslateOptions) asks for, with all its settings bound once:
    ``search(model, src, src_mask)``."""
    settings = SearchSettings.of(o)
    if o.sample:
        return functools.partial(sample, settings=settings, generator=generator)
    beam = functools.partial(beam_search, settings=settings)
    if o.beam_size > 1:
        return beam
    greedy = functools.partial(greedy_search, settings=settings)

    def greedy_unless_constrained(model, src, src_mask, constraints=None, **targets):
        """Greedy search; a batch with constraints takes beam search of beam 1 (the same
        pieces for its unconstrained sentences), which knows how to meet them."""
        if constraints is None:
            return greedy(model, src, src_mask, **targets)
        return beam(model, src, src_mask, constraints=constraints, **targets)

    return greedy_unless_constrained
