"""Search invariants on scripted and tiny random models (CPU, fast)."""
from __future__ import annotations

import math

import pytest
import torch

from nmtkit.decoding.ensemble import EnsembleModel
from nmtkit.decoding.options import SearchSettings
from nmtkit.decoding.search import beam_search, greedy_search, length_penalty, sample, sampling_choice
from nmtkit.specials import BOS, EOS, PAD
from support.search_models import A, B_, C, ScriptedModel, TinyModel, all_outputs, random_batch, sequence_score, src_of

# key 10: beam 2 finds "b" (0.4 * 0.9 = 0.36), greedy follows "a a" (0.5 * 0.35 = 0.175)
SCRIPT = {
    (10, ()): {A: 0.5, B_: 0.4, C: 0.1},
    (10, (A,)): {A: 0.35, B_: 0.25, C: 0.22, EOS: 0.18},
    (10, (B_,)): {EOS: 0.9, C: 0.1},
    (10, (A, A)): {EOS: 1.0},
    (10, (A, B_)): {EOS: 1.0},
    # key 11: a long chain "c c c ..." that only the length limit stops
    (11, ()): {C: 0.9, A: 0.1},
}
for n in range(1, 20):
    SCRIPT[(11, (C,) * n)] = {C: 0.9, EOS: 0.1}


def test_beam_pins_exact_outputs_without_length_penalty():
    model = ScriptedModel(SCRIPT)
    src, mask = src_of([10])
    [hyps] = beam_search(model, src, mask, SearchSettings(beam_size=2, lenpen=0.0, max_len_a=0, max_len_b=3))
    assert [h.tokens for h in hyps] == [[B_]]
    assert hyps[0].logprob == pytest.approx(math.log(0.36))
    assert hyps[0].score == pytest.approx(math.log(0.36))
    # early stop: after step 1 the live "a a" (0.175) cannot beat the finished "b" (0.36)
    assert model.calls == [2, 2]
    [[g]] = greedy_search(ScriptedModel(SCRIPT), src, mask, SearchSettings(lenpen=0.0, max_len_a=0, max_len_b=3))
    assert g.tokens == [A, A] and g.logprob == pytest.approx(math.log(0.175))


def test_length_penalty_changes_the_winner_and_nbest_is_sorted():
    src, mask = src_of([10])
    alpha = 4.0
    [hyps] = beam_search(ScriptedModel(SCRIPT), src, mask,
                         SearchSettings(beam_size=2, lenpen=alpha, max_len_a=0, max_len_b=3, nbest=2))
    assert [h.tokens for h in hyps] == [[A, A], [B_]]
    assert hyps[0].score == pytest.approx(math.log(0.175) / (7 / 6) ** alpha)
    assert hyps[1].score == pytest.approx(math.log(0.36))
    assert hyps[0].score > hyps[1].score
    assert float(length_penalty(2, alpha)) == pytest.approx((7 / 6) ** alpha)
    assert float(length_penalty(7, 0.0)) == 1.0


def test_length_limit_finishes_hypotheses_and_batch_shrinks():
    model = ScriptedModel(SCRIPT)
    src, mask = src_of([10, 11])
    out = beam_search(model, src, mask, SearchSettings(beam_size=1, lenpen=0.0, max_len_a=0, max_len_b=4))
    assert out[0][0].tokens == [A, A]
    assert out[1][0].tokens == [C, C, C, C]  # stopped by the limit, EOS forced at step 4
    assert out[1][0].logprob == pytest.approx(math.log(0.9 ** 4 * 0.1))
    assert model.calls == [2, 2, 2, 1, 1]  # sentence 0 left the batch after step 2



def test_greedy_drops_finished_sentences_once_they_are_a_share_of_the_batch():
    """An ended sentence stays in the batch (fed EOS, its output fixed) until finished ones are over
    a tenth of it; then they all leave at once."""
    settings = SearchSettings(lenpen=0.0, max_len_a=0, max_len_b=4)
    alone = {key: greedy_search(ScriptedModel(SCRIPT), *src_of([key]), settings)[0][0] for key in (10, 11)}
    for keys, calls in (([10] + [11] * 9, [10] * 5), ([10, 10] + [11] * 8, [10, 10, 10, 8, 8])):
        model = ScriptedModel(SCRIPT)
        out = greedy_search(model, *src_of(keys), settings)
        assert model.calls == calls  # one finished of 10 stays; two of 10 leave after step 2
        for key, [hyp] in zip(keys, out):
            assert (hyp.tokens, hyp.logprob, hyp.score) == (alone[key].tokens, alone[key].logprob, alone[key].score)


@torch.no_grad()
@pytest.mark.parametrize("share", [0.0, 1.0])
@pytest.mark.parametrize("search", ["greedy", "sample", "greedy with attention and prefixes"])
def test_outputs_do_not_depend_on_when_finished_sentences_leave(monkeypatch, share, search):
    """Greedy keeps ended rows for a while, with the same results; sampling draws for every row in the
    batch, so it drops finished sentences at once whatever the share."""
    model = TinyModel(5).eval()
    src, mask = random_batch(9, batch=12)
    settings = SearchSettings(**SETTINGS, need_attn="attention" in search, nbest=3 if search == "sample" else 1)
    prefixes = [[7, 5][:i % 3] for i in range(12)] if "prefixes" in search else None

    def run():
        if search == "sample":
            return sample(model, src, mask, settings)
        return greedy_search(model, src, mask, settings, prefixes=prefixes)

    usual = run()
    monkeypatch.setattr("nmtkit.decoding.search.COMPACT_SHARE", share)  # 0: at every finish; 1: never
    other = run()
    assert [[h.tokens for h in hyps] for hyps in other] == [[h.tokens for h in hyps] for hyps in usual]
    assert [h.score for hyps in other for h in hyps] == pytest.approx([h.score for hyps in usual for h in hyps],
                                                                       rel=1e-12)
    if settings.need_attn:
        for hyps, same in zip(other, usual):
            assert torch.equal(hyps[0].attention, same[0].attention)
            assert hyps[0].attention.shape[0] == len(hyps[0].tokens)


def test_length_limit_follows_source_length():
    src = torch.tensor([[11, A, A, A, A, A], [11, A, PAD, PAD, PAD, PAD]])
    # key 11 makes "c" likelier than EOS at every step, so greedy runs to the limit
    out = beam_search(ScriptedModel(SCRIPT), src, src.ne(PAD),
                      SearchSettings(beam_size=1, lenpen=0.0, max_len_a=1.0, max_len_b=1))
    assert [len(h[0].tokens) for h in out] == [7, 3]  # a * |x| + b with |x| = 6 and 2 pieces


def test_min_len_blocks_eos():
    src, mask = src_of([10])
    for search in (lambda m: beam_search(m, src, mask, SearchSettings(beam_size=2, lenpen=0.0, min_len=2, max_len_b=5)),
                   lambda m: greedy_search(m, src, mask, SearchSettings(lenpen=0.0, min_len=2, max_len_b=5))):
        [[best, *_]] = search(ScriptedModel(SCRIPT))
        assert len(best.tokens) >= 2


def test_attention_rows_per_output_piece():
    src, mask = src_of([11], length=3)
    [[hyp]] = beam_search(ScriptedModel(SCRIPT), src, mask,
                          SearchSettings(beam_size=1, max_len_a=0, max_len_b=4, need_attn=True))
    assert hyp.attention.shape == (4, 3)
    assert hyp.attention.argmax(1).tolist() == [0, 1, 2, 0]
    [[g]] = greedy_search(ScriptedModel(SCRIPT), src, mask, SearchSettings(max_len_a=0, max_len_b=4, need_attn=True))
    assert torch.equal(g.attention, hyp.attention)


# ---------------------------------------------------------------- tiny random models


SETTINGS = dict(max_len_a=1.0, max_len_b=4, min_len=1)


@torch.no_grad()
@pytest.mark.parametrize("lenpen", [0.0, 0.6, 2.0])
def test_beam_one_is_greedy(lenpen):
    for seed in range(4):
        model, (src, mask) = TinyModel(seed).eval(), random_batch(seed)
        beam = beam_search(model, src, mask, SearchSettings(beam_size=1, lenpen=lenpen, need_attn=True, **SETTINGS))
        greedy = greedy_search(model, src, mask, SearchSettings(lenpen=lenpen, need_attn=True, **SETTINGS))
        for [b], [g] in zip(beam, greedy):
            assert b.tokens == g.tokens
            assert b.score == pytest.approx(g.score, rel=1e-12)
            assert torch.allclose(b.attention, g.attention)


@torch.no_grad()
@pytest.mark.parametrize("lenpen", [0.0, 0.6, 1.5])
def test_exhaustive_beam_is_exact_and_beats_greedy(lenpen):
    """With a beam wider than every set of prefixes the search is exact: it must return the
    brute-force optimum (so its early stop lost nothing), which is never worse than greedy."""
    pieces, max_len = [4, 5, 6], 3
    for seed in range(3):
        model = TinyModel(seed, vocab=7, sharpness=1.0).eval()
        src, mask = random_batch(seed, batch=2, vocab=7, max_len=3)
        settings = dict(lenpen=lenpen, max_len_a=0, max_len_b=max_len, min_len=0)
        beam = beam_search(model, src, mask, SearchSettings(beam_size=len(pieces) ** max_len, **settings))
        greedy = greedy_search(model, src, mask, SearchSettings(**settings))
        for i in range(src.size(0)):
            one = (src[i:i + 1], mask[i:i + 1])
            best = max(all_outputs(pieces, max_len), key=lambda y: sequence_score(model, *one, y, lenpen))
            assert beam[i][0].tokens == best
            assert beam[i][0].score == pytest.approx(sequence_score(model, *one, best, lenpen), abs=1e-5)
            assert beam[i][0].score >= greedy[i][0].score - 1e-6


@torch.no_grad()
def test_narrow_beam_beats_greedy_on_average():
    """A narrow beam can lose to greedy on a sentence (beam search is not monotonic in the
    beam size: greedy's prefix can be pushed out of the beam), but rarely and not on average."""
    gains, losses = [], 0
    for seed in range(10):
        model, (src, mask) = TinyModel(seed, sharpness=1.0).eval(), random_batch(100 + seed)
        greedy = greedy_search(model, src, mask, SearchSettings(lenpen=0.6, **SETTINGS))
        beam = beam_search(model, src, mask, SearchSettings(beam_size=4, lenpen=0.6, **SETTINGS))
        for [g], hyps in zip(greedy, beam):
            gains.append(hyps[0].score - g.score)
            losses += hyps[0].score < g.score - 1e-6
    assert sum(gains) / len(gains) > 0
    assert losses <= 0.05 * len(gains)


@torch.no_grad()
def test_batch_composition_does_not_change_outputs():
    model = TinyModel(3).eval()
    src, mask = random_batch(7, batch=8)
    together = beam_search(model, src, mask, SearchSettings(beam_size=3, nbest=2, **SETTINGS))
    for i in range(src.size(0)):
        length = int(mask[i].sum())
        [alone] = beam_search(model, src[i:i + 1, :length], mask[i:i + 1, :length],
                              SearchSettings(beam_size=3, nbest=2, **SETTINGS))
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[i]], rel=1e-9)
    order = torch.randperm(src.size(0), generator=torch.Generator().manual_seed(0))
    shuffled = beam_search(model, src[order], mask[order], SearchSettings(beam_size=3, nbest=2, **SETTINGS))
    for j, i in enumerate(order.tolist()):
        assert [h.tokens for h in shuffled[j]] == [h.tokens for h in together[i]]


@torch.no_grad()
def test_nbest_is_sorted_distinct_and_complete():
    model = TinyModel(5).eval()
    src, mask = random_batch(5)
    for hyps in beam_search(model, src, mask, SearchSettings(beam_size=5, nbest=5, **SETTINGS)):
        assert len(hyps) == 5
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5
        for h in hyps:
            assert h.score == pytest.approx(h.logprob / ((5 + len(h.tokens)) / 6) ** 0.6)


@torch.no_grad()
def test_outputs_respect_limits_and_never_empty():
    model = TinyModel(2).eval()
    src, mask = random_batch(2, batch=10)
    limits = (mask.sum(1) * 0.5 + 2).floor().long().tolist()
    for search in (lambda: beam_search(model, src, mask,
                                       SearchSettings(beam_size=4, max_len_a=0.5, max_len_b=2, min_len=2)),
                   lambda: greedy_search(model, src, mask, SearchSettings(max_len_a=0.5, max_len_b=2, min_len=2))):
        for hyps, limit in zip(search(), limits):
            assert hyps
            assert all(min(2, limit) <= len(h.tokens) <= limit for h in hyps)
            assert all(t not in (PAD, BOS, EOS) for h in hyps for t in h.tokens)


@torch.no_grad()
def test_sampling_is_seeded_and_topk_one_is_greedy():
    model = TinyModel(4).eval()
    src, mask = random_batch(4)
    first = sample(model, src, mask, SearchSettings(seed=7, nbest=3, **SETTINGS))
    again = sample(model, src, mask, SearchSettings(seed=7, nbest=3, **SETTINGS))
    other = sample(model, src, mask, SearchSettings(seed=8, nbest=3, **SETTINGS))
    tokens = lambda out: [[h.tokens for h in hyps] for hyps in out]  # noqa: E731
    assert tokens(first) == tokens(again)
    assert tokens(first) != tokens(other)
    assert all(len(hyps) == 3 for hyps in first)
    top1 = sample(model, src, mask, SearchSettings(seed=9, topk=1, temperature=0.7, **SETTINGS))
    greedy = greedy_search(model, src, mask, SearchSettings(**SETTINGS))
    assert tokens(top1) == tokens(greedy)
    nucleus = sample(model, src, mask, SearchSettings(seed=9, topp=1e-6, **SETTINGS))  # only the top piece survives
    assert tokens(nucleus) == tokens(greedy)


def test_a_vanishing_nucleus_keeps_the_most_likely_piece():
    """With topp far below any piece's mass only the top piece survives. A topp below float32's
    range (8.5e-154) compared as 0 with the top piece's mass before it, 0, and emptied the row."""
    inf = float("inf")
    lprobs = torch.tensor([[-inf, -4.5074, -inf, -inf, -1.1189, -6.1265, -5.6819, -5.4765, -4.7439, -4.5298,
                            -4.4294, -4.9485, -4.1491, -5.1332, -5.1162, -0.5842]] * 3)
    for topp in (8.460168885294222e-154, 1e-30, 0.5):
        choose = sampling_choice(torch.Generator().manual_seed(0), topp=topp)
        assert choose(lprobs).tolist() == [15, 15, 15]
    choose = sampling_choice(torch.Generator().manual_seed(0), topp=0.6)  # the top two: 0.57 + 0.34
    assert set(torch.cat([choose(lprobs) for _ in range(30)]).tolist()) == {4, 15}


@torch.no_grad()
def test_ensemble_averages_probabilities():
    one, two = TinyModel(1).eval(), TinyModel(2).eval()
    src, mask = random_batch(1)
    ensemble = EnsembleModel([one, two])
    enc = ensemble.encode(src, mask)
    state = ensemble.init_state(enc, 2)
    prev = torch.full((src.size(0) * 2,), BOS)
    logits, _ = ensemble.decode_step(prev, enc, state, need_attn=True)
    expected = [m.decode_step(prev, m.encode(src, mask), m.init_state(m.encode(src, mask), 2))[0]
                for m in (one, two)]
    probs = (expected[0].softmax(-1) + expected[1].softmax(-1)) / 2
    assert torch.allclose(logits.exp(), probs.float(), atol=1e-6)
    # already normalised: the log-softmax search applies is the identity
    assert torch.allclose(torch.log_softmax(logits, -1), logits, atol=1e-6)


@torch.no_grad()
def test_ensemble_of_one_model_decodes_like_the_model():
    model = TinyModel(6).eval()
    src, mask = random_batch(6)
    alone = beam_search(model, src, mask, SearchSettings(beam_size=3, nbest=2, need_attn=True, **SETTINGS))
    wrapped = beam_search(EnsembleModel([model]), src, mask,
                          SearchSettings(beam_size=3, nbest=2, need_attn=True, **SETTINGS))
    for a, w in zip(alone, wrapped):
        assert [h.tokens for h in a] == [h.tokens for h in w]
        assert [h.score for h in a] == pytest.approx([h.score for h in w], rel=1e-5)


def test_one_sentence_limit_without_torch_equals_the_batched_rule():
    """The CTranslate2 engine's limit (pure Python, float32 as the tensors) is the search's."""
    from nmtkit.decoding.hypothesis import output_limit
    from nmtkit.decoding.search import output_limits

    gen = torch.Generator().manual_seed(3)
    for trial in range(300):
        batch, width = 6, int(torch.randint(1, 40, (1,), generator=gen))
        src = torch.randint(0, 12, (batch, width), generator=gen)
        src[:, -1] = torch.where(torch.rand(batch, generator=gen) < 0.5, EOS, src[:, -1])
        mask = torch.rand(batch, width, generator=gen) < 0.9
        src = torch.where(mask, src, PAD)
        a = [0.0, 1.0, 1.2, 1.5, 0.7, 2.3, 100.0, 1e-9, 0.1, 33.3][trial % 10]  # decode.max_len_a: [0, 100]
        b = int(torch.randint(0, 60, (1,), generator=gen)) if trial % 4 else [0, 9_999, 10_000, 4_097][trial % 16 // 4]
        positions = [None, 16, 64, 1024][trial % 4]
        prefixes = torch.randint(0, 30, (batch,), generator=gen) if trial % 3 == 0 else None
        batched = output_limits(src, mask, a, b, positions, prefixes).tolist()
        alone = [output_limit(row[keep].tolist(), a, b, positions, 0 if prefixes is None else int(prefixes[i]))
                 for i, (row, keep) in enumerate(zip(src, mask))]
        assert alone == batched, (trial, a, b, positions)


def test_an_unknown_piece_counts_toward_the_length_limit():
    """The paper's limit is input length + 50: a line of <unk> pieces (an unseen script, with byte
    fallback off) gets the same limit as a line of known pieces of that length, in both engines' rules."""
    from nmtkit.decoding.hypothesis import output_limit
    from nmtkit.decoding.search import output_limits
    from nmtkit.specials import UNK

    src = torch.tensor([[5, UNK, UNK, UNK, EOS], [5, 6, 7, 8, EOS], [BOS, 5, EOS, PAD, PAD]])
    mask = src.ne(PAD)
    assert output_limits(src, mask, 1.0, 50, None).tolist() == [54, 54, 51]
    assert [output_limit(row[keep].tolist(), 1.0, 50, None) for row, keep in zip(src, mask)] == [54, 54, 51]
