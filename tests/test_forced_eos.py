"""The EOS forced at the length limit: scored by its log-probability (nmtkit's rule) or free
(``eos_at_limit`` free: transformers' generate), and imported MarianMT models defaulting to
generate's rule and length counting."""
from __future__ import annotations

import json
import math

import pytest

from test_search import A, B_, C, ScriptedModel, src_of

from nmtkit.decoding.options import SearchSettings
from nmtkit.decoding.search import beam_search, greedy_search
from nmtkit.specials import EOS

# key 12, limit 2: "a a" is likely (0.54) but the model would rather not stop there (EOS 0.2);
# "b" ends on its own (0.4 * 0.5 = 0.2), "b c" is cut by the limit (0.12, EOS certain after it)
SCRIPT = {(12, ()): {A: 0.6, B_: 0.4}, (12, (A,)): {A: 0.9, EOS: 0.1},
          (12, (B_,)): {EOS: 0.5, C: 0.3, A: 0.2}, (12, (A, A)): {EOS: 0.2, C: 0.8}}


@pytest.mark.parametrize("rule", ["scored", "free"])
def test_forced_eos_rule_picks_the_beam_winner(rule):
    free = rule == "free"
    src, mask = src_of([12])
    settings = SearchSettings(beam_size=2, nbest=2, lenpen=0.0, max_len_a=0, max_len_b=2, eos_at_limit=rule)
    [hyps] = beam_search(ScriptedModel(SCRIPT), src, mask, settings)
    a_a = math.log(0.54) if free else math.log(0.54 * 0.2)
    expected = [([A, A], a_a), ([B_], math.log(0.2))] if free else [([B_], math.log(0.2)), ([B_, C], math.log(0.12))]
    assert [(h.tokens, pytest.approx(h.logprob)) for h in hyps] == expected


def test_forced_eos_rule_scores_greedy_output_at_the_limit():
    src, mask = src_of([12])
    for rule, logprob in (("scored", math.log(0.54 * 0.2)), ("free", math.log(0.54))):
        settings = SearchSettings(lenpen=0.0, max_len_a=0, max_len_b=2, eos_at_limit=rule)
        [[hyp]] = greedy_search(ScriptedModel(SCRIPT), src, mask, settings)
        assert hyp.tokens == [A, A] and hyp.logprob == pytest.approx(logprob)
    settings = SearchSettings(lenpen=0.0, max_len_a=0, max_len_b=3, eos_at_limit="free")  # ends before the limit
    [[hyp]] = greedy_search(ScriptedModel(SCRIPT), src, mask, settings)
    assert hyp.tokens == [A, A, C] and hyp.logprob == pytest.approx(math.log(0.54 * 0.8))


def test_import_takes_generates_limit_and_eos_rule(tmp_path):
    pytest.importorskip("transformers")
    from support.marian_models import make_marian

    from nmtkit.pretrained.marian_import import import_marian
    from nmtkit.translate_files import saved_decode_settings

    hf_dir = make_marian(tmp_path / "hf", d_model=8, layers=1)
    cases = [({"num_beams": 3, "max_length": 20, "forced_eos_token_id": 0, "min_length": 3}, 3, 18, 2),  # + EOS
             ({"num_beams": 2, "max_length": 20, "min_length": 3, "min_new_tokens": 4}, 2, 19, 4),  # no EOS
             (None, 4, 50, 0)]  # config.json's settings: EOS forced, no length given (nmtkit's default)
    for n, (generation, beam, limit, shortest) in enumerate(cases):
        if generation is None:
            (hf_dir / "generation_config.json").unlink()
        else:
            (hf_dir / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")
        decode = saved_decode_settings(import_marian(str(hf_dir), tmp_path / f"model{n}"))
        got = (decode.beam_size, decode.max_len_b, decode.min_len, decode.eos_at_limit)
        assert got == (beam, limit, shortest, "free")
        assert decode.max_len_a == (0.0 if generation else 1.0)
