"""Shared fixtures and the tiny data, recipes and models that several test files build: tiny
models and a tiny SentencePiece model keep every test fast. Shared helpers that are not
builders live in ``support/``."""
from __future__ import annotations

import gzip
import random
import shutil
import threading
from pathlib import Path

import pytest
import torch
import yaml

from nmtkit.config import ModelConfig
from nmtkit.decoding.options import TranslateOptions


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models gain nothing from intra-op threads and lose much on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


SYMBOLS = "a b c d e f g h i j".split()


def reversal_pairs(n: int, seed: int, length: int = 10) -> list[tuple[str, str]]:
    """The synthetic reversal task: a sequence of symbols -> the same symbols reversed."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        seq = [rng.choice(SYMBOLS) for _ in range(length)]
        pairs.append((" ".join(seq), " ".join(reversed(seq))))
    return pairs


def write_prepared(workdir: Path, train: list[tuple[str, str]], dev: list[tuple[str, str]], vocab_size: int = 16,
                   src_lang: str = "src", tgt_lang: str = "tgt") -> Path:
    """A prepared/ directory as `nmtkit prepare` leaves it, for training tests."""
    from nmtkit.data.ids import save_split
    from nmtkit.data.vocab import Vocab, train_spm

    prepared = workdir / "prepared"
    prepared.mkdir(parents=True, exist_ok=True)
    train_spm([s for pair in train for s in pair], prepared / "spm.model", vocab_size=vocab_size)
    vocab = Vocab(prepared / "spm.model")
    for split, pairs in (("train", train), ("dev", dev), ("test", dev)):
        save_split(prepared / f"{split}.npz", vocab.encode_batch([s for s, _ in pairs]),
                   vocab.encode_batch([t for _, t in pairs]))
        for lang, side in ((src_lang, 0), (tgt_lang, 1)):
            text = "".join(pair[side] + "\n" for pair in pairs).encode("utf-8")
            if split == "train":  # kept compressed
                (prepared / f"train.{lang}.gz").write_bytes(gzip.compress(text, mtime=0))
            else:
                (prepared / f"{split}.{lang}").write_bytes(text)
    return prepared


def tiny_recipe(workdir: Path, **sections) -> dict:
    """A recipe dict for a tiny Transformer on a prepared synthetic task."""
    recipe = {
        "name": "tiny", "workdir": str(workdir),
        "data": {"source": "files", "src_lang": "src", "tgt_lang": "tgt"},
        "vocab": {"size": 16},
        "model": {"d_model": 32, "ffn_dim": 64, "heads": 2, "encoder_layers": 2, "decoder_layers": 2,
                  "dropout": 0.0, "max_positions": 64},
        "train": {"max_tokens": 400, "max_steps": 20, "schedule": "inverse_sqrt", "lr": 3e-3, "warmup": 50,
                  "log_every": 10, "validate_every": 10, "save_every": 10, "dtype": "float32", "seed": 3,
                  "best_metric": "loss", "keep_last": 3},
        "decode": {"beam_size": 1, "max_len_b": 12},
    }
    for key, values in sections.items():
        recipe[key] = {**recipe.get(key, {}), **values}
    return recipe


@pytest.fixture(scope="session")
def reversal_spm(tmp_path_factory) -> Path:
    from nmtkit.data.vocab import train_spm

    path = tmp_path_factory.mktemp("spm") / "spm.model"
    train_spm([s for pair in reversal_pairs(300, 0, length=6) for s in pair], path, vocab_size=16)
    return path


def train_tiny(spm: Path, out_dir: Path, steps: int = 150, **model) -> Path:
    """A d-32 Transformer trained for a few seconds on reversal (outputs vary with the input
    and end in EOS, unlike a random model's), saved as a model directory."""
    from nmtkit.config import ModelConfig

    cfg = ModelConfig(d_model=32, ffn_dim=64, heads=2, encoder_layers=2, decoder_layers=2, dropout=0.0,
                      max_positions=64, **model)
    return fit_tiny(cfg, spm, out_dir, reversal_pairs(steps * 16, 1, length=6), label_smoothing=0.1,
                    meta={"note": "reversal test model"})


def fit_tiny(cfg, spm: Path, out_dir: Path, pairs: list[tuple[str, str]], label_smoothing: float = 0.0,
             meta: dict | None = None) -> Path:
    """A model of ``cfg`` (seed 0) trained by Adam (3e-3) on ``pairs``, 16 a batch, one pass;
    saved as a model directory over the joint SentencePiece model ``spm``."""
    import torch

    from nmtkit.data.vocab import Vocab
    from nmtkit.decoding.batching import pad_sources
    from nmtkit.specials import BOS, EOS
    from nmtkit.models.build import build_model
    from nmtkit.modeldir import save_model_dir
    from nmtkit.training.loss import label_smoothed_loss

    vocab = Vocab(spm)
    torch.manual_seed(0)
    net = build_model(cfg, len(vocab), len(vocab))
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    for start in range(0, len(pairs) - 15, 16):
        batch = pairs[start:start + 16]
        src, src_mask = pad_sources([vocab.encode(s) for s, _ in batch])
        tgt = [vocab.encode(t) for _, t in batch]
        tgt_in, _ = pad_sources([[BOS] + t for t in tgt])
        tgt_out, keep = pad_sources([t + [EOS] for t in tgt])
        loss, _ = label_smoothed_loss(net(src, src_mask, tgt_in), tgt_out, label_smoothing)
        optimizer.zero_grad()
        (loss / keep.sum()).backward()
        optimizer.step()
    return save_model_dir(net.eval(), cfg, out_dir, spm, spm, meta)


def sequences(n: int, seed: int, length: int = 5) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(SYMBOLS) for _ in range(length)) for _ in range(n)]


def tagged_model(tmp_path: Path, steps: int = 400) -> Path:
    """A tiny multilingual model trained on reversal (tag <2r>) and copying (tag <2c>) of the
    same inputs, saved as ``tmp_path``/model."""
    from nmtkit.config import ModelConfig
    from nmtkit.data.vocab import train_spm

    spm = tmp_path / "spm.model"
    train_spm(sequences(200, 0), spm, vocab_size=20, reserved=["<2r>", "<2c>"])
    cfg = ModelConfig(d_model=32, ffn_dim=64, heads=2, encoder_layers=1, decoder_layers=1, dropout=0.0,
                      max_positions=32)
    pairs = [(f"<2r> {s}", " ".join(s.split()[::-1])) if i % 2 else (f"<2c> {s}", s)
             for i, s in enumerate(sequences(steps * 16, 4, length=4))]
    return fit_tiny(cfg, spm, tmp_path / "model", pairs)


# --- tiny recipes, data and models shared by several test files ---------------------------------

MODEL = dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1)


def recipe_in(workdir: Path, prepared: Path, **train) -> Path:
    """A recipe training ``MODEL`` on a copy of the ``prepared`` directory, written in ``workdir``."""
    shutil.copytree(prepared, workdir / "prepared")
    recipe = tiny_recipe(workdir, model=MODEL, train={"max_tokens": 200, "validate_every": 100, **train})
    path = workdir / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def reversal_files(root: Path) -> dict:
    """Reversal pairs as text files (80 train, 6 dev, 6 test) under ``root``: a recipe's data.files."""
    return {split: write_pairs(root, split, reversal_pairs(count, seed, 5))
            for split, count, seed in (("train", 80, 0), ("dev", 6, 1), ("test", 6, 2))}


def write_pairs(root: Path, name: str, pairs: list[tuple[str, str]]) -> dict:
    """``pairs`` as ROOT/NAME.src and ROOT/NAME.tgt: a corpus's ``files`` entry."""
    paths = {}
    for lang, side in (("src", 0), ("tgt", 1)):
        paths[lang] = root / f"{name}.{lang}"
        paths[lang].write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
    return {lang: str(path) for lang, path in paths.items()}


def two_corpora(root: Path, weights=(1.0, 1.0)) -> dict:
    """Corpus "rev" (reverse the symbols, tag <2r>) and corpus "copy" (tag <2c>), with a duplicate
    across them, a test pair reversed in "copy", and an empty pair."""
    rev = [(s, " ".join(s.split()[::-1])) for s in dict.fromkeys(sequences(80, 1))]
    copy = [(s, s) for s in dict.fromkeys(sequences(60, 2))]
    heldout = [(s, " ".join(s.split()[::-1])) for s in sequences(8, 3, length=6)]
    copy_planted = copy + [rev[0], heldout[1][::-1], ("a b", "")]
    files = {"rev": {"train": write_pairs(root, "rev.train", rev), "dev": write_pairs(root, "dev", heldout[:4]),
                     "test": write_pairs(root, "test", heldout[4:])},
             "copy": {"train": write_pairs(root, "copy.train", copy_planted),
                      "dev": write_pairs(root, "dev", heldout[:4]), "test": write_pairs(root, "test", heldout[4:])}}
    corpora = [{"name": "rev", "source": "files", "files": files["rev"], "tag": "<2r>", "weight": weights[0]},
               {"name": "copy", "source": "files", "files": files["copy"], "tag": "<2c>", "weight": weights[1]}]
    return {"name": "multi", "workdir": str(root / "work"),
            "data": {"src_lang": "src", "tgt_lang": "tgt", "corpora": corpora},
            "vocab": {"size": 20, "workers": 1}, "_sizes": (len(rev), len(copy))}


FAST = dict(beam_size=2, max_len_a=0.0, max_len_b=4, device="cpu", dtype="float32")  # translate settings, quick


def save_tiny_model(directory: Path, spm: Path, seed: int) -> Path:
    """A random (untrained) 2-layer Transformer saved as a model directory."""
    from nmtkit.data.vocab import Vocab
    from nmtkit.models.build import build_model
    from nmtkit.modeldir import save_model_dir

    cfg = ModelConfig(d_model=16, ffn_dim=32, heads=2, encoder_layers=2, decoder_layers=2, dropout=0.0,
                      max_positions=64)
    size = len(Vocab(spm))
    torch.manual_seed(seed)
    model = build_model(cfg, size, size)
    with torch.no_grad():  # sharper than the default init, so outputs vary with the input
        model.output_proj.weight.mul_(8.0)
    return save_model_dir(model, cfg, directory, spm, spm, {"note": "random test model"})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_spm) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("model") / "model", tiny_spm, seed=0)


@pytest.fixture(scope="module")
def loaded(model_dir):
    from nmtkit.modeldir import load_model_dir

    return [load_model_dir(model_dir)]


def options(**kw) -> TranslateOptions:
    """``FAST`` translate options with ``kw`` on top."""
    return TranslateOptions(**{**FAST, **kw})


def concurrently(client, bodies: list[dict]) -> list:
    """The answers to POST /translate of every body, all sent at once from threads of their own."""
    answers: list = [None] * len(bodies)
    start = threading.Barrier(len(bodies))

    def ask(k: int) -> None:
        start.wait()
        answers[k] = client.post("/translate", json=bodies[k])

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


@pytest.fixture(scope="module")
def prepared_task(tmp_path_factory):
    """A prepared reversal task (300 training pairs of 6 symbols), one per test module."""
    workdir = tmp_path_factory.mktemp("task")
    write_prepared(workdir, reversal_pairs(300, 0, length=6), reversal_pairs(20, 1, length=6))
    return workdir
