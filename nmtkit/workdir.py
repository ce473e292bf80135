"""The layout of a work directory and of a training run, in one place: every module that
reads or writes one asks these objects for the path instead of building it by hand.

    WORKDIR/config.yaml       the resolved recipe (written by prepare)
    WORKDIR/prepared/         {dev,test}.{lang} and train.{lang}.gz text, SentencePiece model(s),
                              {split}.npz ids, manifest.json (the layout: nmtkit.data.prepare)
    WORKDIR/train/            the training run (RunDir below)
    WORKDIR/results/          translations, results.json, results.md (written by run)

    RUN_DIR/config.yaml       the recipe the run was trained with
    RUN_DIR/metrics.jsonl     one JSON record per log line and validation
    RUN_DIR/data.json         checksums and counts of the data the run trains on
    RUN_DIR/checkpoints/, best/, averaged/   model directories
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def _inside(name: str, doc: str = "", base: str = "root") -> property:
    """A read-only path property: ``name`` inside the directory held in attribute ``base``."""
    return property(lambda self: getattr(self, base) / name, doc=doc or f"{name} inside the directory")


@dataclass(frozen=True)
class RunDir:
    path: Path

    config = _inside("config.yaml", "The recipe the run was trained with.", base="path")
    metrics = _inside("metrics.jsonl", base="path")
    data_record = _inside("data.json", "What the run trains on (nmtkit.data.identity).", base="path")
    checkpoints = _inside("checkpoints", "step_N/ model directories with trainer state.", base="path")
    best = _inside("best", "The model directory of the best validation.", base="path")
    averaged = _inside("averaged", "The average of the last checkpoints (nmtkit average, run).", base="path")

    @property
    def workdir(self) -> "WorkDir":
        """The work directory a run made by ``nmtkit train`` sits in."""
        return WorkDir(self.path.parent)


@dataclass(frozen=True)
class WorkDir:
    root: Path

    config = _inside("config.yaml", "The resolved recipe (written by prepare).")
    prepared = _inside("prepared")
    results = _inside("results")
    manifest = _inside("manifest.json", base="prepared")

    @classmethod
    def of(cls, cfg) -> "WorkDir":
        """The work directory of a recipe (``nmtkit.config.Config``)."""
        return cls(cfg.work_path)

    def text(self, split: str, lang: str) -> Path:
        """A prepared split's plain text in one language (dev, test, test.NAME; train's is gzip'd)."""
        return self.prepared / f"{split}.{lang}"

    def ids(self, split: str) -> Path:
        """A prepared split's token ids."""
        return self.prepared / f"{split}.npz"

    @property
    def run(self) -> RunDir:
        return RunDir(self.root / "train")
