"""What a training run trains on, recorded in RUN_DIR/data.json (``RunDir.data_record``) when it starts.

Checkpoints hold a position in the training ids and weights whose vocabulary ids mean
particular pieces: resumed on re-prepared data, a run would go on with another vocabulary
at a meaningless data position (its loss jumps, and nothing else says why). So a run
records the SentencePiece models' and the encoded training ids' checksums and counts;
``train`` refuses to resume when they changed and ``prepare`` warns when it changes them
under a run. This module is that record's one reader and writer.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from nmtkit.data.ids import ParallelIds
from nmtkit.storage.files import atomic_write_text, read_json_dict, sha256_file


def prepared_settings(cfg) -> dict:
    """The recipe settings prepared/ is made from: ``data`` (without the corpora's weights,
    which training applies) and ``vocab`` (without ``workers``, a speed; with ``vocab.from``
    also without the SentencePiece training keys, which the reused models decide). ``prepare``
    records them in manifest.json; ``train`` refuses a recipe that asks for others, which it would
    otherwise accept and silently ignore (``train r.yaml vocab.size=4000`` on an 8k prepare)."""
    from nmtkit.config.schema import SPM_TRAINING_KEYS

    tree = cfg.to_dict()
    data = {**tree["data"], "corpora": [{k: v for k, v in c.items() if k != "weight"} for c in tree["data"]["corpora"]]}
    unused = {"workers", *(SPM_TRAINING_KEYS if tree["vocab"]["from"] else ())}
    return {"data": data, "vocab": {k: v for k, v in tree["vocab"].items() if k not in unused}}


def with_defaults(recorded: dict) -> dict:
    """Recorded settings with the keys an older nmtkit did not have at the values it used then
    (defaults, or ``LEGACY_VALUES`` where a default changed), so a key added later is not a
    difference and one whose default changed is compared with what was really done."""
    import dataclasses

    from nmtkit.config import Config, CorpusConfig
    from nmtkit.config.schema import SPM_TRAINING_KEYS

    legacy = Config.legacy_tree()
    defaults = {"data": legacy["data"], "vocab": {k: v for k, v in legacy["vocab"].items() if k != "workers"}}
    vocab = recorded.get("vocab")
    if isinstance(vocab, dict) and vocab.get("from"):  # the reused models decide these: not recorded
        defaults["vocab"] = {k: v for k, v in defaults["vocab"].items() if k not in SPM_TRAINING_KEYS}
    corpus = {k: v for k, v in dataclasses.asdict(CorpusConfig()).items() if k != "weight"}

    def merge(default, value):
        if isinstance(default, dict) and isinstance(value, dict):
            return {**default, **{k: merge(default.get(k), v) for k, v in value.items()}}
        return value

    filled = merge(defaults, recorded)
    corpora = filled.get("data", {}).get("corpora")
    if isinstance(corpora, list):
        filled["data"]["corpora"] = [merge(corpus, c) for c in corpora]
    return filled


def settings_changes(recorded: dict, current: dict, prefix: str = "") -> list[str]:
    """``key: recorded -> current`` for each dotted key whose value differs."""
    out = []
    for key in sorted(set(recorded) | set(current), key=str):
        old, new = recorded.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            out += settings_changes(old, new, f"{prefix}{key}.")
        elif old != new:
            out.append(f"{prefix}{key}: {json.dumps(old, ensure_ascii=False)} -> {json.dumps(new, ensure_ascii=False)}")
    return out


def identity(spm_models: dict[str, Path], train: ParallelIds) -> dict:
    """Checksums of the SentencePiece model(s) and of the training ids, with their counts."""
    return {"spm": {name: sha256_file(path) for name, path in sorted(spm_models.items())},
            "train": {"sha256": train.digest(), "pairs": len(train), "src_tokens": int(len(train.src)),
                      "tgt_tokens": int(len(train.tgt))}}


def changes(old: dict, new: dict) -> list[str]:
    """What differs between two identities, in words (empty when the data is the same)."""
    out = []
    old_spm, new_spm = old.get("spm", {}), new["spm"]
    for name in sorted(set(old_spm) | set(new_spm)):
        if old_spm.get(name) != new_spm.get(name):
            state = "is new" if name not in old_spm else "is gone" if name not in new_spm else "was retrained"
            out.append(f"SentencePiece model {name} {state}")
    old_train, new_train = old.get("train", {}), new["train"]
    counts = [f"{key.replace('_', ' ')} {old_train.get(key)} -> {new_train[key]}"
              for key in ("pairs", "src_tokens", "tgt_tokens") if old_train.get(key) != new_train[key]]
    if counts:
        out.append(f"train.npz has other counts ({', '.join(counts)})")
    elif old_train.get("sha256") != new_train["sha256"]:
        out.append("train.npz holds other token ids (same counts)")
    return out


def read_record(path: Path, warn: Callable[[str], None] = lambda message: None) -> Optional[dict]:
    """The identity a run recorded at ``path``, or None when it has none (a run of an older
    nmtkit) or when it is damaged (said through ``warn``: there is nothing to compare with then)."""
    if not path.exists():
        return None
    record = read_json_dict(path)
    if isinstance(record, dict) and isinstance(record.get("spm"), dict) and isinstance(record.get("train"), dict):
        return record
    warn(f"{path} is damaged: the prepared data is not compared with what the run started on")
    return None


def write_record(path: Path, ident: dict) -> None:
    atomic_write_text(path, json.dumps(ident, indent=1) + "\n")
