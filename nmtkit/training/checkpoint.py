"""Training checkpoints: a model directory plus the trainer state for exact resume.

    RUN_DIR/checkpoints/step_00001000/   model.safetensors, config.json, spm*.model (a model dir)
                                         trainer.safetensors  optimizer moments, EMA weights, RNG states
                                         trainer.json         step, data position, best score, checksum
No pickles: tensors live in safetensors, everything else in JSON. A checkpoint is renamed
into place whole; on load its checksums are verified, and resume falls back to the
previous good checkpoint (with a warning) when the newest is damaged.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from nmtkit.config import TrainConfig
from nmtkit.errors import CheckpointError, ConfigError, NmtkitError
from nmtkit.storage.checksums import verify
from nmtkit.storage.files import atomic_write_text, sha256_file
from nmtkit.modeldir import (CONFIG, check_weights, model_config_from_meta, read_json, read_meta, read_model_weights,
                             read_weights, save_model_dir, state_dict_for_save, write_weights)
from nmtkit.workdir import RunDir

TRAINER_TENSORS, TRAINER_JSON = "trainer.safetensors", "trainer.json"
STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class TrainerState:
    """Everything besides weights and tensors that resume needs."""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # batches of this epoch already consumed
    epoch_batches: int = 0  # batches in this epoch (0: unknown, a checkpoint of an older nmtkit)
    best_score: Optional[float] = None
    best_step: int = 0
    bad_validations: int = 0
    skipped_steps: int = 0
    train_seconds: float = 0.0
    train_flops: float = 0.0  # training FLOPs spent so far (models/flops.py): train.max_flops's budget
    loss_scaler: dict = field(default_factory=dict)  # fp16: scale and growth count (precision.py); else empty
    dev_sha256: str = ""  # the dev ids best_score was earned on ("": a checkpoint of an older nmtkit)


def checkpoint_step(path: Path) -> int:
    """The update count of a checkpoint directory (its name, step_N)."""
    return int(STEP_DIR.match(path.name).group(1))


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Complete-looking checkpoint directories, oldest first."""
    root = RunDir(Path(run_dir)).checkpoints
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def _flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for idx, param_state in state["state"].items():
        for key, value in param_state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"opt.{idx}.{key}"] = value.detach().to("cpu").contiguous()
            else:
                scalars[f"{idx}.{key}"] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], info: dict) -> dict:
    """The optimizer state dict from its tensors and trainer.json's part, every value checked
    (ValueError/TypeError): the checksums only say the file is the one written, and an edited
    one rewritten to match must not reach ``load_state_dict`` or the first update."""
    state: dict = {}
    for name, tensor in tensors.items():
        if name.startswith("opt."):
            _, idx, key = name.split(".", 2)
            if key == "step" and (tensor.numel() != 1 or not bool(torch.isfinite(tensor).all()) or tensor.item() < 0):
                raise ValueError(f"optimizer state {idx}.step must be one non-negative number")
            state.setdefault(int(idx), {})[key] = tensor
    for name, value in info["scalars"].items():
        idx, key = name.split(".", 1)
        if not _finite_number(value) or value < 0:
            raise ValueError(f"optimizer scalar {name} must be a non-negative number, got {value!r}")
        state.setdefault(int(idx), {})[key] = value
    for group in info["param_groups"]:
        if not isinstance(group.get("params"), list) or not all(_index(i) for i in group["params"]):
            raise ValueError("an optimizer parameter group must list parameter indices")
        for key, value in group.items():
            if key != "params" and not _setting(value):
                raise ValueError(f"optimizer setting {key} must be a non-negative number, a flag or null, "
                                 f"got {value!r}")
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in info["param_groups"]]
    return {"state": state, "param_groups": groups}


def save_checkpoint(run_dir: Path, model, model_cfg, optimizer, trainer: TrainerState, spm_src: Path,
                    spm_tgt: Path, meta: dict, ema: Optional[dict[str, torch.Tensor]] = None) -> Path:
    """Write checkpoints/step_N atomically. With EMA, the model dir holds the EMA weights
    (what validation and export use) and the raw weights go to the trainer state."""
    raw = state_dict_for_save(model)
    tensors, info = _flatten_optimizer(optimizer.state_dict())
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    if ema is not None:
        tensors.update({f"raw.{k}": v for k, v in raw.items()})

    def write_trainer(tmp: Path) -> None:
        write_weights(tmp / TRAINER_TENSORS, tensors)
        payload = {"trainer": trainer.__dict__, "optimizer": info, "ema": ema is not None,
                   "sha256": sha256_file(tmp / TRAINER_TENSORS)}
        atomic_write_text(tmp / TRAINER_JSON, json.dumps(payload, indent=1) + "\n")

    out = RunDir(Path(run_dir)).checkpoints / f"step_{trainer.step:08d}"
    weights = {k: v.detach().to("cpu").contiguous() for k, v in ema.items()} if ema is not None else raw
    return save_model_dir(model, model_cfg, out, spm_src, spm_tgt, {**meta, "step": trainer.step},
                          weights=weights, write_extra=write_trainer)


@dataclass
class LoadedCheckpoint:
    path: Path
    weights: dict[str, torch.Tensor]  # raw training weights
    ema: Optional[dict[str, torch.Tensor]]
    optimizer: dict
    rng: dict[str, torch.Tensor]
    trainer: TrainerState
    meta: dict


def load_checkpoint(path: Path) -> LoadedCheckpoint:
    """Read and verify one checkpoint directory (CheckpointError if anything is off)."""
    meta = read_meta(path)
    if not (path / TRAINER_JSON).is_file():
        raise CheckpointError(f"{path}: no {TRAINER_JSON} (a model directory, not a training checkpoint)")
    checked = verify(path, [TRAINER_JSON, TRAINER_TENSORS], CheckpointError)
    payload = read_json(path / TRAINER_JSON, "trainer state")
    model_weights = read_model_weights(path, meta)
    sha256 = payload.get("sha256") if isinstance(payload, dict) and not checked else None
    tensors = read_weights(path / TRAINER_TENSORS, sha256)
    try:
        trainer = trainer_state(payload["trainer"])
        optimizer = _unflatten_optimizer(tensors, payload["optimizer"])
        ema_saved = payload["ema"]
    except (TypeError, KeyError, ValueError, AttributeError) as err:
        raise CheckpointError(f"{path / TRAINER_JSON}: unexpected trainer state ({type(err).__name__}: {err})") from None
    _check_step(path, trainer, meta)
    if ema_saved:
        raw = {k[4:]: v for k, v in tensors.items() if k.startswith("raw.")}
        ema = model_weights
    else:
        raw, ema = model_weights, None
    rng = {k[4:]: v for k, v in tensors.items() if k.startswith("rng.")}
    if "torch" not in rng or rng["torch"].dtype != torch.uint8 or rng["torch"].shape != torch.get_rng_state().shape:
        raise CheckpointError(f"{path / TRAINER_TENSORS}: no valid random number generator state")
    return LoadedCheckpoint(path, raw, ema, optimizer, rng, trainer, meta)


def read_trainer_state(path: Path) -> TrainerState:
    """Only the trainer state of checkpoint ``path`` (verified and checked; no tensors read)."""
    verify(path, [TRAINER_JSON], CheckpointError)
    try:
        state = trainer_state(read_json(path / TRAINER_JSON, "trainer state")["trainer"])
    except (TypeError, KeyError, ValueError) as err:
        raise CheckpointError(f"{path / TRAINER_JSON}: unexpected trainer state ({type(err).__name__}: {err})") from None
    _check_step(path, state)
    return state


def _check_step(path: Path, trainer: TrainerState, meta: Optional[dict] = None) -> None:
    """A checkpoint's step is written three times (its directory's name, config.json and
    trainer.json): an edit of one, checksums rewritten to match, must not resume a run at
    another step than the weights were saved at."""
    named = checkpoint_step(path) if STEP_DIR.match(path.name) else trainer.step
    recorded = meta.get("step", trainer.step) if meta is not None else trainer.step
    for where, step in ((f"the directory name {path.name}", named), (f"{CONFIG} (step {recorded})", recorded)):
        if step != trainer.step:
            raise CheckpointError(f"{path / TRAINER_JSON}: step {trainer.step} disagrees with {where}: "
                                  f"an edited checkpoint; move it away")


_COUNTERS = ("step", "epoch", "batch_in_epoch", "epoch_batches", "best_step", "bad_validations", "skipped_steps")


def trainer_state(raw: dict) -> TrainerState:
    """``TrainerState`` from trainer.json, every value checked: a wrong data position or step
    would resume silently at the wrong place (ValueError/TypeError when anything is off)."""
    if not isinstance(raw, dict) or not {"step", "epoch", "batch_in_epoch"} <= set(raw):
        raise ValueError("step, epoch and batch_in_epoch are required")
    # "extra": an always-empty field that checkpoints written before 2026-11 carry
    state = TrainerState(**{key: value for key, value in raw.items() if key != "extra"})
    for name in _COUNTERS:
        value = getattr(state, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if not isinstance(state.dev_sha256, str):
        raise ValueError(f"dev_sha256 must be text, got {state.dev_sha256!r}")
    if state.epoch_batches and state.batch_in_epoch > state.epoch_batches:
        raise ValueError(f"batch_in_epoch {state.batch_in_epoch} is past the end of its epoch "
                         f"({state.epoch_batches} batches)")
    if not _finite_number(state.train_seconds) or state.train_seconds < 0:
        raise ValueError(f"train_seconds must be a non-negative number, got {state.train_seconds!r}")
    if not _finite_number(state.train_flops) or state.train_flops < 0:
        raise ValueError(f"train_flops must be a non-negative number, got {state.train_flops!r}")
    if state.best_score is not None and not _finite_number(state.best_score):
        raise ValueError(f"best_score must be a number or null, got {state.best_score!r}")
    return state


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _setting(value) -> bool:
    """An optimizer setting as torch keeps them: a flag, null, a non-negative number or a
    list of them (betas)."""
    if isinstance(value, list):
        return all(_setting(item) for item in value)
    return value is None or isinstance(value, bool) or (_finite_number(value) and value >= 0)


def check_fits(ck: LoadedCheckpoint, model, optimizer) -> None:
    """A CheckpointError when ``ck``'s tensors cannot be the state of ``model`` and ``optimizer``,
    so that resume falls back to an older checkpoint instead of failing (or silently going
    wrong) at the first step."""
    check_weights(model, ck.weights, ck.path)
    if ck.ema is not None:
        check_weights(model, ck.ema, ck.path)
    params = list(model.parameters())
    saved_groups, our_groups = ck.optimizer["param_groups"], optimizer.state_dict()["param_groups"]
    if [group.get("params") for group in saved_groups] != [group["params"] for group in our_groups]:
        raise CheckpointError(f"{ck.path}: the optimizer state does not match the model's parameters")
    for index, state in ck.optimizer["state"].items():
        for key, value in state.items():
            expected = () if key == "step" else tuple(params[index].shape) if index < len(params) else None
            if isinstance(value, torch.Tensor) and tuple(value.shape) != expected:
                raise CheckpointError(f"{ck.path}: optimizer state {index}.{key} has shape {tuple(value.shape)}, "
                                      f"the model expects {expected}")


def latest_checkpoint(run_dir: Path, warn=None,
                      check: Optional[Callable[[LoadedCheckpoint], None]] = None) -> Optional[LoadedCheckpoint]:
    """The newest readable checkpoint that passes ``check`` (which raises CheckpointError for
    one that cannot continue this run); damaged newer ones are reported through ``warn``."""
    for path in reversed(checkpoint_dirs(run_dir)):
        try:
            loaded = load_checkpoint(path)
            if check is not None:
                check(loaded)
            return loaded
        except NmtkitError as err:
            if warn is not None:
                warn(f"skipping damaged checkpoint {path.name}: {err}")
    return None


def prune_checkpoints(run_dir: Path, keep_last: int, protect: tuple[Path, ...] = ()) -> None:
    """Delete all but the newest ``keep_last`` checkpoints (never one in ``protect``). Each is
    hidden by a rename first, so a kill mid-delete leaves no half-deleted ``step_N``."""
    dirs = checkpoint_dirs(run_dir)
    for path in dirs[:-keep_last] if keep_last > 0 else []:
        if path not in protect:
            doomed = path.with_name(f".{path.name}.deleting")
            shutil.rmtree(doomed, ignore_errors=True)
            os.replace(path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)


_LEFTOVER = re.compile(r"^\.(best|step_\d+)\.(.+)$")


def tidy_run_dir(run_dir: Path) -> None:
    """Finish what a killed trainer left half-done in ``run_dir`` (only its writer may call this).

    ``save_model_dir`` replaces a directory with two renames (``X`` -> ``.X.old``, or
    ``.X.nmtkit-old-RANDOM`` when a ``.X.old`` is in the way, then temp -> ``X``); a kill between
    them leaves only that copy, which is complete and is moved back. Other
    hidden leftovers (temp dirs and files, ``.X.deleting`` of a pruned checkpoint) are removed.
    """
    for parent in (Path(run_dir), RunDir(Path(run_dir)).checkpoints):
        for path in parent.iterdir() if parent.is_dir() else []:
            match = _LEFTOVER.match(path.name)
            if match and path.is_dir():
                parked = match.group(2) == "old" or match.group(2).startswith("nmtkit-old-")  # replace_directory's
                if parked and not (parent / match.group(1)).exists():
                    os.replace(path, parent / match.group(1))
                else:
                    shutil.rmtree(path, ignore_errors=True)
            elif path.name.startswith(".") and path.name.endswith(".tmp") and path.is_file():
                path.unlink(missing_ok=True)


def average_checkpoints(run_dir: str | Path, last: Optional[int] = None, output: Optional[str | Path] = None,
                        warn: Optional[Callable[[str], None]] = None, upto: Optional[int] = None) -> Path:
    """Average the weights of the newest ``last`` checkpoints into a model directory (by default
    as many as the run's ``train.average_last``, saved with each checkpoint); with fewer
    checkpoints than ``last``, all of them, said through ``warn``. ``upto`` ignores checkpoints
    after that step, so one long run gives the model a shorter run would have ended with
    (a learning curve without retraining; exact for schedules that do not depend on max_steps)."""
    from nmtkit.modeldir import load_model_dir, model_dir_problem
    from nmtkit.storage.outputs import check_output_dir

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory not found: {run_dir}")
    out = check_output_dir(output if output is not None else RunDir(run_dir).averaged, model_dir_problem)
    if out.resolve().parent == RunDir(run_dir).checkpoints.resolve():
        raise ConfigError(f"-o {output}: a checkpoint of the run; write the average elsewhere")
    dirs = checkpoint_dirs(run_dir)
    if not dirs:
        raise CheckpointError(f"{run_dir}: no checkpoints to average (expected {run_dir}/checkpoints/step_*)")
    if upto is not None:
        steps = [checkpoint_step(d) for d in dirs]
        dirs = [d for d, step in zip(dirs, steps) if step <= upto]
        if not dirs:
            raise CheckpointError(f"--upto {upto}: the first checkpoint of {run_dir} is step {steps[0]}")
    if last is None:
        saved = read_meta(dirs[-1]).get("average_last", TrainConfig().average_last)
        last = max(saved, 1) if isinstance(saved, int) and not isinstance(saved, bool) else TrainConfig().average_last
    if len(dirs) < last and warn is not None:
        warn(f"--last {last}: {run_dir / 'checkpoints'} holds only {len(dirs)} checkpoint(s) "
             f"({dirs[0].name} to {dirs[-1].name}); averaging those {len(dirs)}")
    chosen = dirs[-last:]
    newest = load_model_dir(chosen[-1])
    total: dict[str, torch.Tensor] = {}
    for path in chosen:
        meta = read_meta(path)
        # every checkpoint must be of the newest one's model: same config, same tensors and shapes
        if path != chosen[-1] and model_config_from_meta(meta, path) != newest.model_cfg:
            raise CheckpointError(f"{path} is another model than {chosen[-1].name} (its model config differs); "
                                  f"average checkpoints of one run")
        weights = read_model_weights(path, meta)
        check_weights(newest.model, weights, path)
        for name, tensor in weights.items():
            acc = total.setdefault(name, torch.zeros_like(tensor, dtype=torch.float64))
            acc += tensor.double()
    averaged = {k: (v / len(chosen)).to(newest.model.state_dict()[k].dtype) for k, v in total.items()}
    meta = {k: v for k, v in newest.meta.items()
            if k not in ("model", "spm", "id_maps", "weights_sha256", "nmtkit_version")}
    meta["averaged_from"] = [p.name for p in chosen]
    return save_model_dir(newest.model, newest.model_cfg, out, chosen[-1] / newest.meta["spm"]["src"],
                          chosen[-1] / newest.meta["spm"]["tgt"], meta, weights=averaged)
