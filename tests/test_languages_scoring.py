"""Scoring in any language: every sacreBLEU tokenizer that runs here gives the `sacrebleu`
command line's BLEU digit for digit, the target language picks the tokenizer, chrF++ and the
CJK-aware TER equal sacreBLEU's, segment scores equal sacreBLEU's sentence scores, every
metric has a paired test, and what cannot run here is a one-line error naming the fix."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.cli import run_cli
from support.text_io import write_lines

from nmtkit.errors import ConfigError
from nmtkit.scoring.metrics import check_tokenizer, corpus_scores, default_tokenizer, segment_scores
from nmtkit.scoring.significance import paired_segment_test, paired_test

# a fixed multilingual text: Latin with punctuation, Chinese, Japanese, Korean, Hindi, Greek
REFS = ["The committee approved the budget on Tuesday, didn't it?",
        "我们明天去北京参观博物馆。",
        "東京の天気は今日とても良いです。",
        "서울에서 친구를 만났습니다.",
        "मैं कल दिल्ली जाऊँगा।",
        "Η βιβλιοθήκη ανοίγει στις εννέα.",
        "Prices rose by 3.5% in 2023 (a record)."]
HYPS = ["The committee approved a budget on Tuesday, did it?",
        "我们明天去北京看博物馆。",
        "東京の天気は今日は良いです。",
        "서울에서 친구를 만났어요.",
        "मैं कल दिल्ली जाऊंगा।",
        "Η βιβλιοθήκη ανοίγει στις δέκα.",
        "Prices rose 3.5% in 2023 (a record year)."]
BASE = ["The committee approves budgets.",
        "我们去北京。",
        "東京は良い。",
        "친구를 만났다.",
        "मैं दिल्ली।",
        "Η βιβλιοθήκη.",
        "Prices rose."]
OFFLINE = ["13a", "intl", "zh", "char", "none"]
MECAB = {"ja-mecab": "MeCab", "ko-mecab": "mecab_ko"}
SPM = {"flores101": "sacrebleu_tokenizer_spm.model", "flores200": "flores200sacrebleuspm",
       "spBLEU-1K": "spbleu-1k_tokenizer_spm.model"}


@pytest.fixture()
def files(tmp_path):
    return {"ref": write_lines(tmp_path / "ref.txt", REFS), "hyp": write_lines(tmp_path / "hyp.txt", HYPS),
            "base": write_lines(tmp_path / "base.txt", BASE)}


def sacrebleu_cli(ref: Path, hyp: Path, *flags: str) -> dict[str, dict]:
    """``python -m sacrebleu``'s JSON, 10 decimals, keyed by metric name: the reference."""
    result = subprocess.run([sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-w", "10", *flags],
                            capture_output=True, text=True, check=True)
    entries = json.loads(result.stdout)
    return {entry["name"]: entry for entry in (entries if isinstance(entries, list) else [entries])}


def score_json(*args: str) -> dict:
    result = run_cli("score", "--json", *args)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def assert_same(ours: dict, theirs: dict) -> None:
    assert f"{ours['score']:.10f}" == f"{theirs['score']:.10f}"
    assert ours["signature"] == theirs["signature"]


@pytest.fixture()
def spm_models(tmp_path, monkeypatch) -> Path:
    """sacreBLEU's flores/spBLEU SentencePiece models, stood in for by one trained here, in a
    SACREBLEU directory of this test's own (the command line reads the variable; sacreBLEU
    in this process has read it already, so its module attribute is pointed there too)."""
    import sacrebleu.tokenizers.tokenizer_spm as tokenizer_spm

    from nmtkit.data.vocab import train_spm

    home = tmp_path / "sacrebleu-home"
    (home / "models").mkdir(parents=True)
    train_spm(REFS * 20 + HYPS * 20, home / "models" / "m.model", vocab_size=120)
    for name in SPM.values():
        (home / "models" / name).write_bytes((home / "models" / "m.model").read_bytes())
    monkeypatch.setenv("SACREBLEU", str(home))
    monkeypatch.setattr(tokenizer_spm, "SACREBLEU_DIR", str(home))
    return home


@pytest.mark.parametrize("tokenize", OFFLINE + list(SPM) + list(MECAB))
def test_each_tokenizer_equals_the_sacrebleu_command_line(files, tokenize, request):
    if tokenize in MECAB:
        pytest.importorskip(MECAB[tokenize], reason=f"{tokenize} needs sacrebleu's extra (not installed here)")
    if tokenize in SPM:
        request.getfixturevalue("spm_models")
    expected = sacrebleu_cli(files["ref"], files["hyp"], "-m", "bleu", "-tok", tokenize)["BLEU"]
    ours = score_json("-r", str(files["ref"]), "-i", str(files["hyp"]), "--metrics", "bleu", "--tokenize", tokenize)
    assert ours["tokenize"] == tokenize
    assert_same(ours["scores"]["bleu"], expected)
    assert f"tok:{tokenize}" in ours["scores"]["bleu"]["signature"] or tokenize in MECAB


def test_tokenizers_give_different_scores_on_this_text():
    """The fixed text tells the tokenizers apart (else the test above could not fail)."""
    scores = {tok: corpus_scores(HYPS, [REFS], ["bleu"], tokenize=tok)["bleu"]["score"] for tok in OFFLINE}
    assert len({round(score, 6) for score in scores.values()}) == len(OFFLINE)


@pytest.mark.parametrize("lang, tokenize", [("zh", "zh"), ("zh-Hant", "zh"), ("zh_TW", "zh"), ("cmn", "zh"),
                                            ("ja", "ja-mecab"), ("jpn", "ja-mecab"), ("ko-KR", "ko-mecab"),
                                            ("th", "char"), ("tha", "char"), ("lo", "char"), ("km-KH", "char"),
                                            ("my", "char"), ("bo", "char"), (" zh ", "zh"), ("JA", "ja-mecab"),
                                            ("es", "13a"), ("hi", "13a"), ("", "13a")])
def test_the_target_language_picks_the_tokenizer(lang, tokenize):
    assert default_tokenizer(lang) == tokenize


def test_ter_counts_chinese_characters_as_words(tmp_path):
    """Without a character split each Chinese sentence is one TER 'word', and one wrong character
    costs the whole sentence (TER 50 here); split, it costs one of the reference's 12 characters."""
    ref = write_lines(tmp_path / "ref", ["我喜欢猫。", "今天天气很好。"])
    hyp = write_lines(tmp_path / "hyp", ["我喜欢狗。", "今天天气很好。"])
    report = score_json("-r", str(ref), "-i", str(hyp), "--metrics", "ter", "-l", "zh")
    assert report["scores"]["ter"]["score"] == pytest.approx(100 / 12)


def test_thai_is_scored_a_character_at_a_time(tmp_path):
    """A Thai sentence has no spaces between words: 13a would make each line one token and BLEU 0."""
    ref = write_lines(tmp_path / "ref", ["ฉันชอบแมวมาก", "วันนี้อากาศดี"])
    hyp = write_lines(tmp_path / "hyp", ["ฉันชอบหมามาก", "วันนี้อากาศดี"])
    thai = score_json("-r", str(ref), "-i", str(hyp), "--metrics", "bleu", "-l", "th")
    by_char = score_json("-r", str(ref), "-i", str(hyp), "--metrics", "bleu", "--tokenize", "char")
    assert thai["tokenize"] == "char" and "tok:char" in thai["scores"]["bleu"]["signature"]
    assert thai["scores"]["bleu"]["score"] == by_char["scores"]["bleu"]["score"] > 50


def test_target_lang_sets_the_tokenizer_and_the_signature_says_so(files):
    args = ("-r", str(files["ref"]), "-i", str(files["hyp"]), "--metrics", "bleu,ter")
    chinese = score_json(*args, "--target-lang", "zh")
    expected = sacrebleu_cli(files["ref"], files["hyp"], "-m", "bleu", "ter", "-tok", "zh", "--ter-asian-support",
                             "--ter-normalized")
    assert chinese["tokenize"] == "zh"
    assert_same(chinese["scores"]["bleu"], expected["BLEU"])
    assert_same(chinese["scores"]["ter"], expected["TER"])  # CJK tokenizers: TER splits those scripts too
    assert "asian:yes" in chinese["scores"]["ter"]["signature"] and "norm:yes" in chinese["scores"]["ter"]["signature"]
    german = score_json(*args, "-l", "de")
    assert german["tokenize"] == "13a" and "tok:13a" in german["scores"]["bleu"]["signature"]
    assert german["scores"]["bleu"]["score"] != chinese["scores"]["bleu"]["score"]
    # --tokenize wins over the language
    assert score_json(*args, "-l", "zh", "--tokenize", "char")["scores"]["bleu"]["signature"].count("tok:char") == 1


def test_chrf_plus_plus_equals_sacrebleu(files):
    expected = sacrebleu_cli(files["ref"], files["hyp"], "-m", "chrf", "--chrf-word-order", "2")["chrF2++"]
    ours = score_json("-r", str(files["ref"]), "-i", str(files["hyp"]), "--metrics", "chrf,chrf++")["scores"]
    assert_same(ours["chrf++"], expected)
    assert ours["chrf++"]["name"] == "chrF2++" and ours["chrf"]["name"] == "chrF2"
    assert ours["chrf++"]["score"] != ours["chrf"]["score"]


def test_segments_file_holds_sacrebleus_sentence_scores(files, tmp_path):
    from sacrebleu.metrics import BLEU, CHRF, TER

    out = tmp_path / "segments.jsonl"
    report = score_json("-r", str(files["ref"]), "-i", str(files["hyp"]), "--metrics", "bleu,chrf,chrf++,ter",
                        "-l", "zh", "--segments", str(out))
    assert report["segments"] == str(out)
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    bleu, chrf, chrfpp, ter = (BLEU(tokenize="zh", effective_order=True), CHRF(), CHRF(word_order=2),
                               TER(asian_support=True, normalized=True))
    assert [row["line"] for row in rows] == list(range(1, len(REFS) + 1))
    for row, hyp, ref in zip(rows, HYPS, REFS):
        assert set(row) == {"line", "bleu", "chrf", "chrf++", "ter"}
        assert row["bleu"] == bleu.sentence_score(hyp, [ref]).score
        assert row["chrf"] == chrf.sentence_score(hyp, [ref]).score
        assert row["chrf++"] == chrfpp.sentence_score(hyp, [ref]).score
        assert row["ter"] == ter.sentence_score(hyp, [ref]).score
    assert segment_scores(HYPS, [REFS], ["chrf"]) == [{"chrf": row["chrf"]} for row in rows]


def test_every_metric_has_a_paired_test_with_the_chosen_tokenizer(files):
    report = score_json("-r", str(files["ref"]), "-i", str(files["hyp"]), "--baseline", str(files["base"]),
                        "--metrics", "bleu,chrf,chrf++,ter", "-l", "zh", "--resamples", "200")
    significance = report["significance"]["metrics"]
    assert list(significance) == ["bleu", "chrf", "chrf++", "ter"]
    for name, result in significance.items():
        assert result["system"] == pytest.approx(report["scores"][name]["score"], abs=1e-9)
        assert result["better"] == "system"
    direct = paired_test(HYPS, BASE, [REFS], ["bleu"], resamples=200, tokenize="zh")["bleu"]
    assert significance["bleu"]["p_value"] == direct.p_value
    assert direct.system == corpus_scores(HYPS, [REFS], ["bleu"], tokenize="zh")["bleu"]["score"]


def test_a_mean_of_segments_metric_is_tested_like_the_others():
    """COMET's test: its corpus score is the mean of its segment scores. A system better by the
    same amount on every segment differs by exactly that in every resample, so no resample is
    as far from the observed delta as 0 is: p = 1 / (1 + resamples)."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.8, size=40).tolist()
    system = [score + 0.05 for score in base]
    result = paired_segment_test("COMET", system, base, resamples=300)
    assert result.system == pytest.approx(np.mean(system)) and result.delta == pytest.approx(0.05)
    assert result.p_value == pytest.approx(1 / 301) and result.better == "system"
    low, high = result.system_ci
    assert low < np.mean(system) < high
    same = paired_segment_test("COMET", base, list(base), resamples=300)
    assert same.p_value == 1.0 and same.better == "none"
    randomised = paired_segment_test("COMET", system, base, test="ar", resamples=300)
    assert randomised.p_value == pytest.approx(1 / 301)  # every swap moves the mean towards 0
    with pytest.raises(ConfigError, match="same, non-zero number"):
        paired_segment_test("COMET", system, base[:-1])


@pytest.mark.parametrize("args, message", [
    (("--tokenize", "moses"), "unknown tokenizer 'moses' (choose from 13a, intl, zh"),
    (("--metrics", "bleu,bertscore"), "unknown metric 'bertscore' in --metrics (choose from bleu, chrf, chrf++, ter, comet)"),
    (("--metrics", "comet"), "--metrics comet needs --comet-model DIR"),
    (("--comet-model", "x"), "--comet-model is for --metrics comet"),
    (("--metrics", "comet", "--comet-model", "nowhere"), "--metrics comet needs the source sentences"),
    (("--metrics", "comet", "--comet-batch-size", "0"), "--comet-batch-size must be"),
])
def test_bad_values_are_one_line_errors(files, args, message):
    result = run_cli("score", "-r", str(files["ref"]), "-i", str(files["hyp"]), *args)
    err = result.stderr.decode()
    assert result.returncode == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not result.stdout


def test_missing_mecab_names_the_extra_to_install(files):
    if any(_importable(module) for module in MECAB.values()):
        pytest.skip("MeCab is installed here")
    for lang, tokenize, extra in (("ja", "ja-mecab", "ja"), ("ko", "ko-mecab", "ko")):
        result = run_cli("score", "-r", str(files["ref"]), "-i", str(files["hyp"]), "-l", lang)
        err = result.stderr.decode().strip()
        assert result.returncode == 2 and len(err.splitlines()) == 1, err
        assert f"tokenizer {tokenize} needs MeCab" in err and f"pip install 'nmtkit[{extra}]'" in err


def test_a_flores_model_that_cannot_be_fetched_names_where_it_goes(files, tmp_path, monkeypatch):
    monkeypatch.setenv("SACREBLEU", str(tmp_path / "empty-home"))
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # no network, whatever the machine has
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    result = run_cli("score", "-r", str(files["ref"]), "-i", str(files["hyp"]), "--tokenize", "flores200")
    err = result.stderr.decode().strip()
    assert result.returncode == 2 and len(err.splitlines()) == 1, err
    assert "tokenizer flores200 needs sacreBLEU's SentencePiece model" in err
    assert f"to {tmp_path / 'empty-home' / 'models' / 'flores200sacrebleuspm'}" in err


def test_an_unreadable_flores_model_names_where_the_real_one_goes(files, tmp_path, monkeypatch):
    """An HTML page saved in the model's place (a download that followed no redirect) is a one-line
    error naming the URL and the path, not SentencePiece's traceback."""
    import sacrebleu.tokenizers.tokenizer_spm as tokenizer_spm

    home = tmp_path / "bad-home"
    (home / "models").mkdir(parents=True)
    (home / "models" / "sacrebleu_tokenizer_spm.model").write_text("<html>moved</html>\n")
    monkeypatch.setenv("SACREBLEU", str(home))
    monkeypatch.setattr(tokenizer_spm, "SACREBLEU_DIR", str(home))
    with pytest.raises(ConfigError, match="tokenizer flores101: sacreBLEU's SentencePiece model is not readable") as err:
        check_tokenizer("flores101")
    assert str(home / "models" / "sacrebleu_tokenizer_spm.model") in str(err.value) and "\n" not in str(err.value)
    result = run_cli("score", "-r", str(files["ref"]), "-i", str(files["hyp"]), "--tokenize", "flores101")
    message = result.stderr.decode().strip()
    assert result.returncode == 2 and len(message.splitlines()) == 1 and "not readable" in message, message


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_sweep_tables_add_chrf_plus_plus_and_comet_columns_only_when_scored():
    from nmtkit.sweep.results import COLUMNS, results_markdown

    def table(extra: dict) -> list[str]:
        row = {"name": "a", "status": "done", "settings": [], **dict.fromkeys(key for key, _, _ in COLUMNS),
               "test_bleu": 30.0, "test_chrf": 55.0, "test_ter": 60.0, **extra}
        results = {"sweep": "s", "sweep_file": "s.yaml", "recipe": "r.yaml", "overrides": [], "baseline": "a",
                   "significance": {"test": "paired bootstrap", "resamples": 1000, "seed": 1}, "variants": [row]}
        text = results_markdown(results).splitlines()
        header = next(line for line in text if line.startswith("| variant"))
        values = text[text.index(header) + 2]
        return [cell.strip() for cell in header.split("|")[1:-1]], [cell.strip() for cell in values.split("|")[1:-1]]

    header, _ = table({})
    assert header[1:5] == ["test BLEU", "p", "chrF", "TER"] and "chrF++" not in header and "COMET" not in header
    header, values = table({"test_chrf++": 57.25, "test_comet": 0.81234})
    assert header[1:7] == ["test BLEU", "p", "chrF", "TER", "chrF++", "COMET"]
    assert values[5:7] == ["57.25", "0.8123"]


def test_a_recipe_sets_comet_batch_size_only_with_comet_and_run_still_scores_bleu(tmp_path):
    """eval.comet_batch_size without comet in eval.metrics was range-checked and then read by
    nothing. `run` always computes BLEU, so its tokenizer and language stay read whatever the
    metrics (the CLI's refusals of an unread --tokenize or --target-lang do not reach it)."""
    from nmtkit.config import load_config
    from nmtkit.pipeline import eval_options

    overrides = ["data.source=sword", "data.tgt_lang=zh"]
    with pytest.raises(ConfigError) as refused:
        load_config(None, [*overrides, "eval.metrics=bleu,chrf", "eval.comet_batch_size=8"])
    assert str(refused.value) == ("eval.comet_batch_size is 8 but eval.metrics does not name comet: add it, or "
                                  "remove the key")
    cfg = load_config(None, [*overrides, "eval.metrics=chrf++,comet", f"eval.comet_model={tmp_path}",
                             "eval.comet_batch_size=8"])
    assert cfg.eval.comet_batch_size == 8
    chrf_only = eval_options(load_config(None, [*overrides, "eval.metrics=chrf", "eval.tokenize=char"]))
    assert (chrf_only.metrics, chrf_only.tokenizer) == (("bleu", "chrf"), "char")
    by_language = eval_options(load_config(None, [*overrides, "eval.metrics=chrf"]))
    assert by_language.tokenizer == "zh"
