"""Subword regularisation: sampled training segmentations that are lossless, seeded by the data
position (reproducible, and bit-identical across kills and resumes), with dev and test always
encoded the one deterministic way."""
from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
import torch
import yaml

from conftest import tiny_recipe, tiny_sentences
from nmtkit.config import from_dict
from nmtkit.data.ids import ParallelIds, flatten, load_split
from nmtkit.data.subword_sampling import SubwordSampler, sentence_seeds
from nmtkit.data.vocab import Vocab, train_spm
from nmtkit.errors import ConfigError
from nmtkit.runtime.console import get_console


def word_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """A toy task with real words (many ways to segment each): a sentence -> its words reversed."""
    return [(s, " ".join(reversed(s.split()))) for s in tiny_sentences(n, seed)]


def write_task(workdir, vocab_type: str = "unigram"):
    """A prepared/ dir as `nmtkit prepare` leaves it: texts, SentencePiece model (vocab 40), ids."""
    from nmtkit.data.ids import save_split

    prepared = workdir / "prepared"
    prepared.mkdir(parents=True)
    splits = {"train": word_pairs(160, 0), "dev": word_pairs(20, 1), "test": word_pairs(20, 2)}
    train_spm([s for pair in splits["train"] for s in pair], prepared / "spm.model", vocab_size=40,
              model_type=vocab_type)
    vocab = Vocab(prepared / "spm.model")
    for split, pairs in splits.items():
        save_split(prepared / f"{split}.npz", vocab.encode_batch([s for s, _ in pairs]),
                   vocab.encode_batch([t for _, t in pairs]))
        for lang, side in (("src", 0), ("tgt", 1)):
            (prepared / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    return prepared


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("subword"))


def sampler(prepared, alpha=0.1, nbest=-1, seed=1, lines=None, kind="unigram") -> SubwordSampler:
    vocab = Vocab(prepared / "spm.model")
    data = load_split(prepared / "train.npz")
    if lines is not None:
        pairs = [data.pair(i) for i in range(lines)]
        (src, src_offsets), (tgt, tgt_offsets) = flatten([s for s, _ in pairs]), flatten([t for _, t in pairs])
        data = ParallelIds(src, src_offsets, tgt, tgt_offsets)
    return SubwordSampler(data, (vocab, vocab), kind, alpha, nbest, seed)


def sentences(ids) -> list[list[int]]:
    return [ids.src[ids.src_offsets[i]:ids.src_offsets[i + 1]].tolist() for i in range(len(ids))]


def assert_same(a, b) -> None:
    for field in ("src", "src_offsets", "tgt", "tgt_offsets"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field


@pytest.mark.parametrize("vocab_type, alpha, nbest", [("unigram", 0.1, -1), ("unigram", 0.1, 8), ("bpe", 0.1, -1)])
def test_sampled_epochs_are_lossless_seeded_and_vary(tmp_path, vocab_type, alpha, nbest):
    prepared = write_task(tmp_path, vocab_type)
    vocab = Vocab(prepared / "spm.model")
    deterministic = sentences(load_split(prepared / "train.npz"))
    epoch0 = sampler(prepared, alpha, nbest, kind=vocab_type).epoch(0)
    assert len(epoch0) == len(deterministic)
    assert [vocab.decode(ids) for ids in sentences(epoch0)] == [vocab.decode(ids) for ids in deterministic]
    assert all(0 < i < len(vocab) and not vocab.sp.IsControl(i) for i in epoch0.src.tolist() + epoch0.tgt.tolist())
    changed = sum(a != b for a, b in zip(sentences(epoch0), deterministic))
    assert changed > len(deterministic) // 8  # sampling really re-segments
    other = sampler(prepared, alpha, nbest, kind=vocab_type)
    other.epoch(3)  # draws in between change nothing: each sentence is seeded by its position
    assert_same(other.epoch(0), epoch0)
    assert sentences(sampler(prepared, alpha, nbest, kind=vocab_type).epoch(1)) != sentences(epoch0)
    assert sentences(sampler(prepared, alpha, nbest, seed=2, kind=vocab_type).epoch(0)) != sentences(epoch0)


def test_without_randomness_the_samplers_give_sentencepieces_segmentation(tmp_path):
    """BPE with no dropout replays SentencePiece's merges exactly; a very sharp unigram
    distribution (large alpha) always draws the best segmentation, SentencePiece's."""
    for kind, alpha in (("bpe", 0.0), ("unigram", 200.0)):
        prepared = write_task(tmp_path / kind, kind)
        deterministic = load_split(prepared / "train.npz")
        assert_same(sampler(prepared, alpha, kind=kind).epoch(0), deterministic)


def test_unigram_draws_follow_the_segmentation_probabilities(prepared):
    """Two segmentations of one word, drawn 4,000 times: their shares match exp(alpha * log p)."""
    from nmtkit.data.subword_sampling import PieceTable, UnigramWord

    vocab = Vocab(prepared / "spm.model")
    table = PieceTable(vocab)
    word = next(w for w in ("\u2581quickly", "\u2581under", "\u2581house") if w in table.ids)
    drawn = UnigramWord.build(word, table, 0.3)
    rng = random.Random(0)
    counts = {}
    for _ in range(4000):
        ids = tuple(drawn.sample(rng))
        counts[ids] = counts.get(ids, 0) + 1
    for ids, count in counts.items():
        assert "".join(table.pieces[i] for i in ids) == word
    def segmentations(text):  # every way to write text with the pieces, by brute force
        if not text:
            return [()]
        return [(table.ids[text[:n]], *rest) for n in range(1, len(text) + 1) if text[:n] in table.ids
                for rest in segmentations(text[n:])]

    expected = {ids: np.exp(0.3 * sum(vocab.sp.GetScore(i) for i in ids)) for ids in segmentations(word)}
    total = sum(expected.values())
    assert len(counts) > 1 and set(counts) <= set(expected)
    for ids, weight in expected.items():
        assert abs(counts.get(ids, 0) / 4000 - weight / total) < 0.03, ids


def ids_of(vocab, lines) -> ParallelIds:
    (src, src_offsets), (tgt, tgt_offsets) = flatten(vocab.encode_batch(lines)), flatten(vocab.encode_batch(lines))
    return ParallelIds(src, src_offsets, tgt, tgt_offsets)


@pytest.mark.parametrize("nbest", [-1, 8])
def test_words_with_an_unknown_piece_keep_it_in_every_draw(prepared, nbest):
    """Re-encoded as text, the unknown piece would come back spelled out (``<unk>`` as pieces)."""
    vocab = Vocab(prepared / "spm.model")
    lines = [f"{src} \u20ac7 {src.split()[0]}\u00a7" for src, _ in word_pairs(30, 5)]  # € and § are not pieces
    data = ids_of(vocab, lines)
    given = sentences(data)
    assert all(ids.count(vocab.sp.unk_id()) == 2 for ids in given)
    drawn = SubwordSampler(data, (vocab, vocab), "unigram", 0.1, nbest, 1)
    for epoch in range(3):
        sampled = sentences(drawn.epoch(epoch))
        assert [vocab.decode(ids) for ids in sampled] == [vocab.decode(ids) for ids in given]
        assert all(ids.count(vocab.sp.unk_id()) == 2 for ids in sampled)
    assert sampled != given  # the other words are still sampled


def test_tags_stay_one_piece_in_every_draw(tmp_path):
    """A tag's characters may be pieces of their own (text with < and >): a draw over them would
    spell the tag out, and the model would never see its tag."""
    texts = [f"<bt> {s}" for s, _ in word_pairs(120, 0)] + [f"a <b> t > {s}" for s, _ in word_pairs(40, 3)]
    train_spm(texts, tmp_path / "spm.model", vocab_size=40, reserved=["<bt>"])
    vocab = Vocab(tmp_path / "spm.model")
    tag = vocab.sp.PieceToId("<bt>")
    assert all(vocab.sp.PieceToId(c) != vocab.sp.unk_id() for c in "<bt>")  # its characters are pieces too
    data = ids_of(vocab, texts[:120])
    assert all(tag in ids for ids in sentences(data))

    def tagged(tags):
        drawn = SubwordSampler(data, (vocab, vocab), "unigram", 0.1, -1, 1, tags=tags)
        return [sum(tag in ids for ids in sentences(drawn.epoch(epoch))) for epoch in range(4)]

    assert min(tagged([])) < 120  # without being told, some draws spell the tag out
    assert tagged(["<bt>"]) == [120] * 4


def test_draws_longer_than_the_position_table_keep_the_prepared_segmentation(prepared):
    vocab = Vocab(prepared / "spm.model")
    data = load_split(prepared / "train.npz")
    given = sentences(data)
    targets = [data.tgt[data.tgt_offsets[i]:data.tgt_offsets[i + 1]].tolist() for i in range(len(data))]
    table = max(max(map(len, given)), max(map(len, targets)) + 1)  # the prepared data just fits (BOS)
    free = SubwordSampler(data, (vocab, vocab), "unigram", 0.1, -1, 1).epoch(0)
    assert max(map(len, sentences(free))) > table  # unbounded, some draws need more rows
    bounded = SubwordSampler(data, (vocab, vocab), "unigram", 0.1, -1, 1, max_positions=table).epoch(0)
    assert max(bounded.src_lengths()) <= table and max(bounded.tgt_lengths()) + 1 <= table
    for drawn, unbounded, prepared_ids in zip(sentences(bounded), sentences(free), given):
        assert drawn == (unbounded if len(unbounded) <= table else prepared_ids)


@pytest.mark.parametrize("settings, message", [
    ({"train": {"subword_nbest": 1}}, "train.subword_nbest must be -1"),
    ({"train": {"subword_nbest": 0}}, "train.subword_nbest must be -1"),
    ({"train": {"subword_alpha": -0.1}}, r"train.subword_alpha must be in \[0, 10\], got -0.1"),
    ({"train": {"subword_alpha": 1.0}, "vocab": {"type": "bpe"}}, "BPE-dropout probability"),
    ({"train": {"subword_alpha": 0.1, "subword_nbest": 4}, "vocab": {"type": "bpe"}}, "unigram only"),
])
def test_bad_settings_are_config_errors(tmp_path, settings, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(tiny_recipe(tmp_path, **settings))


def train_run(workdir, **train):
    from nmtkit.training.trainer import train as run_train

    cfg = from_dict(tiny_recipe(workdir, vocab={"size": 40}, train={"max_steps": 12, "validate_every": 6,
                                                                    "subword_alpha": 0.1, **train}))
    return run_train(cfg, get_console(-1))


def final_weights(run_dir) -> dict:
    from nmtkit.training.checkpoint import latest_checkpoint

    return latest_checkpoint(run_dir).weights


def test_training_is_reproducible_under_its_seed_and_dev_stays_deterministic(prepared, tmp_path):
    from nmtkit.modeldir import load_model_dir
    from nmtkit.training.validation import dev_loss

    runs = {}
    for name, train in (("a", {}), ("b", {}), ("off", {"subword_alpha": 0.0})):
        shutil.copytree(prepared, tmp_path / name / "prepared")
        runs[name] = final_weights(train_run(tmp_path / name, **train))
    assert all(torch.equal(runs["a"][k], runs["b"][k]) for k in runs["a"])
    assert not all(torch.equal(runs["a"][k], runs["off"][k]) for k in runs["a"])
    # validation read the deterministic dev ids: recomputing the dev loss from dev.npz agrees
    records = [json.loads(line) for line in (tmp_path / "a" / "train" / "metrics.jsonl").read_text().splitlines()]
    logged = [r["dev_loss"] for r in records if r["type"] == "valid" and r["step"] == 12]
    model = load_model_dir(tmp_path / "a" / "train" / "checkpoints" / "step_00000012").model
    again = dev_loss(model, load_split(prepared / "dev.npz"), 400, torch.device("cpu"), torch.float32, 64)
    assert logged == [round(again["dev_loss"], 4)]


def test_dev_and_test_encoding_is_untouched_by_sampling(prepared):
    vocab = Vocab(prepared / "spm.model")
    for split in ("dev", "test"):
        lines = (prepared / f"{split}.src").read_text().splitlines()
        before = vocab.encode_batch(lines)
        random.seed(0)
        sampler(prepared).epoch(5)  # sampling reseeds SentencePiece's generator ...
        assert vocab.encode_batch(lines) == before == [vocab.encode(line) for line in lines]  # ... encoding ignores it
        assert before == sentences(load_split(prepared / f"{split}.npz"))


def test_killed_and_resumed_sampled_training_is_bit_identical(prepared, tmp_path):
    from support.resume import MODEL, TRAIN, assert_same_final_state, final_state, train_to_end, train_with_kills

    recipes = []
    for name in ("reference", "killed"):
        shutil.copytree(prepared, tmp_path / name / "prepared")
        recipe = tiny_recipe(tmp_path / name, model=MODEL, vocab={"size": 40},
                             train={**TRAIN, "max_steps": 30, "subword_alpha": 0.1})
        path = tmp_path / name / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
        recipes.append(path)
    train_to_end(recipes[0])
    report = train_with_kills(recipes[1], kills=3, seed=5, step_seconds=0.05, max_steps=30)
    assert report.kills >= 2
    reference = final_state(tmp_path / "reference" / "train")
    assert_same_final_state(reference, final_state(tmp_path / "killed" / "train"), max_steps=30)
    assert max(r["epoch"] for r in reference["metrics"] if r["type"] == "train") >= 3  # resumes crossed epochs
