"""A small English-Spanish corpus with planted problems (empty, duplicate, held-out, too long,
bad length ratio), its recipe, and ``nmtkit prepare`` run on it in this process."""
from __future__ import annotations

import gzip
import io
import json
import random

import pytest

from nmtkit.config import load_config
import nmtkit.data.prepare as prep
from nmtkit.runtime.console import NmtConsole


WORDS = {"the": "el", "cat": "gato", "dog": "perro", "red": "rojo", "big": "grande", "small": "pequeño",
         "sees": "ve", "eats": "come", "house": "casa", "bird": "pájaro", "green": "verde", "runs": "corre"}


EXPECTED = {"empty": 3, "duplicate": 4, "heldout": 2, "too_long": 2, "ratio": 3}


def sentence(rng, number):
    words = [rng.choice(list(WORDS)) for _ in range(rng.randint(3, 7))]
    return f"{' '.join(words)} {number}", f"{' '.join(WORDS[w] for w in words)} {number}"


def write_corpus(root):
    """300 unique train pairs plus planted problems; 20 dev and 20 test pairs."""
    rng = random.Random(7)
    train = [sentence(rng, i) for i in range(300)]
    dev, test = [sentence(rng, 1000 + i) for i in range(20)], [sentence(rng, 2000 + i) for i in range(20)]
    planted = [
        ("", "vacío"), ("nothing", "  "), ("\t", "\u00a0"),  # empty x3
        train[0], (train[1][0].replace(" ", "  "), train[1][1]), train[2], train[0],  # duplicate x4
        dev[0], (" " + test[3][0], test[3][1] + " "),  # heldout x2
        (" ".join(["cat"] * 150), " ".join(["gato"] * 150)),  # too_long x2 (over max_len 120)
        ("dog " * 10 + "x", " ".join(["perro"] * 200)),
        ("cat", " ".join(["gato"] * 40)), ("dog", "perro " * 30 + "y"), ("red bird " * 20, "rojo"),  # ratio x3
        ("cafe\u0301 cat", "cafe\u0301 gato"),  # NFD: kept, written as NFC
    ]
    splits = {"train": train + planted, "dev": dev, "test": test}
    files = {}
    for split, pairs in splits.items():
        files[split] = {}
        for lang, side in (("en", 0), ("es", 1)):
            path = root / f"{split}.{lang}"
            path.write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
            files[split][lang] = str(path)
    return files, splits


@pytest.fixture
def splits(tmp_path):
    return write_corpus(tmp_path)[1]


@pytest.fixture
def recipe(tmp_path, splits):
    files = {split: {lang: str(tmp_path / f"{split}.{lang}") for lang in ("en", "es")} for split in splits}
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps({
        "name": "tiny", "workdir": str(tmp_path / "work"),
        "data": {"source": "files", "files": files, "clean": {"max_len": 120, "max_ratio": 3.0}},
        "vocab": {"size": 60, "workers": 1},
    }))
    return path


def run(recipe, *overrides):
    console = NmtConsole(0, file=io.StringIO(), width=120)
    summary = prep.prepare(load_config(recipe, list(overrides)), console)
    return summary, console.file.getvalue()


def train_text(out, lang):
    """The kept training text of a prepared directory (gzip-compressed there)."""
    return gzip.decompress((out / f"train.{lang}.gz").read_bytes()).decode("utf-8")
