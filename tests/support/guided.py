"""A tiny reversal model trained once per test module (the module fixtures ``trained`` and
``loaded``; a module that imports ``loaded`` uses it in place of conftest's random one), lines to
translate and quick settings, and those lines translated with guides (prefixes, constraints):
what the guided-decoding and search-cost tests share."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import reversal_pairs, train_tiny
from nmtkit.decoding.translate import TranslateOptions, Translator


@pytest.fixture(scope="module")
def trained(reversal_spm, tmp_path_factory) -> Path:
    return train_tiny(reversal_spm, tmp_path_factory.mktemp("guided") / "model", steps=80)


@pytest.fixture(scope="module")
def loaded(trained):
    from nmtkit.modeldir import load_model_dir

    return [load_model_dir(trained)]


LINES = [s for s, _ in reversal_pairs(8, 21, length=6)]
FAST = dict(device="cpu", dtype="float32", max_len_a=1.0, max_len_b=6)


def guided(loaded, guides, **settings) -> list[str]:
    """LINES translated by ``loaded`` with one guide a line, with FAST and ``settings``."""
    from nmtkit.decoding.torch_engine import TorchEngine

    options = TranslateOptions(**{**FAST, **settings})
    return Translator(TorchEngine.from_loaded(loaded, options), options).translate(LINES, guides=guides)
