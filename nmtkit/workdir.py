"""The layout of a work directory and of a training run, in one place: every module that
reads or writes one asks these objects for the path instead of building it by hand.

    WORKDIR/config.yaml       the resolved recipe (written by prepare)
    WORKDIR/prepared/         {split}.{lang} text, SentencePiece model(s), {split}.npz ids, manifest.json
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


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def data_record(self) -> Path:
        """What the run trains on (nmtkit.data.identity)."""
        return self.path / "data.json"

    @property
    def workdir(self) -> "WorkDir":
        """The work directory a run made by ``nmtkit train`` sits in."""
        return WorkDir(self.path.parent)


@dataclass(frozen=True)
class WorkDir:
    root: Path

    @classmethod
    def of(cls, cfg) -> "WorkDir":
        """The work directory of a recipe (``nmtkit.config.Config``)."""
        return cls(cfg.work_path)

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def prepared(self) -> Path:
        return self.root / "prepared"

    @property
    def manifest(self) -> Path:
        return self.prepared / "manifest.json"

    def text(self, split: str, lang: str) -> Path:
        """A prepared split's plain text in one language."""
        return self.prepared / f"{split}.{lang}"

    def ids(self, split: str) -> Path:
        """A prepared split's token ids."""
        return self.prepared / f"{split}.npz"

    @property
    def run(self) -> RunDir:
        return RunDir(self.root / "train")

    @property
    def results(self) -> Path:
        return self.root / "results"
