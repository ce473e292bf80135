"""Target prefixes and terminology constraints: a prefix is forced exactly and the search
goes on from it; every constraint is met whenever the length limit leaves room; a line that
asks for neither decodes exactly as without them."""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch

from nmtkit.config import ModelConfig
from nmtkit.decoding.ensemble import EnsembleModel
from nmtkit.decoding.guides import Guide, GuideFiles
from nmtkit.decoding.options import SearchSettings
from nmtkit.decoding.search import beam_search, greedy_search, sample
from nmtkit.decoding.translate import TranslateOptions, Translator, translate_lines
from nmtkit.errors import ConfigError, DataError
from nmtkit.runtime.console import NmtConsole
from nmtkit.translate_files import translate_file
from support.guided import FAST, LINES, guided, loaded, trained  # noqa: F401  (module fixtures)
from support.search_models import TinyModel, all_outputs, random_batch, sequence_score
from support.text_io import write_lines

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


def ranked(model, src, mask, row: int, keep, max_len: int = MAX_LEN) -> list[list[int]]:
    """Every output up to ``max_len`` that ``keep`` accepts, best score first (brute force)."""
    one = (src[row:row + 1], mask[row:row + 1])
    outputs = [y for y in all_outputs(PIECES, max_len) if keep(y)]
    return sorted(outputs, key=lambda y: -sequence_score(model, *one, y, EXACT["lenpen"]))


# ------------------------------------------------------------------ search, scripted exactly

@torch.no_grad()
def test_prefix_is_forced_and_the_rest_is_the_best_continuation():
    for seed in range(3):
        model = TinyModel(seed, vocab=7, sharpness=1.0).eval()
        src, mask = random_batch(seed, batch=3, vocab=7, max_len=3)
        prefixes = [[5], [], [6, 4]]
        out = beam_search(model, src, mask, SearchSettings(beam_size=WIDE, nbest=3, **EXACT), prefixes=prefixes)
        plain = beam_search(model, src, mask, SearchSettings(beam_size=WIDE, nbest=3, **EXACT))
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
        out = beam_search(model, src, mask, SearchSettings(beam_size=WIDE, nbest=2, **EXACT), constraints=[phrases, []])
        meets = (lambda y: y.count(5) >= 2) if phrases == [[5], [5]] else \
            (lambda y: all(contains(y, p) for p in phrases))  # a phrase listed twice must appear twice
        assert [h.tokens for h in out[0]] == ranked(model, src, mask, 0, meets)[:2]
        plain = beam_search(model, src, mask, SearchSettings(beam_size=WIDE, nbest=2, **EXACT))
        assert_same(out[1], plain[1])


@torch.no_grad()
@pytest.mark.parametrize("phrase", [[5, 5, 6], [4, 4, 1]])
def test_a_self_overlapping_phrase_is_met_wherever_the_output_holds_it(phrase):
    """Outputs of up to 4 pieces, searched exhaustively (a beam over all 4^3 live prefixes):
    the n-best for a phrase that overlaps itself are all the outputs holding it, best first,
    "5 5 5 6" for "5 5 6" among them (the phrase starts over from its second piece)."""
    longer = {**EXACT, "max_len_b": 4}
    for seed in range(2):
        model = TinyModel(seed, vocab=7, sharpness=1.0).eval()
        src, mask = random_batch(seed, batch=2, vocab=7, max_len=3)
        best = ranked(model, src, mask, 0, lambda y: contains(y, phrase), max_len=4)
        assert len(best) == 9 and phrase[:1] * 2 + phrase[1:] in best
        out = beam_search(model, src, mask,
                          SearchSettings(beam_size=256, nbest=len(best), **longer), constraints=[[phrase], []])
        assert [h.tokens for h in out[0]] == best
        assert_same(out[1], beam_search(model, src, mask, SearchSettings(beam_size=256, nbest=len(best), **longer))[1])


@torch.no_grad()
def test_constraints_that_fill_the_length_limit_are_the_whole_output():
    model = TinyModel(4).eval()
    src, mask = random_batch(4, batch=3)
    phrases = [[[7, 8, 9]], [[10], [5, 5]], [[11, 4, 11]]]
    for beam in (1, 2, 5):
        out = beam_search(model, src, mask,
                          SearchSettings(beam_size=beam, max_len_a=0, max_len_b=3), constraints=phrases)
        assert out[0][0].tokens == [7, 8, 9]
        assert out[1][0].tokens in ([10, 5, 5], [5, 5, 10])
        assert out[2][0].tokens == [11, 4, 11]
    short = beam_search(model, src, mask, SearchSettings(beam_size=3, max_len_a=0, max_len_b=2), constraints=phrases)
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
@pytest.mark.parametrize("arch", ["transformer", "rnn", "ensemble"])
def test_random_constraints_are_always_met_and_leave_other_sentences_alone(arch):
    models = tiny_models()
    model = EnsembleModel(list(models.values())) if arch == "ensemble" else models[arch]
    gen = torch.Generator().manual_seed(0)
    src, mask = random_batch(9, batch=8, vocab=24, max_len=7)
    constraints = []
    for row in range(8):
        count = row % 3  # 0, 1 or 2 phrases of 1 to 3 pieces
        constraints.append([torch.randint(4, 24, (int(torch.randint(1, 4, (1,), generator=gen)),),
                                          generator=gen).tolist() for _ in range(count)])
    settings = dict(max_len_a=1.0, max_len_b=8, lenpen=0.6)
    for beam in (1, 3, 5):
        out = beam_search(model, src, mask,
                          SearchSettings(beam_size=beam, nbest=min(beam, 2), **settings), constraints=constraints)
        plain = beam_search(model, src, mask, SearchSettings(beam_size=beam, nbest=min(beam, 2), **settings))
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
    runs = {"greedy": greedy_search(model, src, mask, SearchSettings(**settings), prefixes=prefixes),
            "sample": sample(model, src, mask, SearchSettings(seed=3, nbest=3, **settings), prefixes=prefixes),
            "beam": beam_search(model, src, mask, SearchSettings(beam_size=4, nbest=3, **settings), prefixes=prefixes),
            "ensemble": beam_search(EnsembleModel([model, other]), src, mask,
                                    SearchSettings(beam_size=3, nbest=2, **settings), prefixes=prefixes),
            "beam-1": beam_search(model, src, mask, SearchSettings(beam_size=1, **settings), prefixes=prefixes)}
    for name, out in runs.items():
        for hyps, prefix in zip(out, prefixes):
            assert all(h.tokens[:len(prefix)] == prefix for h in hyps), name
    assert [h[0].tokens for h in runs["greedy"]] == [h[0].tokens for h in runs["beam-1"]]
    assert runs["greedy"][1][0].tokens == greedy_search(model, src, mask, SearchSettings(**settings))[1][0].tokens
    long_prefix = [[4] * 12, [], [5] * 3, [], []]  # longer than a * |x| + b: the limit grows to fit it
    out = beam_search(model, src, mask, SearchSettings(beam_size=2, max_len_a=0, max_len_b=2), prefixes=long_prefix)
    assert out[0][0].tokens == [4] * 12 and len(out[1][0].tokens) <= 2 and out[2][0].tokens[:3] == [5] * 3


# ------------------------------------------------------------------ translate on a trained model

def test_outputs_start_with_exactly_their_prefix(loaded, reversal_spm, tmp_path):  # noqa: F811
    from nmtkit.modeldir import load_model_dir, save_model_dir
    from nmtkit.models.build import build_model

    plain = translate_lines(loaded, LINES, TranslateOptions(beam_size=1, **FAST))
    prefixes = ["", " ".join(plain[1].split()[:2]), "j j", "a b Ω", "", "c ", "b", "a\tb"]
    guides = [Guide(prefix) for prefix in prefixes]
    torch.manual_seed(5)
    cfg = ModelConfig(d_model=32, ffn_dim=64, heads=2, encoder_layers=1, decoder_layers=1, max_positions=64)
    second = save_model_dir(build_model(cfg, 16, 16), cfg, tmp_path / "second", reversal_spm, reversal_spm, {})
    ensemble = loaded + [load_model_dir(second)]
    for models, settings in ((loaded, dict(beam_size=1)), (loaded, dict(beam_size=4)),
                             (loaded, dict(beam_size=4, nbest=3)), (ensemble, dict(beam_size=3, nbest=2))):
        out = guided(models, guides, **settings)
        texts = [[line.split("\t")[-1] for line in out[i].split("\n")] for i in range(len(prefixes))]
        for prefix, hyps in zip(prefixes, texts):
            assert all(text.startswith(prefix.replace("\t", " ")) for text in hyps), (settings, prefix, hyps)
        assert sum(len(hyps[0]) > len(prefix) + 2 for prefix, hyps in zip(prefixes, texts)) >= 6  # it goes on
    greedy = guided(loaded, guides, beam_size=1)
    assert greedy[1] == plain[1]  # the greedy output's own start changes nothing
    assert greedy[0] == plain[0] and greedy[4] == plain[4]


def test_constraints_appear_in_every_output(loaded):  # noqa: F811
    plain = translate_lines(loaded, LINES, TranslateOptions(beam_size=4, **FAST))
    sets = [["j"], ["b c"], [], ["a", "h i"], ["e f g"], ["d", "d"], ["i"], ["c", "j a"]]
    for beam in (1, 4):
        out = guided(loaded, [Guide(constraints=tuple(s)) for s in sets], beam_size=beam)
        for text, phrases, original in zip(out, sets, plain):
            words = f" {text} "
            for phrase in phrases:
                assert f" {phrase} " in words, (beam, phrases, text)
            if len(phrases) == 2 and phrases[0] == phrases[1]:
                assert text.split().count(phrases[0]) >= 2
            if not phrases and beam == 4:
                assert text == original
    missing = sum(not all(f" {p} " in f" {o} " for p in s) for s, o in zip(sets, plain) if s)
    assert missing >= 4  # these constraints do change the plain outputs


def test_files_without_constraints_or_prefixes_decode_byte_identically(trained, tmp_path):  # noqa: F811
    source = write_lines(tmp_path / "in.txt", LINES + ["", "b a"])
    console = NmtConsole(verbosity=-1)
    options = TranslateOptions(beam_size=3, nbest=2, scores=True, **FAST)
    translate_file([str(trained)], source, tmp_path / "plain.txt", options, console)
    empty = write_lines(tmp_path / "empty.jsonl", ["[]", "", " [ ] "] + ["[]"] * 7)
    blank = write_lines(tmp_path / "prefix.txt", [""] * 10)
    translate_file([str(trained)], source, tmp_path / "guided.txt", options, console, GuideFiles(blank, empty))
    assert (tmp_path / "guided.txt").read_bytes() == (tmp_path / "plain.txt").read_bytes()
    absent = [next(s for s in "abcdefghij" if s not in line.split()) for line in LINES[:3]]
    mixed = write_lines(tmp_path / "mixed.jsonl", [json.dumps([absent[0]]), "[]", json.dumps([f"{absent[2]} a"])]
                        + ["[]"] * 7)
    translate_file([str(trained)], source, tmp_path / "mixed.txt", options, console, GuideFiles(None, mixed))
    got, want = [(tmp_path / n).read_text(encoding="utf-8").splitlines() for n in ("mixed.txt", "plain.txt")]
    assert got[2:4] == want[2:4] and got[6:] == want[6:] and got[:2] != want[:2]


@pytest.mark.parametrize("name, content, message", [
    ("short.jsonl", ["[]"] * 3, "has 10 lines but --constraints"),
    ("json.jsonl", ['["a"'] + ["[]"] * 9, "line 1: not JSON"),
    ("object.jsonl", ["[]", '{"a": 1}'] + ["[]"] * 8, "line 2: must be a JSON list of strings"),
    ("numbers.jsonl", ["[]", "[]", "[1, 2]"] + ["[]"] * 7, "line 3: must be a JSON list of strings"),
    ("blank.jsonl", ['["a", "  "]'] + ["[]"] * 9, "line 1: a constraint phrase is empty"),
])
def test_bad_constraint_files_are_one_line_errors_before_the_model_loads(name, content, message, tmp_path):
    source = write_lines(tmp_path / "in.txt", LINES + ["", "b a"])
    side = GuideFiles(None, write_lines(tmp_path / name, content))
    with pytest.raises(DataError, match=message) as err:  # no model: the files are checked first
        translate_file([str(tmp_path / "no-model")], source, tmp_path / "out.txt", TranslateOptions(**FAST),
                       NmtConsole(verbosity=-1), side)
    assert "\n" not in str(err.value) and not (tmp_path / "out.txt").exists()


def test_cli_refuses_mismatched_prefix_files_and_sampled_constraints(tmp_path, monkeypatch, capsys):
    from support.cli import assert_error, cli

    source = write_lines(tmp_path / "in.txt", LINES)
    prefixes = write_lines(tmp_path / "prefix.txt", ["a"] * 3)
    missing = str(tmp_path / "missing")  # no model: the files are checked before any model loads
    code, err = cli(monkeypatch, capsys, "translate", "-m", missing, "-i", str(source), "--prefix-file", str(prefixes))
    assert_error(code, err, 2, "has 8 lines but --prefix-file")
    constraints = write_lines(tmp_path / "c.jsonl", ["[]"] * 8)
    code, err = cli(monkeypatch, capsys, "translate", "-m", missing, "-i", str(source), "--constraints",
                    str(constraints), "--sample")
    assert_error(code, err, 2, "--constraints needs beam search")
    bad = write_lines(tmp_path / "bad.jsonl", ['["a"'] + ["[]"] * 7)
    code, err = cli(monkeypatch, capsys, "translate", "-m", missing, "-i", str(source), "--constraints", str(bad))
    assert_error(code, err, 2, "bad.jsonl: line 1: not JSON")
    assert capsys.readouterr().out == ""


def test_stdin_longer_or_shorter_than_the_prefix_file_is_an_error(trained, tmp_path, monkeypatch):  # noqa: F811
    """A stream cannot be counted first: the mismatch shows where the lines run out, and a file
    output is then not written at all."""
    prefixes = write_lines(tmp_path / "prefix.txt", ["a", "b"])
    for lines, expected in ((LINES[:3], "the input has more lines than --prefix-file"), (LINES[:1], "has 1 lines but")):
        stdin = io.TextIOWrapper(io.BytesIO("".join(line + "\n" for line in lines).encode()))
        monkeypatch.setattr(sys, "stdin", stdin)
        with pytest.raises(DataError, match=expected):
            translate_file([str(trained)], None, tmp_path / "out.txt", TranslateOptions(**FAST),
                           NmtConsole(verbosity=-1), GuideFiles(prefixes))
        assert not (tmp_path / "out.txt").exists()


def test_ctranslate2_engine_forces_prefixes_and_refuses_constraints(trained, loaded, tmp_path):  # noqa: F811
    pytest.importorskip("ctranslate2")
    from nmtkit.ctranslate2.engine import CT2Engine
    from nmtkit.ctranslate2.export import export_ctranslate2

    export = export_ctranslate2(trained, tmp_path / "ct2")
    options = TranslateOptions(beam_size=1, scores=True, **FAST)
    ct2_options = TranslateOptions(**{**options.__dict__, "engine": "ctranslate2"})
    prefixes = [Guide(p) for p in ["", "j i", "a", "b c d", "", "e", "f f f f f f f f", "g"]]
    ours = guided(loaded, prefixes, beam_size=1, scores=True)
    theirs = Translator(CT2Engine(export, ct2_options), ct2_options).translate(LINES, guides=prefixes)
    assert [o.split("\t")[1] for o in ours] == [t.split("\t")[1] for t in theirs]
    for o, t in zip(ours, theirs):
        assert float(o.split("\t")[0]) == pytest.approx(float(t.split("\t")[0]), abs=2e-3)
    beam_options = TranslateOptions(**{**ct2_options.__dict__, "beam_size": 3, "nbest": 2})
    nbest = Translator(CT2Engine(export, beam_options), beam_options).translate(LINES, guides=prefixes)
    for guide, lines in zip(prefixes, nbest):
        assert all(line.split("\t")[2].startswith(guide.prefix) for line in lines.split("\n"))
    with pytest.raises(ConfigError, match="CTranslate2 has no lexically constrained search"):
        translate_file([str(export)], write_lines(tmp_path / "in.txt", LINES), None, ct2_options,
                       NmtConsole(verbosity=-1), GuideFiles(None, write_lines(tmp_path / "c.jsonl", ["[]"] * 8)))


def test_bank_order_is_round_robin_from_the_most_advanced_bank():
    from nmtkit.decoding.constraints import bank_order

    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, float("-inf")], [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]])
    banks = torch.tensor([[0, 1, 0, 2, 1, 2], [0, 0, 0, 0, 0, 0]])
    # bank 2: 3 (and 5, -inf: last); bank 1: 1, 4; bank 0: 0, 2. Without banks: by score.
    assert bank_order(scores, banks, top_bank=2).tolist() == [[3, 1, 0, 4, 2, 5], [0, 1, 2, 3, 4, 5]]
