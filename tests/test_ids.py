"""Memory-mapped id files: the batches training draws from them are the ones it drew from the
whole arrays in memory (today's and older prepared directories alike), written in one piece or
a chunk at a time, in the smallest id type the vocabulary allows."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from nmtkit.data.batching import collate, make_batches
from nmtkit.data.ids import ParallelIds, SplitWriter, load_split, save_split


def corpus(seed: int, pairs: int = 300, vocab: int = 50) -> tuple[list, list]:
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, vocab, rng.integers(0, 12)).tolist() for _ in range(pairs)]
    tgt = [rng.integers(4, vocab, rng.integers(1, 14)).tolist() for _ in range(pairs)]
    return src, tgt


def in_memory(path) -> ParallelIds:
    """The split read whole into memory, as ``train`` did before memory mapping."""
    with np.load(path, allow_pickle=False) as data:
        return ParallelIds(data["src"], data["src_offsets"], data["tgt"], data["tgt_offsets"])


def older_split(path, src, tgt) -> None:
    """A split as older versions wrote it: int32 ids through np.savez."""
    flat = [np.concatenate([np.asarray(s, np.int32) for s in side]) for side in (src, tgt)]
    offsets = [np.concatenate([[0], np.cumsum([len(s) for s in side])]).astype(np.int64) for side in (src, tgt)]
    np.savez(path, src=flat[0], src_offsets=offsets[0], tgt=flat[1], tgt_offsets=offsets[1])


def epoch_batches(data: ParallelIds, epoch: int, max_tokens: int = 120):
    for indices in make_batches(data.src_lengths(), data.tgt_lengths(), max_tokens, seed=7, epoch=epoch):
        batch = collate(data, indices, max_len=10)
        yield batch.src, batch.tgt_in, batch.tgt_out, batch.ntokens


def assert_same_batches(a: ParallelIds, b: ParallelIds) -> None:
    for epoch in range(2):
        pairs = list(zip(epoch_batches(a, epoch), epoch_batches(b, epoch), strict=True))
        assert len(pairs) > 10
        for x, y in pairs:
            assert all(torch.equal(s, t) for s, t in zip(x[:3], y[:3])) and x[3] == y[3]


def is_mapped(array: np.ndarray) -> bool:
    while array is not None and not isinstance(array, np.memmap):
        array = array.base
    return array is not None


def test_memory_mapped_split_gives_the_batches_of_the_split_in_memory(tmp_path):
    src, tgt = corpus(0)
    save_split(tmp_path / "train.npz", src, tgt, vocab_sizes=(50, 50))
    mapped = load_split(tmp_path / "train.npz", (50, 50))
    assert all(is_mapped(getattr(mapped, name)) for name in ("src", "src_offsets", "tgt", "tgt_offsets"))
    assert mapped.src.dtype == mapped.tgt.dtype == np.uint16
    assert [mapped.pair(i)[0].tolist() for i in range(len(mapped))] == src
    assert_same_batches(mapped, in_memory(tmp_path / "train.npz"))


def test_an_older_int32_split_reads_as_the_same_ids_batches_and_digest(tmp_path):
    src, tgt = corpus(1)
    older_split(tmp_path / "old.npz", src, tgt)
    save_split(tmp_path / "new.npz", src, tgt, vocab_sizes=(50, 50))
    old, new = load_split(tmp_path / "old.npz", (50, 50)), load_split(tmp_path / "new.npz", (50, 50))
    assert old.src.dtype == np.int32 and is_mapped(old.src)
    assert_same_batches(old, new)
    # a run that recorded the digest of int32 ids resumes on the same ids stored as uint16
    reference = hashlib.sha256()  # the digest as older versions computed it, on the int32 arrays
    stored = np.load(tmp_path / "old.npz")
    for array in (stored[name] for name in ("src", "src_offsets", "tgt", "tgt_offsets")):
        reference.update(f"{array.dtype.str}{array.shape}".encode() + array.tobytes())
    assert old.digest() == new.digest() == reference.hexdigest()
    assert new.digest() != ParallelIds(new.src[::-1].copy(), new.src_offsets, new.tgt, new.tgt_offsets).digest()


def test_written_a_chunk_at_a_time_is_written_at_once(tmp_path):
    src, tgt = corpus(2)
    with SplitWriter(tmp_path / "chunked.npz", (70_000, 50)) as writer:
        bounds = [0, 1, 120, 120, 299, 300]  # one-sentence and empty chunks among them
        for start, end in zip(bounds, bounds[1:]):
            part_src, part_tgt = src[start:end], tgt[start:end]
            writer.add(np.concatenate([[], *part_src]).astype(np.int64), [len(s) for s in part_src],
                       np.concatenate([[], *part_tgt]).astype(np.int64), [len(t) for t in part_tgt])
    chunked = load_split(tmp_path / "chunked.npz")
    assert chunked.src.dtype == np.uint32 and chunked.tgt.dtype == np.uint16  # 70,000 pieces need 32 bits
    save_split(tmp_path / "whole.npz", src, tgt)
    whole = in_memory(tmp_path / "whole.npz")
    for name in ("src", "src_offsets", "tgt", "tgt_offsets"):
        assert getattr(chunked, name).tolist() == getattr(whole, name).tolist(), name


def test_ids_that_do_not_fit_the_vocabulary_type_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"src ids outside \[0, 65535\]"):
        save_split(tmp_path / "x.npz", [[70_000]], [[5]], vocab_sizes=(50, 50))
    assert not list(tmp_path.iterdir())  # neither the file nor its temporary parts are left


def test_a_compressed_archive_is_read_into_memory(tmp_path):
    src, tgt = corpus(3, pairs=20)
    save_split(tmp_path / "plain.npz", src, tgt)
    plain = in_memory(tmp_path / "plain.npz")
    np.savez_compressed(tmp_path / "packed.npz", **{name: getattr(plain, name) for name in
                                                    ("src", "src_offsets", "tgt", "tgt_offsets")})
    packed = load_split(tmp_path / "packed.npz")
    assert not is_mapped(packed.src) and packed.digest() == plain.digest()
