"""The EOS forced at the length limit: scored by its log-probability (nmtkit's rule) or free
(``eos_at_limit`` free: transformers' generate), and imported MarianMT models defaulting to
generate's rule and length counting."""
from __future__ import annotations

import json
import math

import pytest

from nmtkit.decoding.options import SearchSettings
from nmtkit.decoding.search import beam_search, greedy_search
from nmtkit.specials import EOS
from support.search_models import A, B_, C, ScriptedModel, src_of

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


def test_a_bad_rule_is_one_line(model_dir, monkeypatch, capsys, tmp_path):
    from support.cli import assert_error, cli

    source = tmp_path / "in.txt"
    source.write_text("a b\n", encoding="utf-8")
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(model_dir), "-i", str(source), "--eos-at-limit", "0")
    assert_error(code, err, 2, "--eos-at-limit must be scored or free, not '0'")


def test_ctranslate2_scores_follow_the_rule(reversal_spm, tmp_path):
    """Outputs cut at the limit: CTranslate2's re-scored log-probabilities drop the EOS as ours do."""
    pytest.importorskip("ctranslate2")
    from conftest import reversal_pairs, train_tiny

    from nmtkit.ctranslate2.engine import CT2Engine
    from nmtkit.ctranslate2.export import export_ctranslate2
    from nmtkit.decoding.translate import TranslateOptions, Translator, translate_lines
    from nmtkit.modeldir import load_model_dir

    model_dir = train_tiny(reversal_spm, tmp_path / "model", steps=60)
    out = export_ctranslate2(model_dir, tmp_path / "ct2")
    lines = [s for s, _ in reversal_pairs(12, 7, length=6)]
    for rule in ("scored", "free"):
        options = TranslateOptions(beam_size=1, scores=True, device="cpu", dtype="float32", max_len_a=0.0,
                                   max_len_b=3, eos_at_limit=rule)
        ours = [line.split("\t") for line in translate_lines([load_model_dir(model_dir)], lines, options)]
        ct2_options = TranslateOptions(**{**options.__dict__, "engine": "ctranslate2"})
        theirs = [line.split("\t") for line in Translator(CT2Engine(out, ct2_options), ct2_options).translate(lines)]
        assert [o[1] for o in ours] == [t[1] for t in theirs]
        assert all(float(o[0]) == pytest.approx(float(t[0]), abs=2e-3) for o, t in zip(ours, theirs))
        if rule == "scored":
            scored = [float(o[0]) for o in ours]
    assert all(float(o[0]) > s + 1e-3 for o, s in zip(ours, scored))  # every output was cut: its EOS now free
