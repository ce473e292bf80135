"""Build a model from its config: one explicit branch per architecture, no registry."""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from nmtkit.config import ModelConfig
from nmtkit.errors import NmtkitError
from nmtkit.models.base import Seq2Seq

# Every random fill a module's initialisation can call: nn.init's functions (each dispatches
# here as itself while a mode is active) and the tensor methods they end in.
RANDOM_FILLS = frozenset({
    torch.Tensor.uniform_, torch.Tensor.normal_, nn.init.uniform_, nn.init.normal_, nn.init.trunc_normal_,
    nn.init.xavier_uniform_, nn.init.xavier_normal_, nn.init.kaiming_uniform_, nn.init.kaiming_normal_,
    nn.init.orthogonal_,
})


class _SkipRandomFills(TorchFunctionMode):
    """Random fills left undone (the tensor keeps what ``torch.empty`` gave it); everything else,
    computed buffers and constant fills included, runs as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in RANDOM_FILLS:  # nn.init's functions dispatch with the tensor as a keyword
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, random_init: bool = True) -> Seq2Seq:
    """The model ``cfg`` describes. A size within the recipe's ranges may still not fit this
    machine's memory: that is one line naming the model's size, not an allocator traceback.

    ``random_init=False`` is for a caller about to load every weight (``modeldir.load_weights``
    checks that the file holds exactly the model's tensors): the random initialisation it would
    overwrite is skipped, which was most of the time a translation spent building its model
    (a fill per weight, twice for Linear layers). Its weights hold garbage until loaded."""
    try:
        with contextlib.nullcontext() if random_init else _SkipRandomFills():
            return _build(cfg, src_vocab_size, tgt_vocab_size)
    except (RuntimeError, MemoryError) as err:
        if not (isinstance(err, MemoryError) or "can't allocate memory" in str(err) or "out of memory" in str(err)):
            raise
        total = parameter_counts(cfg, src_vocab_size, tgt_vocab_size)["total"]
        raise NmtkitError(f"not enough memory to build the model ({total:,} parameters, {total * 4 / 2**30:.1f} GiB "
                          f"in float32): make model dimensions, layers or vocab.size smaller") from None


def _build(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> Seq2Seq:
    if cfg.arch == "transformer":
        from nmtkit.models.transformer import Transformer

        return Transformer(cfg, src_vocab_size, tgt_vocab_size)
    if cfg.arch == "rnn":
        from nmtkit.models.rnn import RNNSeq2Seq

        return RNNSeq2Seq(cfg, src_vocab_size, tgt_vocab_size)
    raise ValueError(f"unknown architecture {cfg.arch!r}")


def parameter_table(model: Seq2Seq) -> dict[str, int]:
    """Parameter counts by part (embeddings, encoder, decoder, other); tied tensors once."""
    seen: set[int] = set()
    counts = {"embeddings": 0, "encoder": 0, "decoder": 0, "other": 0}
    for name, param in model.named_parameters():  # named_parameters() skips tied duplicates
        if id(param) in seen:
            continue
        seen.add(id(param))
        part = ("embeddings" if "embed" in name or "output_proj" in name else
                "encoder" if name.startswith("encoder") else
                "decoder" if name.startswith("decoder") else "other")
        counts[part] += param.numel()
    counts["total"] = sum(counts.values())
    return counts


def parameter_counts(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> dict[str, int]:
    """Total and active-per-token parameters of the model ``cfg`` describes, counted on the meta
    device (no memory, milliseconds even for a big model). A model that routes tokens to some of
    its weights (Mixture of Experts) says how many are active; in a dense one every weight is."""
    import torch

    with torch.device("meta"):
        model = _build(cfg, src_vocab_size, tgt_vocab_size)
    total = parameter_table(model)["total"]
    active = model.active_parameters() if hasattr(model, "active_parameters") else total
    return {"total": total, "active": int(active)}
