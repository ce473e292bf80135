"""Streaming ``prepare``: the same files, byte for byte, as preparing the whole corpus at once
(clean the list, SentencePiece on every line, encode, length rules) when SentencePiece's sample
covers the corpus; a seeded uniform sample of the whole corpus when it does not; duplicates
found in bounded memory exactly as a set of the pairs finds them.

SentencePiece's own training is not reproducible run to run (two trainings on the same lines
give different models), so the reference gets the lines SentencePiece was given and encodes
with the model prepare trained."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

import nmtkit.data.clean as clean
import nmtkit.data.prepare as prep
import nmtkit.data.vocab as vocab_module
from nmtkit.data.clean import SeenHashes, TextFilter, length_filter, normalize
from nmtkit.data.ids import load_split
from nmtkit.data.vocab import Vocab, sample_indices, sampled_lines, train_spm
from support.planted import EXPECTED, recipe, run, splits, train_text  # noqa: F401 (fixtures)


def whole_corpus_clean(train, heldout):
    """The text rules on a list, with a set of the pairs themselves."""
    held = {(normalize(s), normalize(t)) for s, t in heldout}
    seen, kept, counts = set(), [], {"read": 0, "empty": 0, "duplicate": 0, "heldout": 0}
    for src, tgt in train:
        counts["read"] += 1
        pair = (normalize(src), normalize(tgt))
        if not pair[0] or not pair[1]:
            counts["empty"] += 1
        elif pair in seen:
            counts["duplicate"] += 1
        else:
            seen.add(pair)
            if pair in held:
                counts["heldout"] += 1
            else:
                kept.append(pair)
    return kept, counts


def lines_given_to_sentencepiece(monkeypatch) -> list:
    """Record the lines of each SentencePiece training that prepare runs."""
    given = []

    def spy(texts, *args, **kwargs):
        given.append(list(texts))
        return train_spm(given[-1], *args, **kwargs)

    monkeypatch.setattr(prep, "train_spm", spy)
    return given


def test_streaming_prepare_writes_what_preparing_the_whole_corpus_at_once_writes(recipe, tmp_path, splits,
                                                                                 monkeypatch):
    monkeypatch.setattr(clean, "BATCH_PAIRS", 7)  # many batches of the text rules ...
    monkeypatch.setattr(prep.Encoder, "CHUNK_LINES", 37)  # ... and of encoding
    given = lines_given_to_sentencepiece(monkeypatch)
    summary, _ = run(recipe)
    out = tmp_path / "work" / "prepared"

    kept, counts = whole_corpus_clean(splits["train"], splits["dev"] + splits["test"])
    assert given == [[s for s, _ in kept] + [t for _, t in kept]]  # every line, as before sampling
    vocab = Vocab(out / "spm.model")
    src = vocab.encode_batch([s for s, _ in kept])
    tgt = vocab.encode_batch([t for _, t in kept])
    keep, dropped = length_filter(np.array([len(x) for x in src]), np.array([len(x) for x in tgt]), 120, 3.0)
    assert {**counts, **dropped} == {"read": 315, **EXPECTED} and summary["cleaning"]["kept"] == int(keep.sum())

    train = load_split(out / "train.npz")
    assert [train.pair(i)[0].tolist() for i in range(len(train))] == [x for x, k in zip(src, keep) if k]
    assert [train.pair(i)[1].tolist() for i in range(len(train))] == [x for x, k in zip(tgt, keep) if k]
    assert train_text(out, "en") == "".join(pair[0] + "\n" for pair, k in zip(kept, keep) if k)
    for split in ("dev", "test"):
        ids = load_split(out / f"{split}.npz")
        assert [ids.pair(i)[1].tolist() for i in range(len(ids))] == vocab.encode_batch([t for _, t in splits[split]])


def test_sentencepiece_trains_on_a_uniform_sample_of_the_whole_corpus(recipe, splits, monkeypatch):
    seen = lines_given_to_sentencepiece(monkeypatch)
    run(recipe, "vocab.input_sentence_size=250")
    kept, _ = whole_corpus_clean(splits["train"], splits["dev"] + splits["test"])  # the fetched text
    lines = [s for s, _ in kept] + [t for _, t in kept]
    chosen = sample_indices(len(lines), 250, prep.SAMPLE_SEED)
    assert seen == [[lines[i] for i in chosen]]  # in corpus order, only the sample written
    assert chosen[-1] > len(lines) // 2 + 250  # from the target half too, not the first 250 lines


def test_a_byte_cap_shrinks_the_sample_to_the_lines_that_hold_it(recipe, tmp_path, splits, monkeypatch):
    """vocab.input_bytes caps SentencePiece's sample by text size (its memory follows the text):
    as many uniformly drawn lines as hold the cap at the corpus's mean line length, recorded in the
    spm stamp; a cap that does not bind leaves the stamp as it was before the key existed."""
    import json

    seen = lines_given_to_sentencepiece(monkeypatch)
    run(recipe)
    out = tmp_path / "work" / "prepared"
    stamp = json.loads((out / "stamps" / "spm.json").read_text())
    assert "sample_lines" not in json.dumps(stamp) and len(seen) == 1
    kept, _ = whole_corpus_clean(splits["train"], splits["dev"] + splits["test"])  # the fetched text
    lines = [s for s, _ in kept] + [t for _, t in kept]
    size = sum(len(line.encode()) + 1 for line in lines)
    cap = size // 3
    run(recipe, f"vocab.input_bytes={cap}")
    expected = int(cap * len(lines) / size)
    assert 0 < expected < len(lines) and len(seen) == 2  # the cap binds: SentencePiece trained again
    assert seen[1] == [lines[i] for i in sample_indices(len(lines), expected, prep.SAMPLE_SEED)]
    assert abs(sum(len(line.encode()) + 1 for line in seen[1]) - cap) < 0.25 * cap  # a random ~100 of ~300 lines
    assert json.loads((out / "stamps" / "spm.json").read_text())["key"] != stamp["key"]
    run(recipe, f"vocab.input_bytes={size * 2}")  # no longer binding: the first stamp's key again
    assert len(seen) == 3 and json.loads((out / "stamps" / "spm.json").read_text())["key"] == stamp["key"]


def test_sample_indices_are_uniform_distinct_and_do_not_depend_on_the_block_size(monkeypatch):
    chosen = sample_indices(1000, 100, seed=3)
    assert len(set(chosen.tolist())) == 100 and chosen.tolist() == sorted(chosen.tolist()) and chosen.max() < 1000
    assert not np.array_equal(chosen, sample_indices(1000, 100, seed=4))
    monkeypatch.setattr(vocab_module, "SAMPLE_BLOCK", 64)  # the same keys drawn in 16 blocks
    assert np.array_equal(chosen, sample_indices(1000, 100, seed=3))
    hits = np.bincount(np.concatenate([sample_indices(40, 10, seed) for seed in range(400)]), minlength=40)
    assert hits.sum() == 4000 and 60 <= hits.min() and hits.max() <= 140  # 100 expected each (sd ~8.7)
    assert list(sampled_lines(iter("abcdefgh"), 8, 3, seed=5)) == [c for i, c in enumerate("abcdefgh")
                                                                   if i in sample_indices(8, 3, 5)]
    assert list(sampled_lines(iter("abc"), 3, 0, seed=5)) == list(sampled_lines(iter("abc"), 3, 3, 5)) == list("abc")


def test_bounded_dedup_drops_exactly_what_a_set_of_the_pairs_drops(monkeypatch):
    rng = random.Random(0)
    words = ["a", "b", "c", "d", " ", "e\u0301", "\u00e9"]  # NFD and NFC spellings of é are one pair

    def pair():
        return "".join(rng.choices(words, k=rng.randint(0, 3))), "".join(rng.choices(words, k=rng.randint(0, 2)))

    train, heldout = [pair() for _ in range(3000)], [pair() for _ in range(20)]
    monkeypatch.setattr(clean, "BATCH_PAIRS", 13)
    text_filter = TextFilter(dedup=True, heldout=heldout)
    kept = list(text_filter(train))
    assert (kept, text_filter.counts) == whole_corpus_clean(train, heldout)
    assert text_filter.counts["duplicate"] > 500 and text_filter.counts["heldout"] > 0
    seen = text_filter._seen
    assert len(seen) == len(kept) + text_filter.counts["heldout"]
    assert len(seen.runs) <= math.log2(len(seen)) + 1  # runs merge like a binary counter


def test_seen_hashes_membership_against_a_set():
    rng = np.random.default_rng(1)
    hashes, reference = SeenHashes(), set()
    for _ in range(50):
        keys = rng.integers(-2 ** 63, 2 ** 63 - 1, 40, dtype=np.int64, endpoint=True)
        keys[::3] = rng.integers(-20, 20, len(keys[::3]))  # small values repeat within and across batches
        expected = []
        for key in keys.tolist():
            expected.append(key not in reference)
            reference.add(key)
        assert hashes.first_seen(keys).tolist() == expected
    probe = np.array(sorted(reference)[:30] + [2 ** 62 + 5, -2 ** 62 - 5], dtype=np.int64)
    assert hashes.contains(probe).tolist() == [key in reference for key in probe.tolist()]
    assert len(hashes) == len(reference)


def test_sentencepiece_in_a_child_process_writes_the_model_here(tmp_path):
    from conftest import reversal_pairs

    lines = [s for pair in reversal_pairs(200, 0, length=6) for s in pair]
    train_spm(lines, tmp_path / "child.model", 16, in_subprocess=True, reserved=("<2xx>",))
    vocab = Vocab(tmp_path / "child.model")
    assert len(vocab) == 16 and vocab.is_reserved("<2xx>") and (tmp_path / "child.vocab").is_file()
    assert all(vocab.decode(vocab.encode(line)) == line for line in lines[:20])
    with pytest.raises(Exception, match="SentencePiece training failed"):
        train_spm(lines, tmp_path / "big.model", 100_000, in_subprocess=True)  # the child's error, in one line
