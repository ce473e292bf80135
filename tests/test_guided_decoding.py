"""Target prefixes and terminology constraints: a prefix is forced exactly and the search
goes on from it; every constraint is met whenever the length limit leaves room; a line that
asks for neither decodes exactly as without them."""
from __future__ import annotations

import pytest
import torch

from nmtkit.config import ModelConfig
from nmtkit.decoding.ensemble import EnsembleModel
from nmtkit.decoding.search import beam_search, greedy_search, sample
from test_search import TinyModel, all_outputs, random_batch, sequence_score

PIECES, MAX_LEN = [1, 4, 5, 6], 3  # every piece a 7-piece TinyModel can emit (UNK too), up to 3 of them
EXACT = dict(lenpen=0.6, max_len_a=0, max_len_b=MAX_LEN, min_len=0)
WIDE = 64  # wider than every set of live prefixes: beam search is exhaustive


def contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[i:i + len(phrase)] == phrase for i in range(len(tokens) - len(phrase) + 1))


def assert_same(hyps, reference) -> None:
    """The same pieces and scores (the batch around a sentence may differ, and with it the
    last bits of the decoder's arithmetic, as in test_search's batch-composition test)."""
    assert [h.tokens for h in hyps] == [h.tokens for h in reference]
    assert [h.score for h in hyps] == pytest.approx([h.score for h in reference], rel=1e-6)


def ranked(model, src, mask, row: int, keep) -> list[list[int]]:
    """Every output up to MAX_LEN that ``keep`` accepts, best score first (brute force)."""
    one = (src[row:row + 1], mask[row:row + 1])
    outputs = [y for y in all_outputs(PIECES, MAX_LEN) if keep(y)]
    return sorted(outputs, key=lambda y: -sequence_score(model, *one, y, EXACT["lenpen"]))


# ------------------------------------------------------------------ search, scripted exactly

@torch.no_grad()
def test_prefix_is_forced_and_the_rest_is_the_best_continuation():
    for seed in range(3):
        model = TinyModel(seed, vocab=7, sharpness=1.0).eval()
        src, mask = random_batch(seed, batch=3, vocab=7, max_len=3)
        prefixes = [[5], [], [6, 4]]
        out = beam_search(model, src, mask, WIDE, nbest=3, prefixes=prefixes, **EXACT)
        plain = beam_search(model, src, mask, WIDE, nbest=3, **EXACT)
        for row, prefix in enumerate(prefixes):
            best = ranked(model, src, mask, row, lambda y, p=prefix: y[:len(p)] == p)[:3]
            assert [h.tokens for h in out[row]] == best
            one = (src[row:row + 1], mask[row:row + 1])
            for hyp in out[row]:  # the forced pieces' log-probabilities count in the score
                assert hyp.score == pytest.approx(sequence_score(model, *one, hyp.tokens, EXACT["lenpen"]), abs=1e-5)
        assert_same(out[1], plain[1])


@torch.no_grad()
@pytest.mark.parametrize("phrases", [[[5]], [[4, 6]], [[6], [4]], [[1, 5]], [[5, 5]], [[5], [5]]])
def test_constrained_beam_finds_the_best_output_that_meets_every_constraint(phrases):
    for seed in range(3):
        model = TinyModel(seed, vocab=7, sharpness=1.0).eval()
        src, mask = random_batch(seed, batch=2, vocab=7, max_len=3)
        out = beam_search(model, src, mask, WIDE, nbest=2, constraints=[phrases, []], **EXACT)
        meets = (lambda y: y.count(5) >= 2) if phrases == [[5], [5]] else \
            (lambda y: all(contains(y, p) for p in phrases))  # a phrase listed twice must appear twice
        assert [h.tokens for h in out[0]] == ranked(model, src, mask, 0, meets)[:2]
        plain = beam_search(model, src, mask, WIDE, nbest=2, **EXACT)
        assert_same(out[1], plain[1])


@torch.no_grad()
def test_constraints_that_fill_the_length_limit_are_the_whole_output():
    model = TinyModel(4).eval()
    src, mask = random_batch(4, batch=3)
    phrases = [[[7, 8, 9]], [[10], [5, 5]], [[11, 4, 11]]]
    for beam in (1, 2, 5):
        out = beam_search(model, src, mask, beam, constraints=phrases, max_len_a=0, max_len_b=3)
        assert out[0][0].tokens == [7, 8, 9]
        assert out[1][0].tokens in ([10, 5, 5], [5, 5, 10])
        assert out[2][0].tokens == [11, 4, 11]
    short = beam_search(model, src, mask, 3, constraints=phrases, max_len_a=0, max_len_b=2)
    assert all(hyps and len(hyps[0].tokens) <= 2 for hyps in short)  # no room: the best it can, no error


def tiny_models() -> dict[str, torch.nn.Module]:
    from nmtkit.models.build import build_model

    configs = {"transformer": dict(d_model=16, ffn_dim=32, heads=2, max_positions=64),
               "rnn": dict(arch="rnn", embed_dim=16, hidden_dim=24)}
    models = {}
    for name, extra in configs.items():
        torch.manual_seed(1)
        cfg = ModelConfig(encoder_layers=2, decoder_layers=2, dropout=0.0, **extra)
        models[name] = build_model(cfg, 24, 24).eval()
    return models


@torch.no_grad()
@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_random_constraints_are_always_met_and_leave_other_sentences_alone(arch):
    model = tiny_models()[arch]
    gen = torch.Generator().manual_seed(0)
    src, mask = random_batch(9, batch=8, vocab=24, max_len=7)
    constraints = []
    for row in range(8):
        count = row % 3  # 0, 1 or 2 phrases of 1 to 3 pieces
        constraints.append([torch.randint(4, 24, (int(torch.randint(1, 4, (1,), generator=gen)),),
                                          generator=gen).tolist() for _ in range(count)])
    settings = dict(max_len_a=1.0, max_len_b=8, lenpen=0.6)
    for beam in (1, 3, 5):
        out = beam_search(model, src, mask, beam, nbest=min(beam, 2), constraints=constraints, **settings)
        plain = beam_search(model, src, mask, beam, nbest=min(beam, 2), **settings)
        for row, phrases in enumerate(constraints):
            if phrases:
                assert all(contains(out[row][0].tokens, p) for p in phrases), (beam, row, phrases)
            else:
                assert_same(out[row], plain[row])
        assert sum(not all(contains(hyps[0].tokens, p) for p in phrases)
                   for hyps, phrases in zip(plain, constraints) if phrases) >= 3  # the constraints changed outputs


@torch.no_grad()
def test_prefixes_in_greedy_sampling_beam_and_ensembles():
    model, other = TinyModel(1).eval(), TinyModel(2).eval()
    src, mask = random_batch(3, batch=5)
    prefixes = [[4, 5], [], [7], [8, 8, 8], [9]]
    settings = dict(max_len_a=1.0, max_len_b=4)
    runs = {"greedy": greedy_search(model, src, mask, prefixes=prefixes, **settings),
            "sample": sample(model, src, mask, seed=3, nbest=3, prefixes=prefixes, **settings),
            "beam": beam_search(model, src, mask, 4, nbest=3, prefixes=prefixes, **settings),
            "ensemble": beam_search(EnsembleModel([model, other]), src, mask, 3, nbest=2, prefixes=prefixes,
                                    **settings),
            "beam-1": beam_search(model, src, mask, 1, prefixes=prefixes, **settings)}
    for name, out in runs.items():
        for hyps, prefix in zip(out, prefixes):
            assert all(h.tokens[:len(prefix)] == prefix for h in hyps), name
    assert [h[0].tokens for h in runs["greedy"]] == [h[0].tokens for h in runs["beam-1"]]
    assert runs["greedy"][1][0].tokens == greedy_search(model, src, mask, **settings)[1][0].tokens
    long_prefix = [[4] * 12, [], [5] * 3, [], []]  # longer than a * |x| + b: the limit grows to fit it
    out = beam_search(model, src, mask, 2, prefixes=long_prefix, max_len_a=0, max_len_b=2)
    assert out[0][0].tokens == [4] * 12 and len(out[1][0].tokens) <= 2 and out[2][0].tokens[:3] == [5] * 3
