"""Fine-tuning an imported MarianMT model: ``vocab.from`` keeps its vocabulary (SentencePiece
models and id maps), ``train.init_from`` its weights; the run resumes exactly like any other."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import tiny_sentences
from support.marian_models import make_marian
from support.text_io import quiet_console

from nmtkit.config import ModelConfig, from_dict

pytest.importorskip("transformers")


def recipe_for(imported: Path, root: Path, work: Path, steps: int) -> dict:
    files = {}
    for split, n, seed in (("train", 60, 1), ("dev", 6, 2), ("test", 6, 3)):
        files[split] = {}
        for lang, lines in (("en", tiny_sentences(n, seed)), ("xx", tiny_sentences(n, seed + 10))):
            path = root / f"{split}.{lang}"
            path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            files[split][lang] = str(path)
    meta = json.loads((imported / "config.json").read_text())
    defaults = dataclasses.asdict(ModelConfig())
    model = {key: value for key, value in meta["model"].items() if value != defaults[key]}
    size = len(json.loads((imported / "spm.src.ids.json").read_text())["pieces"])
    return {"name": "ft", "workdir": str(work),
            "data": {"source": "files", "src_lang": "en", "tgt_lang": "xx", "files": files},
            "vocab": {"from": str(imported), "joint": False, "size": size, "workers": 1},
            "model": model,
            "train": {"init_from": str(imported), "max_steps": steps, "max_tokens": 300, "save_every": 2,
                      "validate_every": 2, "log_every": 1, "threads": 1, "dtype": "float32", "seed": 3,
                      "best_metric": "loss", "schedule": "constant", "lr": 1e-3, "warmup": 0},
            "decode": {"beam_size": 1, "max_len_b": 8}}


def test_fine_tuning_an_imported_model_keeps_its_vocabulary_and_resumes_exactly(tmp_path):
    from nmtkit.data.prepare import prepare
    from nmtkit.modeldir import WEIGHTS, load_model_dir, read_weights
    from nmtkit.pretrained.marian_import import import_marian
    from nmtkit.training.checkpoint import checkpoint_dirs
    from nmtkit.training.trainer import train

    imported = import_marian(str(make_marian(tmp_path / "hf")), tmp_path / "imported")
    straight = recipe_for(imported, tmp_path, tmp_path / "a", 4)
    prepare(from_dict(straight), quiet_console())
    prepared = tmp_path / "a" / "prepared"
    for name in ("spm.src.model", "spm.src.ids.json", "spm.tgt.model", "spm.tgt.ids.json"):
        assert (prepared / name).read_bytes() == (imported / name).read_bytes(), name
    run_dir = train(from_dict(straight), quiet_console())
    losses = [json.loads(line).get("loss") for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(loss is None or 0 < loss < 50 for loss in losses) and any(losses)

    stopped = recipe_for(imported, tmp_path, tmp_path / "b", 4)
    shutil.copytree(prepared, tmp_path / "b" / "prepared")
    train(from_dict({**stopped, "train": {**stopped["train"], "max_steps": 2}}), quiet_console())
    resumed = train(from_dict(stopped), quiet_console())
    final, reference = checkpoint_dirs(resumed)[-1], checkpoint_dirs(run_dir)[-1]
    ours, theirs = read_weights(final / WEIGHTS), read_weights(reference / WEIGHTS)
    assert final.name == reference.name and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    start = read_weights(imported / WEIGHTS)
    assert any(not torch.equal(ours[k], start[k]) for k in start)  # it trained
    loaded = load_model_dir(final)  # a checkpoint is an imported-vocabulary model directory like its source
    assert (final / "spm.src.ids.json").read_bytes() == (imported / "spm.src.ids.json").read_bytes()
    assert loaded.src_vocab.encode("the dog")[-1] == 3 and loaded.tgt_vocab.encode("the dog")[-1] != 3
