"""Fine-tuning: a new run that starts from another model directory's weights (``train.init_from``).

Only the weights come along: the optimizer, the schedule and the step counter start afresh.
The model must be the same network (every architecture setting equal; dropout and the MoE
training losses may change) over the same vocabulary (the same SentencePiece files, which
``vocab.from`` gives a prepared directory), else a one-line ConfigError names what differs.
Where a run started from is kept in every model directory it writes (config.json
``init_from``), so ``nmtkit info`` and ``--dry-run`` show it; a resumed run continues from
its own checkpoints and never reads the ``init_from`` directory again.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from nmtkit.config import Config
from nmtkit.errors import ConfigError
from nmtkit.modeldir import CONFIG, load_weights, model_config_from_meta, read_meta, read_model_weights
from nmtkit.storage.files import sha256_file, shown_path

# model settings that shape training only: a fine-tuning run may change them
TRAINING_ONLY = ("preset", "dropout", "attention_dropout", "activation_dropout", "moe_aux_weight", "moe_z_weight",
                 "moe_capacity_factor")


@dataclasses.dataclass(frozen=True)
class InitSource:
    path: Path
    meta: dict  # its config.json

    def record(self) -> dict:
        """What the new run's model directories keep about where they started."""
        return {"path": str(self.path), "step": self.meta.get("step"), "recipe": self.meta.get("recipe"),
                "weights_sha256": self.meta.get("weights_sha256")}


def init_source(cfg: Config) -> Optional[InitSource]:
    """The ``train.init_from`` model directory, checked to hold the recipe's architecture (None
    when the recipe fine-tunes nothing)."""
    if not cfg.train.init_from:
        return None
    path = Path(cfg.train.init_from).expanduser()
    if not (path / CONFIG).is_file():
        raise ConfigError(f"not a model directory (no {CONFIG}): {shown_path(path, 'train.init_from')}")
    meta = read_meta(path)
    theirs = dataclasses.asdict(model_config_from_meta(meta, path / CONFIG))
    ours = dataclasses.asdict(cfg.model)
    differ = [f"model.{key} ({ours[key]} here, {theirs[key]} there)" for key in ours
              if key not in TRAINING_ONLY and ours[key] != theirs[key]]
    if differ:
        raise ConfigError(f"train.init_from: {path} is another architecture: {', '.join(differ)}; "
                          f"fine-tuning keeps the model's architecture")
    return InitSource(path.resolve(), meta)


def check_vocabulary(init: InitSource, src_spm: Path, tgt_spm: Path) -> None:
    """The prepared data must be encoded with the init model's own SentencePiece model(s):
    the same id must mean the same piece."""
    for side, prepared in (("src", src_spm), ("tgt", tgt_spm)):
        theirs = init.path / init.meta["spm"][side]
        if sha256_file(prepared) != sha256_file(theirs):
            raise ConfigError(f"train.init_from: {init.path} has another {side} vocabulary ({theirs.name}) than "
                              f"the prepared data ({prepared}); prepare with vocab.from: {init.path}")


def load_initial_weights(model, init: InitSource, device) -> None:
    """Put the init model's weights (verified against its checksums) into ``model``."""
    weights = read_model_weights(init.path, init.meta)
    load_weights(model, {name: tensor.to(device) for name, tensor in weights.items()}, init.path)


def start_from(init: InitSource, model, src_spm: Path, tgt_spm: Path, device) -> dict:
    """A new fine-tuning run's start: the init model's weights in ``model``, after checking that
    the prepared data uses its vocabulary; returns the record its model directories keep."""
    check_vocabulary(init, src_spm, tgt_spm)
    load_initial_weights(model, init, device)
    return init.record()
