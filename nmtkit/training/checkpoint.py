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
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from nmtkit.config import TrainConfig
from nmtkit.errors import CheckpointError, ConfigError, NmtkitError
from nmtkit.runlog import is_count, is_finite_number
from nmtkit.storage.checksums import read_manifest, verify
from nmtkit.storage.files import (atomic_write_text, remove_stale_temps_in, restore_parked, sha256_file,
                                  temp_beside)
from nmtkit.modeldir import (CONFIG, check_weights, load_model_dir, model_config_from_meta, model_dir_problem,
                             read_json, read_meta, read_model_weights, read_weights, save_model_dir,
                             state_dict_for_save, write_weights)
from nmtkit.workdir import RunDir

TRAINER_TENSORS, TRAINER_JSON = "trainer.safetensors", "trainer.json"
# best/ as validated, until the checkpoint of its step is saved (trainer.py): a kill never leaves a
# best/ of an update past the checkpoint the run resumes from
BEST_STAGED = ".best.nmtkit-staged"
STEP_DIR = re.compile(r"^step_(\d{8,})$")  # as save_checkpoint names them: step_%08d


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
    threads: int = 0  # CPU threads the run trains with (weights depend on the count); 0: not recorded (GPU, older)
    processes: int = 0  # processes the run trained on (train.update_freq counts per process); 0: not recorded (older)
    # each process's unlogged sums since the last train record (loss, nll, tokens, steps, seconds, MoE
    # router stats), so the first record after a resume averages the same updates an uninterrupted run's does
    log_window: list = field(default_factory=list)


def checkpoint_step(path: Path) -> int:
    """The update count of a checkpoint directory (its name, step_N)."""
    return int(STEP_DIR.match(path.name).group(1))


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Complete-looking checkpoint directories, oldest first."""
    root = RunDir(Path(run_dir)).checkpoints
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := STEP_DIR.match(p.name)) and p.name == f"step_{int(m.group(1)):08d}" and p.is_dir()]
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
        if not is_finite_number(value) or value < 0:
            raise ValueError(f"optimizer scalar {name} must be a non-negative number, got {value!r}")
        state.setdefault(int(idx), {})[key] = value
    for group in info["param_groups"]:
        if not isinstance(group.get("params"), list) or not all(is_count(i) for i in group["params"]):
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


_COUNTERS = ("step", "epoch", "batch_in_epoch", "epoch_batches", "best_step", "bad_validations", "skipped_steps",
             "threads", "processes")


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
    if not is_finite_number(state.train_seconds) or state.train_seconds < 0:
        raise ValueError(f"train_seconds must be a non-negative number, got {state.train_seconds!r}")
    if not is_finite_number(state.train_flops) or state.train_flops < 0:
        raise ValueError(f"train_flops must be a non-negative number, got {state.train_flops!r}")
    if state.best_score is not None and not is_finite_number(state.best_score):
        raise ValueError(f"best_score must be a number or null, got {state.best_score!r}")
    if not isinstance(state.log_window, list) or not all(map(_window, state.log_window)):
        raise ValueError("log_window must list each process's sums (loss, nll, tokens, steps, seconds, router)")
    return state


def _window(value) -> bool:
    """One process's unlogged sums as ``Trainer._window_state`` writes them."""
    if not isinstance(value, dict) or set(value) - {"loss", "nll", "tokens", "steps", "seconds", "router"}:
        return False
    if not all(is_finite_number(value.get(k)) for k in ("loss", "nll")) or \
            not all(is_count(value.get(k)) for k in ("tokens", "steps")):
        return False
    if "seconds" in value and not (is_finite_number(value["seconds"]) and value["seconds"] >= 0):
        return False
    router = value.get("router")
    if router is None:
        return True
    if not isinstance(router, dict) or set(router) != {"layers", "sums"}:
        return False
    layers, sums = router["layers"], router["sums"]
    return (isinstance(layers, list) and all(isinstance(name, str) for name in layers) and isinstance(sums, list)
            and len(sums) == len(layers) and all(isinstance(row, list) and len(row) == len(sums[0]) > 4
                                                 and all(map(is_finite_number, row)) for row in sums))


def _setting(value) -> bool:
    """An optimizer setting as torch keeps them: a flag, null, a non-negative number or a
    list of them (betas)."""
    if isinstance(value, list):
        return all(_setting(item) for item in value)
    return value is None or isinstance(value, bool) or (is_finite_number(value) and value >= 0)


class OtherModel(CheckpointError):
    """A checkpoint whose weights have other names or shapes than the model built from the
    recipe: the model or vocabulary settings changed, not the checkpoint (see ``check_fits``)."""


def check_fits(ck: LoadedCheckpoint, model, optimizer) -> None:
    """A CheckpointError when ``ck``'s tensors cannot be the state of ``model`` and ``optimizer``,
    so that resume falls back to an older checkpoint instead of failing (or silently going
    wrong) at the first step; ``OtherModel`` when its weights are named or shaped as another
    model's (every checkpoint of the run is then, so none is skipped as damaged)."""
    expected = {name: tuple(t.shape) for name, t in state_dict_for_save(model).items()}
    saved = {name: tuple(t.shape) for name, t in ck.weights.items()}
    if expected != saved:
        differ = sorted(set(expected) ^ set(saved)) or sorted(k for k in expected if expected[k] != saved[k])
        name = differ[0]
        raise OtherModel(f"{ck.path}: {name} is {_shape(saved.get(name))} there, {_shape(expected.get(name))} in the "
                         f"model the recipe builds")
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


def _shape(shape) -> str:
    return "absent" if shape is None else f"of shape {shape}"


def latest_checkpoint(run_dir: Path, warn=None,
                      check: Optional[Callable[[LoadedCheckpoint], None]] = None) -> Optional[LoadedCheckpoint]:
    """The newest readable checkpoint that passes ``check`` (which raises CheckpointError for
    one that cannot continue this run, ConfigError for a recipe that cannot continue any);
    damaged newer ones are reported through ``warn``."""
    for path in reversed(checkpoint_dirs(run_dir)):
        try:
            loaded = load_checkpoint(path)
            if check is not None:
                check(loaded)
            return loaded
        except ConfigError:
            raise
        except NmtkitError as err:
            if warn is not None:
                warn(f"skipping damaged checkpoint {path.name}: {err}")
    return None


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a checkpoint save_checkpoint wrote (its checksums.json lists
    trainer.json; one of an nmtkit from before checksums has trainer.json and config.json),
    not a directory of the user's that happens to be named like one."""
    try:
        listed = read_manifest(path, CheckpointError)
    except CheckpointError:
        return False
    if listed is None:
        return (path / TRAINER_JSON).is_file() and (path / CONFIG).is_file()
    return TRAINER_JSON in listed


def prune_checkpoints(run_dir: Path, keep_last: int, protect: tuple[Path, ...] = ()) -> None:
    """Delete all but the newest ``keep_last`` checkpoints (never one in ``protect``, nor a
    directory that is not a checkpoint). Each is first renamed to a temporary name of ours, so
    a kill mid-delete leaves no half-deleted ``step_N``, and the next start removes the rest."""
    dirs = [path for path in checkpoint_dirs(run_dir) if path in protect or is_checkpoint(path)]
    for path in dirs[:-keep_last] if keep_last > 0 else []:
        if path not in protect:
            with temp_beside(path, directory=True) as doomed:
                os.replace(path, doomed)  # onto the empty directory temp_beside made; removed as the block ends


_LEGACY_DELETING = re.compile(r"^\.step_\d{8,}\.deleting$")  # a pruned checkpoint, as an older nmtkit hid it
_LEGACY_OLD = re.compile(r"^\.(.+)\.old$")  # where an older nmtkit parked the copy it replaced


def tidy_run_dir(run_dir: Path) -> None:
    """Finish what a killed trainer left half-done in ``run_dir`` (only its writer may call this):
    a model directory parked by ``replace_directory`` goes back in place, and the temporary
    files and directories of dead nmtkit processes (a half-written checkpoint, a pruned one)
    are removed. Only names nmtkit gives, of processes of this user on this machine that are
    gone, are touched: anything else there is left as it is. An older nmtkit parked best/ and
    checkpoints as ``.best.old`` and ``.step_N.old``, promising that a resumed run moves them
    back: one is, when it is a complete copy and nothing is in its place."""
    run = RunDir(Path(run_dir))
    for parent in (run.path, run.checkpoints):
        if not parent.is_dir():
            continue
        remove_stale_temps_in(parent)
        for path in parent.iterdir():
            parked = _PARKED.match(path.name)
            if not parked or not (STEP_DIR.match(parked.group(1)) if parent == run.checkpoints
                                  else parked.group(1) in (run.best.name, run.averaged.name, BEST_STAGED)):
                if parent == run.checkpoints and _LEGACY_DELETING.match(path.name) and path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                elif _legacy_parked(path, parent == run.checkpoints):
                    os.replace(path, parent / _LEGACY_OLD.match(path.name).group(1))
            elif "-" in parked.group(2):  # .X.nmtkit-old-HOST-PID-RANDOM: only once its process is gone
                restore_parked(parent / parked.group(1))
            elif path.is_dir() and not path.is_symlink():  # an older nmtkit's, named by no process: the run's lock
                if os.path.lexists(parent / parked.group(1)):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.replace(path, parent / parked.group(1))


def _legacy_parked(path: Path, checkpoint: bool) -> bool:
    """Whether ``path`` is a copy an older nmtkit parked (``.best.old``; ``.step_N.old`` among the
    checkpoints) that goes back: complete, its own name free. Anything else is the user's."""
    old = _LEGACY_OLD.match(path.name)
    if old is None or not (STEP_DIR.match(old.group(1)) if checkpoint else old.group(1) == "best"):
        return False
    if os.path.lexists(path.with_name(old.group(1))) or path.is_symlink() or not path.is_dir():
        return False
    return model_dir_problem(path, (TRAINER_JSON, TRAINER_TENSORS) if checkpoint else ()) is None


_PARKED = re.compile(r"^\.(.+)\.nmtkit-old-([\w-]+)$")


def average_checkpoints(run_dir: str | Path, last: Optional[int] = None, output: Optional[str | Path] = None,
                        warn: Optional[Callable[[str], None]] = None, upto: Optional[int] = None) -> Path:
    """Average the weights of the newest ``last`` checkpoints into a model directory (by default
    as many as the run's ``train.average_last``, saved with each checkpoint); with fewer
    checkpoints than ``last``, all of them, said through ``warn``. ``upto``, a saved step, ignores
    the checkpoints after it, so one long run gives the model a shorter run would have ended with
    (a learning curve without retraining; exact for schedules that do not depend on max_steps).
    Every checkpoint averaged must be of one model over one vocabulary."""
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
    held = f"{run_dir / 'checkpoints'} holds {len(dirs)} checkpoint(s) ({dirs[0].name} to {dirs[-1].name})"
    if upto is not None:
        if upto not in [checkpoint_step(d) for d in dirs]:
            raise CheckpointError(f"--upto {upto}: no checkpoint of step {upto}; {held}: give one of their steps "
                                  f"(a run keeps its last train.keep_last checkpoints)")
        dirs = [d for d in dirs if checkpoint_step(d) <= upto]
    if last is None:
        saved = _reading(dirs[-1], lambda: read_meta(dirs[-1])).get("average_last", TrainConfig().average_last)
        last = max(saved, 1) if isinstance(saved, int) and not isinstance(saved, bool) else TrainConfig().average_last
    if len(dirs) < last and warn is not None:
        scope = f" up to step {upto}" if upto is not None else ""
        warn(f"--last {last}: {run_dir / 'checkpoints'} holds only {len(dirs)} checkpoint(s){scope} "
             f"({dirs[0].name} to {dirs[-1].name}); averaging those {len(dirs)}")
    chosen = dirs[-last:]
    newest = _reading(chosen[-1], lambda: load_model_dir(chosen[-1]))
    vocabulary = _reading(chosen[-1], lambda: _vocabulary(chosen[-1], newest.meta))
    total: dict[str, torch.Tensor] = {}
    for path in chosen:
        weights = _reading(path, lambda: _weights_of_one_model(path, chosen[-1], newest, vocabulary))
        for name, tensor in weights.items():
            acc = total.setdefault(name, torch.zeros_like(tensor, dtype=torch.float64))
            acc += tensor.double()
    averaged = {k: (v / len(chosen)).to(newest.model.state_dict()[k].dtype) for k, v in total.items()}
    meta = {k: v for k, v in newest.meta.items()
            if k not in ("model", "spm", "id_maps", "weights_sha256", "nmtkit_version")}
    meta["averaged_from"] = [p.name for p in chosen]
    return save_model_dir(newest.model, newest.model_cfg, out, chosen[-1] / newest.meta["spm"]["src"],
                          chosen[-1] / newest.meta["spm"]["tgt"], meta, weights=averaged)


def _weights_of_one_model(path: Path, newest_path: Path, newest, vocabulary: dict) -> dict[str, torch.Tensor]:
    """``path``'s weights, after checking that they are of the newest checkpoint's model (the
    same config, tensors and shapes) over its ``vocabulary`` (an id must mean the same piece)."""
    meta = read_meta(path)
    if path != newest_path and model_config_from_meta(meta, path) != newest.model_cfg:
        raise CheckpointError(f"{path} is another model than {newest_path.name} (its model config differs); "
                              f"average checkpoints of one run")
    weights = read_model_weights(path, meta)
    if _vocabulary(path, meta) != vocabulary:
        raise CheckpointError(f"{path} has another vocabulary than {newest_path.name} (other SentencePiece "
                              f"models or id maps); average checkpoints of one run")
    check_weights(newest.model, weights, path)
    return weights


def _vocabulary(path: Path, meta: dict) -> dict:
    """The checksum of each side's SentencePiece model and id map (None: none), as the
    directory's checksums.json lists them (or computed, in a directory from before it)."""
    listed = read_manifest(path, CheckpointError) or {}
    maps = meta.get("id_maps") or {}

    def digest(name: Optional[str]) -> Optional[str]:
        if name is None:
            return None
        return listed[name]["sha256"] if name in listed else sha256_file(path / name)

    return {side: (digest(meta["spm"][side]), digest(maps.get(side))) for side in ("src", "tgt")}


def _reading(path: Path, read: Callable):
    """``read()`` of checkpoint ``path``; a checkpoint that vanished meanwhile (a training still
    running prunes its old checkpoints) is said to have, not called damaged."""
    try:
        return read()
    except (CheckpointError, OSError):
        if path.is_dir():
            raise
    raise CheckpointError(f"{path} vanished while being read: a training of this run is pruning its old "
                          f"checkpoints (train.keep_last); average again, or once it has finished") from None
