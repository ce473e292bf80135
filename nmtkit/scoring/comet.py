"""COMET (Rei et al. 2020) through the ``unbabel-comet`` package, an optional extra (``nmtkit[comet]``).

The model comes from a local directory only (the Hugging Face Hub need not be reachable): the
layout ``comet.download_model`` leaves, ``DIR/hparams.yaml`` and ``DIR/checkpoints/model.ckpt``,
with the encoder named by ``hparams.yaml`` (``pretrained_model``) already in the local Hugging
Face cache or given as a directory there. COMET scores need the source sentences besides the
hypotheses and references; the corpus score is the mean of the segment scores, which is what
COMET itself reports, so its paired significance test resamples those (``significance.py``).

``comet`` imports torch and PyTorch Lightning: it is imported only when COMET is asked for.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from nmtkit.errors import ConfigError, DataError

MISSING = "COMET needs the unbabel-comet package: pip install 'nmtkit[comet]'"
CHECKPOINT = Path("checkpoints") / "model.ckpt"


@dataclass(frozen=True)
class CometResult:
    """Segment scores in line order and their mean (COMET's system score)."""

    name: str
    score: float
    segments: list[float]
    signature: str

    def as_dict(self) -> dict:
        return {"name": self.name, "score": self.score, "signature": self.signature}


def checkpoint_path(model: str | Path) -> Path:
    """The checkpoint of a local COMET model: DIR/checkpoints/model.ckpt of a directory, or the
    .ckpt file itself; its hparams.yaml must sit in the directory above ``checkpoints``."""
    path = Path(model).expanduser()
    ckpt = path / CHECKPOINT if path.is_dir() else path
    if not ckpt.is_file():
        raise DataError(f"no COMET model at {model}: expected a directory holding {CHECKPOINT} and hparams.yaml "
                        f"(docs/languages.md says how to fetch one)")
    if not (ckpt.parents[1] / "hparams.yaml").is_file():
        raise DataError(f"{ckpt}: a COMET checkpoint needs {ckpt.parents[1] / 'hparams.yaml'} beside its "
                        f"checkpoints directory")
    return ckpt


def require_comet() -> None:
    """A one-line ConfigError when unbabel-comet is not installed."""
    try:
        import comet  # noqa: F401
    except ImportError:
        raise ConfigError(MISSING) from None


def comet_scores(sources: Sequence[str], hyps: Sequence[str], refs: Sequence[str], model: str | Path,
                 batch_size: int = 16, progress: bool = True) -> CometResult:
    """COMET segment and system scores of ``hyps`` against ``refs`` (one reference stream) given
    ``sources``, batched, on the first GPU when there is one, else on the CPU."""
    if not len(sources) == len(hyps) == len(refs):
        raise DataError(f"COMET needs as many sources as hypotheses and references: {len(sources)} sources, "
                        f"{len(hyps)} hypotheses, {len(refs)} references")
    ckpt = checkpoint_path(model)
    require_comet()
    import torch
    from comet import load_from_checkpoint

    try:  # offline: the encoder's tokenizer and config must be local (a directory, or the HF cache)
        scorer = load_from_checkpoint(str(ckpt), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise DataError(f"cannot load the COMET model {ckpt}: {str(err).splitlines()[0]}") from None
    samples = [{"src": s, "mt": h, "ref": r} for s, h, r in zip(sources, hyps, refs)]
    gpus = 1 if torch.cuda.is_available() else 0
    output = scorer.predict(samples, batch_size=batch_size, gpus=gpus, progress_bar=progress,
                            accelerator="gpu" if gpus else "cpu")
    segments = [float(score) for score in output.scores]
    import comet as package

    signature = f"comet|model:{_model_name(ckpt)}|version:{getattr(package, '__version__', '?')}"
    return CometResult(name="COMET", score=sum(segments) / len(segments), segments=segments, signature=signature)


def _model_name(ckpt: Path) -> str:
    """The model directory's name, as COMET's Hub names read (Unbabel/wmt22-comet-da -> its folder)."""
    return ckpt.parents[1].name
