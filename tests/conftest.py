"""Shared fixtures: tiny models and a tiny SentencePiece model keep every test fast."""
from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

WORDS = "the a cat dog sat ran on under mat house big small red blue and quickly".split()


def tiny_sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(n)]


@pytest.fixture(scope="session")
def tiny_spm(tmp_path_factory) -> Path:
    """A joint SentencePiece model (vocab 40) over a toy English-like language."""
    from nmtkit.data.vocab import train_spm

    path = tmp_path_factory.mktemp("spm") / "spm.model"
    train_spm(tiny_sentences(600), path, vocab_size=40)
    return path


def run_cli(*args: str, input: str | bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m nmtkit ARGS`` the way a user would (text in, text out)."""
    if isinstance(input, str):
        input = input.encode("utf-8")
    return subprocess.run([sys.executable, "-m", "nmtkit", *args], input=input, capture_output=True, cwd=cwd,
                          timeout=600)
