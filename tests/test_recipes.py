"""Every shipped recipe loads; the paper recipes build models of the paper's size."""
from __future__ import annotations

from pathlib import Path

import pytest

from nmtkit.config import load_config
from support.cli import run_cli

RECIPES = sorted(Path(__file__).resolve().parent.parent.glob("recipes/*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads(recipe):
    cfg = load_config(recipe)
    assert cfg.name == recipe.stem


@pytest.mark.parametrize("recipe,total", [("wmt14-en-de-transformer-base", "63,082,496"),
                                          ("wmt14-en-de-transformer-big", "214,245,376")])
def test_paper_recipe_dry_run(recipe, total, tmp_path):
    """Table 3: base 65M (63M with a tied 37k vocabulary), big 213M."""
    path = Path(__file__).resolve().parent.parent / "recipes" / f"{recipe}.yaml"
    out = run_cli("train", str(path), "--dry-run", "vocab.size=37000", f"workdir={tmp_path}")
    assert out.returncode == 0, out.stderr.decode()
    assert total in out.stderr.decode()


def test_paper_decoding_settings():
    for name in ("wmt14-en-de-transformer-base", "wmt14-en-de-transformer-big"):
        cfg = load_config(Path(__file__).resolve().parent.parent / "recipes" / f"{name}.yaml")
        d = cfg.decode
        assert (d.beam_size, d.lenpen, d.max_len_a, d.max_len_b) == (4, 0.6, 1.0, 50)
        assert cfg.train.label_smoothing == 0.1 and cfg.train.warmup == 4000 and cfg.train.schedule == "noam"
    assert load_config(Path(__file__).resolve().parent.parent / "recipes" / "wmt14-en-de-transformer-big.yaml"
                       ).train.average_last == 20
