"""`nmtkit import SRC -o MODEL`: a Hugging Face MarianMT directory (or Hub id) as an nmtkit
model directory, which every command then uses as one nmtkit trained.

Read: config.json, model.safetensors (or pytorch_model.bin, loaded as plain tensors only, with
weights_only=True: no code runs), source.spm, target.spm, vocab.json, target_vocab.json
(separate vocabularies), generation_config.json and tokenizer_config.json when present.
Written (modeldir.py): the weights renumbered to our ids (marian_weights.py), both
SentencePiece models under nmtkit's names (spm.src.model, spm.tgt.model), their id maps beside
them (spm.src.ids.json, spm.tgt.ids.json: data/mapped_vocab.py), a config.json whose
``imported_from`` says where the model came from, checksums.json.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Optional

from nmtkit.config import DecodeConfig
from nmtkit.data.mapped_vocab import id_map_of, write_id_map
from nmtkit.data.vocab import spm_files
from nmtkit.errors import ConfigError, DataError, NmtkitError
from nmtkit.storage.files import sha256_file, temp_beside
from nmtkit.pretrained import marian_layout as layout
from nmtkit.pretrained.marian_weights import to_nmtkit

HUB_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "source.spm", "target.spm", "vocab.json",
             "target_vocab.json", "generation_config.json", "tokenizer_config.json")
MAX_JSON_BYTES = 64 << 20


def read_json_file(path: Path, required: bool = True) -> Optional[dict]:
    if not path.is_file():
        if required:
            raise DataError(f"{path.parent}: no {path.name} (a MarianMT directory has config.json, "
                            f"model.safetensors, source.spm, target.spm and vocab.json)")
        return None
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise DataError(f"{path}: too large for a {path.name}")
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise DataError(f"{path}: not valid JSON ({type(err).__name__})") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: expected a JSON object")
    return value


def read_marian_weights(directory: Path) -> dict:
    """The state dict of ``directory``: safetensors read directly, a .bin only as plain tensors."""
    import torch

    safetensors, pickle = directory / "model.safetensors", directory / "pytorch_model.bin"
    if safetensors.is_file():
        from safetensors.torch import load_file

        try:
            return load_file(str(safetensors))
        except Exception as err:  # safetensors raises its own error types across versions
            raise DataError(f"{safetensors}: not a readable safetensors file ({str(err)[:200]})") from None
    if pickle.is_file():
        try:
            weights = torch.load(str(pickle), map_location="cpu", weights_only=True)
        except Exception as err:  # an UnpicklingError for anything but tensors (code, other objects)
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise DataError(f"{pickle}: not a plain tensor file, refused (weights_only: {first})") from None
        if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
            raise DataError(f"{pickle}: not a state dict of tensors")
        return weights
    raise DataError(f"{directory}: no model.safetensors (or pytorch_model.bin)")


def fetch(source: str) -> tuple[Path, dict]:
    """A local directory as it is; otherwise a Hub id fetched into huggingface_hub's cache (the
    cached copy when offline), pytorch_model.bin only when no model.safetensors came (a second
    call: a repository with both would otherwise download the weights twice). Returns the
    directory and what to record of its origin."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path, {"source": str(path.resolve())}
    if path.exists() or source.count("/") != 1 or source.startswith((".", "/", "~")):
        raise ConfigError(f"{source}: not a MarianMT directory (nor a Hub id such as Helsinki-NLP/opus-mt-en-de)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise NmtkitError(f"{source} is not a directory; fetching Hub ids needs huggingface_hub: "
                          f"pip install 'nmtkit[hf]'") from None
    try:
        fetched = snapshot_download(source, allow_patterns=[name for name in HUB_FILES if name != "pytorch_model.bin"])
        if not (Path(fetched) / "model.safetensors").is_file():
            fetched = snapshot_download(source, allow_patterns=list(HUB_FILES))  # the rest is cached by now
    except Exception as err:  # offline and not cached, unknown repository, ... (hub error types vary)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise NmtkitError(f"cannot fetch {source} from the Hugging Face Hub and it is not cached ({first})") from None
    return Path(fetched), {"source": source, "hub_id": source, "revision": Path(fetched).name}


def _vocabularies(directory: Path, config: dict, tokenizer: dict) -> tuple[dict, dict, bool]:
    """(source vocab, target vocab, joint): piece -> Marian id, as MarianTokenizer reads them."""
    src = read_json_file(directory / "vocab.json")
    separate = bool(tokenizer.get("separate_vocabs")) or (
        config.get("share_encoder_decoder_embeddings") is False and (directory / "target_vocab.json").is_file())
    if not separate:
        return src, src, True
    tgt = read_json_file(directory / "target_vocab.json", required=False)
    if tgt is None:
        raise DataError(f"{directory}: separate vocabularies but no target_vocab.json")
    return src, tgt, False


def _decode_settings(generation: Optional[dict], config: dict) -> dict:
    """The decode defaults ``generate`` would use: generation_config.json's settings (config.json's
    where that file is missing, as transformers falls back): its beam and length limit. HF's
    max_length counts the decoder start token, and, with ``forced_eos_token_id``, the EOS forced
    at the limit, which it scores 0: our limit is 2 pieces fewer, that EOS free (``eos_at_limit``);
    without it, generate ends an output at max_length without EOS: 1 fewer, and no EOS scored.
    Its min_length counts the start token too (min_new_tokens, which wins, does not)."""
    source = generation if generation is not None else config
    decode = DecodeConfig()
    decode.eos_at_limit = "free"  # generate never scores an EOS at the length limit
    forced = source.get("forced_eos_token_id") is not None
    beams, length = source.get("num_beams"), source.get("max_length")
    if isinstance(beams, int) and 1 <= beams <= 1000:
        decode.beam_size = beams
    if isinstance(length, int) and 2 <= length <= 10_002:
        decode.max_len_a, decode.max_len_b = 0.0, length - (2 if forced else 1)
    shortest, new = source.get("min_length", 0), source.get("min_new_tokens")
    shortest = new if isinstance(new, int) else shortest - 1 if isinstance(shortest, int) else 0
    decode.min_len = min(max(shortest, 0), 10_000)
    return dataclasses.asdict(decode)


def import_marian(source: str, out_dir: str | Path) -> Path:
    """Convert the MarianMT model ``source`` (a directory or a Hub id) into the model directory ``out_dir``."""
    from nmtkit.modeldir import load_weights, model_dir_problem, save_model_dir, unique_state
    from nmtkit.models.build import build_model
    from nmtkit.storage.outputs import check_output_dir

    out_dir = check_output_dir(out_dir, model_dir_problem)
    directory, origin = fetch(source)
    config = read_json_file(directory / "config.json")
    cfg = layout.model_config(config, str(directory / "config.json"))
    tokenizer = read_json_file(directory / "tokenizer_config.json", required=False) or {}
    src_vocab, tgt_vocab, joint = _vocabularies(directory, config, tokenizer)
    for name in ("source.spm", "target.spm"):
        if not (directory / name).is_file():
            raise DataError(f"{directory}: no {name}")
    orders = {"src": layout.id_order(src_vocab, str(directory / "vocab.json")),
              "tgt": layout.id_order(tgt_vocab, str(directory / ("vocab.json" if joint else "target_vocab.json")),
                                     config.get("decoder_start_token_id"), config.get("eos_token_id"))}
    if orders["tgt"][2] != tgt_vocab["<pad>"]:
        raise DataError(f"{directory / 'config.json'}: decoder_start_token_id {orders['tgt'][2]} is not the "
                        f"<pad> id {tgt_vocab['<pad>']}: not the MarianMT layout nmtkit imports")
    weights = to_nmtkit(read_marian_weights(directory), cfg, config, orders, str(directory))
    model = build_model(cfg, len(orders["src"]), len(orders["tgt"]), random_init=False)  # every weight loaded next
    load_weights(model, {name: weights[name] for name in unique_state(model)}, directory)
    files = {name: sha256_file(directory / name) for name in HUB_FILES if (directory / name).is_file()}
    meta = {"imported_from": {"format": "marian", **origin, "files": files},
            "src_lang": str(tokenizer.get("source_lang") or ""), "tgt_lang": str(tokenizer.get("target_lang") or ""),
            "decode": _decode_settings(read_json_file(directory / "generation_config.json", required=False), config)}
    out_dir.parent.mkdir(parents=True, exist_ok=True)  # as export does: -o models/NAME in a fresh checkout
    with temp_beside(out_dir, directory=True) as scratch:  # nmtkit's names: vocab.from finds them
        models = [scratch / name for name in spm_files(False)]  # spm.src.model, spm.tgt.model
        for side, model_file, original, vocab, append_eos in zip(
                ("src", "tgt"), models, ("source.spm", "target.spm"), (src_vocab, tgt_vocab), (True, False)):
            shutil.copyfile(directory / original, model_file)
            write_id_map(id_map_of(model_file), layout.pieces_in_order(vocab, orders[side]), orders[side], append_eos)
        return save_model_dir(model, cfg, out_dir, models[0], models[1], meta)
