"""Word alignments: SentencePiece pieces mapped back to whitespace words, Pharaoh i-j output."""
from __future__ import annotations

import re

import pytest
import torch

from conftest import options, tiny_sentences
from nmtkit.decoding.alignment import pharaoh, piece_pairs, word_indices, word_pairs
from nmtkit.decoding.translate import translate_lines


def test_pieces_map_to_the_words_they_belong_to_on_a_hand_made_case():
    # source "the cat sat" as "▁the ▁c at ▁ sat": the lone "▁" is a space and belongs to no word
    src = word_indices([" the", " c", "at", " ", "sat"])
    assert src == [(0,), (1,), (1,), (), (2,)]
    # target "le chat , assis? x y": a lone "▁", a byte piece (placeholder), a dropped special (""),
    # and a piece that spans a space
    tgt = word_indices([" le", " ch", "at", " ", ",", " assis", "\ufffd", "", " x y"])
    assert tgt == [(0,), (1,), (1,), (), (2,), (3,), (3,), (), (4, 5)]
    assert len(" le chat , assis\ufffd x y".split()) == 6
    pairs = [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (4, 5), (2, 6), (0, 7), (4, 8)]
    words = word_pairs(pairs, src, tgt)
    # (2, 2) repeats (1, 1); pairs touching the lone "▁" or the dropped special vanish
    assert words == [(0, 0), (1, 1), (1, 3), (2, 2), (2, 3), (2, 4), (2, 5)]
    assert pharaoh(words) == "0-0 1-1 1-3 2-2 2-3 2-4 2-5"
    assert pharaoh([]) == "" and word_indices([]) == []


def test_piece_pairs_take_each_target_piece_to_its_most_attended_source_piece():
    attention = torch.tensor([[0.1, 0.7, 0.2, 0.9], [0.6, 0.3, 0.1, 0.0], [0.2, 0.2, 0.5, 0.0]])
    assert piece_pairs(attention, 3) == [(1, 0), (0, 1), (2, 2)]  # column 3 (past the source) ignored
    assert piece_pairs(None, 3) == [] and piece_pairs(attention, 0) == []


def test_vocab_surfaces_give_the_words_of_the_line(loaded):
    vocab = loaded[0].src_vocab
    for line in ["the  cat sat", "quickly  the big\u00a0dog", "the cat\u20ac sat €€", ""]:
        ids = vocab.encode(line)
        assert 1 in ids or "\u20ac" not in line  # € is not in the vocabulary: an unknown piece
        joined = "".join(vocab.surfaces(ids, unknown="\ufffd"))
        assert len(joined.split()) == len(line.split())
        assert len(word_indices(vocab.surfaces(ids, unknown="\ufffd"))) == len(ids)
    assert vocab.surfaces([0, 1, 2, 3]) == ["", "", "", ""]


def reference_words(surfaces: list[str]) -> list[set[int]]:
    """Words per piece by character offsets and a regex: an independent computation."""
    joined = "".join(surfaces)
    word_of = {}
    for index, match in enumerate(re.finditer(r"\S+", joined)):
        word_of.update({position: index for position in range(match.start(), match.end())})
    out, start = [], 0
    for surface in surfaces:
        out.append({word_of[p] for p in range(start, start + len(surface)) if p in word_of})
        start += len(surface)
    return out


@pytest.mark.parametrize("nbest", [1, 2])
def test_translate_word_alignments_map_its_piece_alignments(loaded, nbest):
    from nmtkit.decoding.torch_engine import TorchEngine
    from nmtkit.decoding.translate import Translator

    lines = tiny_sentences(12, seed=5) + ["", "the cat\u20ac sat"]
    opts = options(beam_size=2, nbest=nbest, alignments=True, max_len_a=1.0, max_len_b=3)
    translator = Translator(TorchEngine.from_loaded(loaded, opts), opts)
    sources, results = translator.hypotheses(lines)
    written = translate_lines(loaded, lines, opts)
    differs = 0
    for index, (line, src_ids, hyps) in enumerate(zip(lines, sources, results)):
        rows = written[index].split("\n")
        assert written[index] == translator.format(index, hyps, src_ids)
        for hyp, row in zip(hyps, rows):
            text, field = row.split("\t")[-2:]
            src_words = reference_words(translator.src_vocab.surfaces(src_ids, unknown="\ufffd"))
            tgt_words = reference_words(translator.tgt_vocab.surfaces(hyp.tokens))
            pieces = piece_pairs(hyp.attention, len(src_ids)) if hyp.tokens else []
            expected = sorted({(i, j) for s, t in pieces for i in src_words[s] for j in tgt_words[t]})
            got = [tuple(map(int, pair.split("-"))) for pair in field.split()]
            assert got == expected
            assert all(i < len(line.split()) and j < len(text.split()) for i, j in got)
            assert len("".join(translator.tgt_vocab.surfaces(hyp.tokens)).split()) == len(text.split())
            differs += got != pieces
    assert differs > 0  # words made of several pieces occur: the mapping is exercised


def test_the_server_answers_alignments_as_translate_writes_them(loaded):
    from nmtkit.decoding.torch_engine import TorchEngine
    from nmtkit.serving.batcher import Batcher
    from nmtkit.serving.requests import Limits, RequestError, parse_request

    lines = tiny_sentences(4, seed=6)
    opts = options()
    batcher = Batcher(TorchEngine.from_loaded(loaded, opts), opts, 0.0, opts.batch_tokens)
    try:
        for units in ("words", "pieces"):
            request = parse_request(f'{{"texts": [], "alignments": true, "alignment_units": "{units}"}}'.encode(),
                                    Limits())
            body = batcher.submit(lines, request.decode).future.result(timeout=120)
            written = translate_lines(loaded, lines, options(alignments=True, alignment_units=units))
            assert body["alignments"] == [row.split("\t")[1] for row in written]
    finally:
        batcher.close()
    with pytest.raises(RequestError, match="alignment_units must be one of 'words', 'pieces'"):
        parse_request(b'{"texts": ["a"], "alignment_units": "chars"}', Limits())


def test_word_alignments_count_the_words_of_a_prefixed_output(loaded):
    from nmtkit.decoding.guides import Guide
    from nmtkit.decoding.torch_engine import TorchEngine
    from nmtkit.decoding.translate import Translator

    opts = options(alignments=True, max_len_a=1.0, max_len_b=3)
    translator = Translator(TorchEngine.from_loaded(loaded, opts), opts)
    prefixes = ["\u20ac\u20ac the", "big "]  # € is not in the vocabulary: written as given, a word of its own
    rows = translator.translate(["the cat sat", "a dog ran"], guides=[Guide.of(prefix=p) for p in prefixes])
    for prefix, row in zip(prefixes, rows):
        text, field = row.split("\t")
        pairs = [tuple(map(int, pair.split("-"))) for pair in field.split()]
        assert text.startswith(prefix) and pairs == sorted(set(pairs))
        assert 0 in {j for _, j in pairs} and all(j < len(text.split()) for _, j in pairs)
