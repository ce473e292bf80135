"""Model directories: everything ``translate`` needs and nothing else.

    MODEL_DIR/model.safetensors   weights (tied tensors stored once; no pickle)
    MODEL_DIR/config.json         model config, vocab sizes, languages, weight checksum, metadata
    MODEL_DIR/spm*.model          the SentencePiece model(s)
    MODEL_DIR/spm*.ids.json       an imported model only: its id maps (nmtkit/data/mapped_vocab.py)

    MODEL_DIR/checksums.json      size and sha256 of every file above (nmtkit.storage.checksums)

The directory is written to a temporary sibling and renamed into place, so a reader
never sees half of one. Loading verifies each file it reads against checksums.json and
validates the config with a recipe's rules, so a truncated, corrupt or swapped file is a
one-line ``CheckpointError`` naming it. Directories from before checksums.json keep their
older checks (the weights' sha256 in config.json, the config's rules). This module sits
above both ``models`` (the architecture) and ``data`` (the vocabularies) so that neither
has to import the other.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from nmtkit import __version__
from nmtkit.config import DecodeConfig, ModelConfig, decode_config_from_dict, model_config_from_dict
from nmtkit.data.mapped_vocab import load_vocabs, sibling_id_maps, vocab_files
from nmtkit.data.vocab import Vocab
from nmtkit.errors import CheckpointError, NmtkitError
from nmtkit.storage.checksums import MANIFEST, verify, write_manifest
from nmtkit.storage.files import UMASK, atomic_write_text, read_regular, replace_directory, sha256_file, temp_beside

if TYPE_CHECKING:  # torch and the models load with the weights: reading a directory's metadata needs neither
    import torch

    from nmtkit.models.base import Seq2Seq

WEIGHTS, CONFIG = "model.safetensors", "config.json"
MODEL_FILES = (WEIGHTS, CONFIG)  # besides the SentencePiece model(s) that config.json names


@dataclass
class LoadedModel:
    model: Seq2Seq
    model_cfg: ModelConfig
    src_vocab: Vocab
    tgt_vocab: Vocab
    meta: dict


def unique_state(model: Seq2Seq) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with tied tensors kept once, under their first name."""
    out, seen = {}, set()
    for name, tensor in model.state_dict(keep_vars=False).items():
        key = (tensor.data_ptr(), tensor.shape)
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor
    return out


def state_dict_for_save(model: Seq2Seq) -> dict[str, torch.Tensor]:
    """Weights keyed by name with tied tensors kept once (under their first name), on the CPU."""
    return {name: tensor.detach().to("cpu").contiguous() for name, tensor in unique_state(model).items()}


def _save_file(weights: dict[str, torch.Tensor], filename: str, shown: Path) -> None:
    """safetensors' ``save_file``; an I/O failure (a full disk) is raised as the OSError it is,
    where safetensors gives its own error type with "(os error 28)" in the text."""
    from safetensors.torch import save_file

    try:
        save_file(weights, filename, metadata={"format": "pt", "nmtkit": __version__})
    except Exception as err:
        code = re.search(r"\(os error (\d+)\)", str(err))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(shown)) from err


def write_weights(path: Path, weights: dict[str, torch.Tensor]) -> None:
    with temp_beside(path) as tmp:
        _save_file(weights, str(tmp), path)
        os.chmod(tmp, 0o666 & ~UMASK)  # safetensors makes 0600
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)


def read_weights(path: Path, expected_sha256: Optional[str] = None) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"weights not found: {path}")
    if expected_sha256 and sha256_file(path) != expected_sha256:
        raise CheckpointError(f"{path}: checksum mismatch (truncated or corrupt file)")
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises its own error types across versions
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None


def save_model_dir(model: Seq2Seq, model_cfg: ModelConfig, out_dir: str | Path, spm_src: str | Path,
                   spm_tgt: str | Path, extra_meta: Optional[dict] = None,
                   weights: Optional[dict[str, torch.Tensor]] = None,
                   write_extra: Optional[Callable[[Path], None]] = None) -> Path:
    """Write a self-contained model directory atomically (temp dir + rename). The id maps lying
    beside the SentencePiece models (an imported model's vocabulary: data/mapped_vocab.py) are
    copied along with them.

    ``write_extra(tmp_dir)`` may add files (e.g. trainer state) before the rename, so a
    checkpoint appears complete or not at all.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        with temp_beside(out_dir, directory=True) as tmp:
            weights = weights if weights is not None else state_dict_for_save(model)
            write_weights(tmp / WEIGHTS, weights)
            spm_names = _copy_pair(tmp, (spm_src, spm_tgt))
            id_maps = sibling_id_maps(spm_src, spm_tgt)
            map_names = _copy_pair(tmp, id_maps) if id_maps else None
            meta = {
                "nmtkit_version": __version__,
                "model": dataclasses.asdict(model_cfg),
                "spm": spm_names,
                **({"id_maps": map_names} if map_names else {}),
                "weights_sha256": sha256_file(tmp / WEIGHTS),
                "parameters": model.num_parameters(),
                "active_parameters": model.active_parameters(),  # per token: fewer than all with MoE layers
                **(extra_meta or {}),
            }
            meta["checksums"] = MANIFEST
            if write_extra is not None:
                write_extra(tmp)
            atomic_write_text(tmp / CONFIG, json.dumps(meta, indent=2) + "\n")
            write_manifest(tmp, [path.name for path in tmp.iterdir()])
            replace_directory(tmp, out_dir)
    except OSError as err:  # a full disk, a quota, a read-only file system: a runtime failure
        raise NmtkitError(f"cannot write {out_dir}: {err.strerror or err}; nothing was replaced") from err
    return out_dir


def _copy_pair(directory: Path, paths) -> dict[str, str]:
    """Copy the (source, target) files ``paths`` into ``directory`` (one copy when they are one
    file); their names by side."""
    names = {}
    for side, path in zip(("src", "tgt"), map(Path, paths)):
        names[side] = path.name
        if not (directory / path.name).exists():
            shutil.copyfile(path, directory / path.name)
    return names


MAX_CONFIG_BYTES = 1 << 20  # a model config is a few kB; anything far larger is not one


def read_json(path: Path, what: str) -> Any:
    """A small JSON file nmtkit wrote, or a one-line CheckpointError (too large, too deep, not JSON)."""
    data = read_regular(path, MAX_CONFIG_BYTES, CheckpointError, what)  # a regular file of a config's size
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise CheckpointError(f"{path}: corrupt {what} ({type(err).__name__}: {str(err)[:200]})") from None


def read_meta(model_dir: str | Path) -> dict:
    """config.json of a model directory, verified against checksums.json when the directory
    has one, and checked for the keys every reader relies on."""
    model_dir = Path(model_dir)
    path = model_dir / CONFIG
    if not os.path.lexists(path):
        raise CheckpointError(f"{model_dir}: not a model directory (no {CONFIG})")
    read_regular(path, MAX_CONFIG_BYTES, CheckpointError, "model config")  # not a link to a device, not a pipe
    checked = verify(model_dir, [CONFIG], CheckpointError)
    meta = read_json(path, "model config")
    if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
        if isinstance(meta, dict) and meta.get("model_type") == "marian":  # transformers' own directory
            raise CheckpointError(f"{model_dir} is a Hugging Face MarianMT directory: convert it first with "
                                  f"`nmtkit import {model_dir} -o MODEL`")
        raise CheckpointError(f"{path}: not an nmtkit model config")
    spm = meta.get("spm")
    if not (isinstance(spm, dict) and all(isinstance(spm.get(side), str) and plain_name(spm[side])
                                          for side in ("src", "tgt"))):
        raise CheckpointError(f"{path}: spm must name the src and tgt SentencePiece files of the directory")
    maps = meta.get("id_maps")
    if maps is not None and not (isinstance(maps, dict) and all(isinstance(maps.get(side), str) and
                                                                 plain_name(maps[side]) for side in ("src", "tgt"))):
        raise CheckpointError(f"{path}: id_maps must name the src and tgt id map files of the directory")
    if not checked and meta.get("checksums"):
        raise CheckpointError(f"{model_dir / MANIFEST}: missing ({CONFIG} says the directory has one)")
    return meta


FINDER_LITTER = ".DS_Store"  # what macOS's Finder leaves in any folder it shows: no one's work


def model_dir_problem(path: Path, extra: tuple[str, ...] = ()) -> Optional[str]:
    """Why ``path`` is not a complete model directory as ``save_model_dir`` writes it, with the
    files ``extra`` too (a checkpoint's trainer state); None: it is one, so an explicit ``-o``
    may replace it."""
    try:
        meta = read_meta(path)
    except CheckpointError:
        return f"is not an nmtkit model directory (no readable {CONFIG})"
    expected = {*MODEL_FILES, *vocab_files(meta), *extra}
    missing = sorted(name for name in expected if not (path / name).is_file())
    if missing:
        return f"is an incomplete model directory (no {missing[0]})"
    for entry in sorted(path.iterdir()):  # checksums.json: in every directory written since it exists
        if entry.name == FINDER_LITTER:
            continue
        if entry.name not in {*expected, MANIFEST} or entry.is_symlink() or not entry.is_file():
            return f"holds {entry.name}, which is not part of a model directory"
    return None


def saved_decode(meta: dict, where: Any) -> DecodeConfig:
    """The decode settings a model was trained with (its recipe's ``decode`` section, kept in
    config.json); ``DecodeConfig``'s defaults for a model saved before they were kept."""
    if "decode" not in meta:
        return DecodeConfig()
    try:
        return decode_config_from_dict(meta["decode"])
    except NmtkitError as err:
        raise CheckpointError(f"{where}: bad decode settings ({err})") from None


def plain_name(name: str) -> bool:
    """A file name inside the directory (a config naming ../x or /etc/x is refused)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name


def model_config_from_meta(meta: dict, where: Any) -> ModelConfig:
    """The saved model config, held to the rules a recipe's model section must meet."""
    try:
        return model_config_from_dict(meta["model"], joint_vocab=joint_vocab(meta))
    except NmtkitError as err:
        raise CheckpointError(f"{where}: incompatible model config ({err})") from None


def joint_vocab(meta: dict) -> bool:
    """Whether the rule "tie_embeddings=all needs one vocabulary" holds for the directory: one
    SentencePiece model, or id maps (an imported vocabulary: whoever wrote them, ``nmtkit import``
    or prepare's vocab.from, checked that tied tables share one id map's pieces)."""
    return meta["spm"]["src"] == meta["spm"]["tgt"] or bool(meta.get("id_maps"))


def read_model_weights(model_dir: Path, meta: dict) -> dict[str, torch.Tensor]:
    """The weights of a model directory, after verifying them and its SentencePiece files
    against checksums.json (or, in a directory without one, by the sha256 in config.json)."""
    checked = verify(model_dir, [WEIGHTS, *vocab_files(meta)], CheckpointError)
    return read_weights(model_dir / WEIGHTS, None if checked else meta.get("weights_sha256"))


def load_model_dir(model_dir: str | Path, device: str | torch.device = "cpu",
                   meta: Optional[dict] = None) -> LoadedModel:
    """Rebuild a model from its directory alone (config + safetensors + SentencePiece); ``meta``:
    its config.json as ``read_meta`` gave it, when the caller has read it already."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"model directory not found: {model_dir}")
    meta = read_meta(model_dir) if meta is None else meta
    model_cfg = model_config_from_meta(meta, model_dir / CONFIG)
    weights = read_model_weights(model_dir, meta)
    src_vocab, tgt_vocab = load_vocabs(model_dir, meta)
    from nmtkit.models.build import build_model

    model = build_model(model_cfg, len(src_vocab), len(tgt_vocab), random_init=False)  # every weight loaded next
    load_weights(model, weights, model_dir / WEIGHTS)
    model.to(device).eval()
    return LoadedModel(model, model_cfg, src_vocab, tgt_vocab, meta)


def load_weights(model: Seq2Seq, weights: dict[str, torch.Tensor], where: Any) -> None:
    """Load weights saved by ``state_dict_for_save`` (tied tensors present once)."""
    check_weights(model, weights, where)
    model.load_state_dict(weights, strict=False)


def check_weights(model: Seq2Seq, weights: dict[str, torch.Tensor], where: Any) -> None:
    """CheckpointError unless ``weights`` has exactly the model's tensors, shapes and float types."""
    expected = {name: t.shape for name, t in state_dict_for_save(model).items()}
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{where}: weights do not match the model config "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, tensor in weights.items():
        if expected[name] != tensor.shape:
            raise CheckpointError(f"{where}: {name} has shape {tuple(tensor.shape)}, "
                                  f"the config expects {tuple(expected[name])}")
        if not tensor.is_floating_point():
            raise CheckpointError(f"{where}: {name} holds {tensor.dtype} values, not floating point weights")
