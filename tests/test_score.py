"""nmtkit score and nmtkit.scoring: agreement with the sacrebleu command line, paired
significance tests, paper-style tokenized BLEU, and one-line errors at the CLI."""
from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nmtkit.errors import ConfigError, DataError
from nmtkit.scoring.metrics import corpus_scores
from nmtkit.scoring.significance import bootstrap_p_value, paired_test, randomisation_p_value
from nmtkit.scoring.tokenized import split_compounds, tokenized_bleu
from support.cli import run_cli
from support.text_io import write_lines

REFS = [
    "The committee approved the long-term budget on Tuesday.",
    "A well-known author will visit the city library next week.",
    "Prices rose by 3.5 percent in the first quarter of 2023.",
    "She said the decision was \"final\" and would not be reviewed.",
    "The old bridge was closed after a routine safety inspection.",
    "Our team spent three weeks testing the new software.",
    "Heavy rain caused flooding in several low-lying areas.",
    "The museum's café reopens on Monday with a brand-new menu.",
    "He bought a second-hand bicycle for his daily commute.",
    "Scientists have discovered a new species of deep-sea fish.",
    "The school will offer free lunches to all pupils from September.",
    "Traffic was slow on the motorway because of an accident.",
    "The minister refused to comment on the leaked report.",
    "Many small businesses struggled during the winter months.",
    "The orchestra performed a little-known symphony by Dvořák.",
    "Tickets for the final sold out within twenty minutes.",
    "The hospital hired forty new nurses this year.",
    "Engineers are still working to restore power to the region.",
    "The company's profits doubled compared with last year.",
    "A self-driving bus was tested on the campus roads.",
    "Voters will go to the polls again in the spring.",
    "The festival attracts thousands of visitors every summer.",
    "Police asked witnesses to come forward with information.",
    "The new law comes into force at the start of next month.",
    "Farmers warned that the dry weather could hurt the harvest.",
    "The airline cancelled dozens of flights because of the strike.",
    "Researchers measured air quality in twelve European cities.",
    "The council plans to plant a thousand trees along the river.",
    "Her latest novel is a fast-paced thriller set in Lisbon.",
    "The price of electricity is expected to fall in autumn.",
    "Students protested outside the university on Friday.",
    "The rescue team reached the climbers early in the morning.",
    "The report found that most households recycle their waste.",
    "A new railway line will connect the two largest cities.",
    "The striker scored twice in the second half.",
    "Officials said the water is safe to drink again.",
]
SYNONYMS = {"approved": "passed", "visit": "come to", "rose": "increased", "said": "stated", "closed": "shut",
            "caused": "led to", "bought": "purchased", "discovered": "found", "refused": "declined",
            "struggled": "had difficulties", "hired": "recruited", "doubled": "grew twofold", "tested": "trialled",
            "attracts": "draws", "asked": "urged", "warned": "cautioned", "cancelled": "scrapped",
            "plans": "intends", "expected": "forecast", "reached": "got to", "found": "showed", "scored": "netted"}
FILLERS = ["it", "very", "some", "there", "of", "and"]


def degrade(sentence: str, rate: float, seed: int) -> str:
    """A fake system output: each word kept, dropped, replaced or doubled, deterministically."""
    rng = random.Random(f"{seed}:{sentence}")
    words = []
    for word in sentence.split():
        roll = rng.random()
        if roll < rate / 3:
            continue
        if roll < 2 * rate / 3:
            words.append(rng.choice(FILLERS))
        elif roll < rate:
            words.extend([word, word])
        else:
            words.append(word)
    return " ".join(words)


def paraphrase(sentence: str) -> str:
    return " ".join(SYNONYMS.get(word, word) for word in sentence.split())


GOOD = [degrade(s, 0.12, seed=1) for s in REFS]
BAD = [degrade(s, 0.6, seed=2) for s in REFS]
REFS2 = [paraphrase(s) for s in REFS]


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    return {"ref": write_lines(tmp_path / "ref.txt", REFS), "ref2": write_lines(tmp_path / "ref2.txt", REFS2),
            "good": write_lines(tmp_path / "good.txt", GOOD), "bad": write_lines(tmp_path / "bad.txt", BAD)}


def sacrebleu_cli(refs: list[Path], hyp: Path, *flags: str) -> dict[str, dict]:
    """The reference implementation: ``python -m sacrebleu``'s JSON, 10 decimals, keyed by metric name."""
    result = subprocess.run([sys.executable, "-m", "sacrebleu", *map(str, refs), "-i", str(hyp),
                             "-m", "bleu", "chrf", "ter", "-w", "10", *flags],
                            capture_output=True, text=True, check=True)
    return {entry["name"]: entry for entry in json.loads(result.stdout)}


def score_json(*args: str, input: str | None = None) -> dict:
    result = run_cli("score", "--json", *args, input=input)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


# --- agreement with sacreBLEU ------------------------------------------------------------

@pytest.mark.parametrize("refs, lowercase", [(["ref"], False), (["ref", "ref2"], False), (["ref2", "ref"], True)])
def test_scores_equal_sacrebleu_command_line(files, refs, lowercase):
    ref_paths = [files[name] for name in refs]
    flags = ["-lc", "--chrf-lowercase"] if lowercase else []
    expected = sacrebleu_cli(ref_paths, files["good"], *flags)
    args = [arg for path in ref_paths for arg in ("-r", str(path))] + (["--lowercase"] if lowercase else [])
    ours = score_json(*args, "-i", str(files["good"]))["scores"]
    assert [entry["name"] for entry in ours.values()] == list(expected)
    for entry in ours.values():
        assert f"{entry['score']:.10f}" == f"{expected[entry['name']]['score']:.10f}"
        assert entry["signature"] == expected[entry["name"]]["signature"]
        assert f"nrefs:{len(refs)}" in entry["signature"]


def test_table_shows_sacrebleu_bleu_details(files):
    expected = sacrebleu_cli([files["ref"]], files["bad"])["BLEU"]
    result = run_cli("score", "-r", str(files["ref"]), input=files["bad"].read_bytes())
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()
    assert expected["verbose_score"] in out and expected["signature"] in out
    assert f"{expected['score']:.2f}" in out


def test_more_references_score_higher_and_are_order_free():
    single = corpus_scores(GOOD, [REFS2])
    both = corpus_scores(GOOD, [REFS2, REFS])
    assert both["bleu"]["score"] > single["bleu"]["score"]
    assert both["ter"]["score"] < single["ter"]["score"]
    assert corpus_scores(GOOD, [REFS, REFS2]) == both


def test_corpus_scores_api():
    scores = corpus_scores(REFS, [REFS], metrics=["bleu"])
    assert list(scores) == ["bleu"]
    bleu = scores["bleu"]
    assert bleu["score"] == pytest.approx(100.0) and bleu["bp"] == 1.0 and bleu["ratio"] == 1.0
    assert bleu["precisions"] == [100.0] * 4 and bleu["sys_len"] == bleu["ref_len"]
    with pytest.raises(DataError, match="line counts differ: hypotheses has 35 lines but reference 1 has 36"):
        corpus_scores(REFS[:-1], [REFS])
    with pytest.raises(ConfigError, match="unknown metric"):
        corpus_scores(REFS, [REFS], metrics=["meteor"])


# --- significance ------------------------------------------------------------------------

@pytest.mark.parametrize("test", ["bootstrap", "ar"])
def test_identical_systems_are_not_significant(test):
    results = paired_test(GOOD, list(GOOD), [REFS], test=test, resamples=200)
    for result in results.values():
        assert result.p_value == 1.0
        assert result.delta == 0 and result.better == "none" and not result.significant
        assert result.system_ci == result.baseline_ci


@pytest.mark.parametrize("test", ["bootstrap", "ar"])
def test_clearly_better_system_is_significant(test):
    results = paired_test(GOOD, BAD, [REFS], test=test, resamples=500)
    for name, result in results.items():
        assert result.better == "system", name
        assert result.p_value < 0.05, name
        low, high = result.system_ci
        assert low <= result.system <= high


@pytest.mark.parametrize("test", ["bootstrap", "ar"])
def test_significance_is_seeded_and_symmetric(test):
    first = paired_test(GOOD, BAD, [REFS, REFS2], test=test, resamples=100, seed=7)
    again = paired_test(GOOD, BAD, [REFS, REFS2], test=test, resamples=100, seed=7)
    swapped = paired_test(BAD, GOOD, [REFS, REFS2], test=test, resamples=100, seed=7)
    other_seed = paired_test(GOOD, BAD, [REFS, REFS2], test=test, resamples=100, seed=8)
    assert first == again
    for name, result in first.items():
        assert swapped[name].p_value == result.p_value
        assert swapped[name].system_ci == result.baseline_ci
    assert any(other_seed[name].system_ci != first[name].system_ci for name in first)


def test_bootstrap_and_randomisation_agree_on_a_close_call():
    close = [degrade(s, 0.16, seed=3) for s in REFS]  # BLEU within 2 points of GOOD
    bootstrap = paired_test(GOOD, close, [REFS], test="bootstrap", resamples=1000)
    randomised = paired_test(GOOD, close, [REFS], test="ar", resamples=1000)
    for name in bootstrap:
        assert 0.1 < bootstrap[name].p_value and abs(bootstrap[name].p_value - randomised[name].p_value) < 0.15


def test_significance_scores_equal_corpus_scores():
    results = paired_test(BAD, GOOD, [REFS, REFS2], resamples=10)
    scores = corpus_scores(BAD, [REFS, REFS2])
    baseline_scores = corpus_scores(GOOD, [REFS, REFS2])
    for name, result in results.items():
        assert (result.system, result.baseline) == (scores[name]["score"], baseline_scores[name]["score"])
        assert result.name == scores[name]["name"]


def test_p_values_by_hand():
    # Observed difference 2; centred resampled differences -1, 0, 3 -> |.| >= 2 once: (1 + 1) / (1 + 3).
    assert bootstrap_p_value(np.array([1.0, 2.0, 5.0]), 2.0) == pytest.approx(0.5)
    # Shuffled differences 1, -2, 3 against observed 2: two as large -> (1 + 2) / (1 + 3).
    assert randomisation_p_value(np.array([1.0, -2.0, 3.0]), 2.0) == pytest.approx(0.75)


def test_bad_test_options():
    with pytest.raises(ConfigError, match="unknown significance test"):
        paired_test(GOOD, BAD, [REFS], test="t-test")
    with pytest.raises(ConfigError, match=r"resamples must be in \[1, 10\*\*6\], got 0"):
        paired_test(GOOD, BAD, [REFS], resamples=0)


# --- tokenized BLEU ----------------------------------------------------------------------

def test_split_compounds_like_the_perl_one_liner():
    assert split_compounds("a well-known fact") == "a well ##AT##-##AT## known fact"
    assert split_compounds("- a - b -") == "- a - b -"  # only hyphens between two non-spaces
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"  # Perl s///g does not overlap matches


def test_tokenized_bleu_by_hand():
    hyps = ["a well-known fact.", "the cat"]
    refs = [["the well-known fact.", "the cat sat."]]
    # Tokens: "a well ##AT##-##AT## known fact ." (6) vs "the well ..." (6); "the cat" (2) vs "the cat sat ." (4).
    # Matches / totals per order: 1-grams 5+2 / 6+2, 2-grams 4+1 / 5+1, 3-grams 3 / 4, 4-grams 2 / 3.
    brevity = math.exp(1 - 10 / 8)
    expected = 100 * brevity * (7 / 8 * 5 / 6 * 3 / 4 * 2 / 3) ** 0.25
    result = tokenized_bleu(hyps, refs)
    assert result["score"] == pytest.approx(expected, rel=1e-12)
    assert (result["sys_len"], result["ref_len"], result["counts"]) == (8, 10, [7, 5, 3, 2])
    assert result["signature"].startswith("nmtkit-tokenized-bleu|")
    assert "NOT sacreBLEU" in result["note"]
    assert result["score"] != pytest.approx(corpus_scores(hyps, refs, ["bleu"])["bleu"]["score"])


def test_tokenized_bleu_differs_on_hyphenated_text_and_is_never_default(files):
    hyphenated = [i for i, line in enumerate(REFS) if "-" in line]
    hyps = [GOOD[i] for i in hyphenated]
    refs = [[REFS[i] for i in hyphenated]]
    assert tokenized_bleu(hyps, refs)["score"] > corpus_scores(hyps, refs, ["bleu"])["bleu"]["score"]

    plain = score_json("-r", str(files["ref"]), "-i", str(files["good"]))
    assert "tokenized_bleu" not in plain
    table = run_cli("score", "-r", str(files["ref"]), "-i", str(files["good"]), "--tokenized-bleu").stdout.decode()
    assert "NOT sacreBLEU" in table and "BLEU (tokenized)" in table


# --- the command line --------------------------------------------------------------------

def test_json_with_baseline_from_stdin(files):
    report = score_json("-r", str(files["ref"]), "--baseline", str(files["bad"]), "--resamples", "100",
                        "--tokenized-bleu", input=files["good"].read_text(encoding="utf-8"))
    assert report["hypotheses"] == "<stdin>" and report["sentences"] == len(REFS)
    assert set(report["scores"]) == {"bleu", "chrf", "ter"}
    assert report["tokenized_bleu"]["name"] == "BLEU (tokenized)"
    significance = report["significance"]
    assert (significance["test"], significance["resamples"]) == ("bootstrap", 100)
    assert set(significance["metrics"]) == {"bleu", "chrf", "ter"}
    bleu = significance["metrics"]["bleu"]
    assert bleu["system"] == report["scores"]["bleu"]["score"] and bleu["p_value"] < 0.05
    assert len(bleu["system_ci"]) == 2


def test_table_with_significance(files):
    result = run_cli("score", "-r", str(files["ref"]), "-i", str(files["good"]), "--baseline", str(files["bad"]),
                     "--test", "ar", "--resamples", "100", "--metrics", "bleu")
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()
    assert "approximate randomisation" in out and "95% CI" in out and "chrF" not in out


def one_line_error(*args: str, input: bytes | None = None) -> str:
    result = run_cli("score", *args, input=input)
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert "Traceback" not in stderr and result.stdout == b""
    assert stderr.startswith("nmtkit: error: ") and stderr.count("\n") == 1, stderr
    return stderr


def test_mismatched_line_counts_are_one_line_errors(files, tmp_path):
    short = write_lines(tmp_path / "short.txt", GOOD[:-2])
    message = one_line_error("-r", str(files["ref"]), "-i", str(short))
    assert f"{short} has 34 lines but {files['ref']} has 36 lines" in message
    message = one_line_error("-r", str(files["ref"]), "-r", str(short), "-i", str(files["good"]))
    assert f"{files['good']} has 36 lines but {short} has 34 lines" in message
    message = one_line_error("-r", str(files["ref"]), "-i", str(files["good"]), "--baseline", str(short))
    assert f"{short} has 34 lines" in message
    message = one_line_error("-r", str(files["ref"]), input=b"only one line\n")
    assert "<stdin> has 1 line but" in message


def test_empty_missing_and_undecodable_inputs(files, tmp_path):
    empty = write_lines(tmp_path / "empty.txt", [])
    assert "is empty but" in one_line_error("-r", str(files["ref"]), "-i", str(empty))
    assert "nothing to score" in one_line_error("-r", str(empty), "-i", str(empty))
    assert "file not found" in one_line_error("-r", str(tmp_path / "nope.txt"), "-i", str(files["good"]))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9\n".encode("latin-1"))
    assert f"{latin1}: line 1 is not valid UTF-8" in one_line_error("-r", str(latin1), input=b"cafe\n")
    one_ref = write_lines(tmp_path / "one.txt", ["café"])
    assert "<stdin>: line 1 is not valid UTF-8" in one_line_error("-r", str(one_ref), input=b"caf\xe9\n")


@pytest.mark.parametrize("flag, value", [("--test", "ar"), ("--resamples", "50"), ("--alpha", "0.01"), ("--test", "bogus")])
def test_significance_options_without_a_baseline_are_refused(files, flag, value):
    """They would be accepted and ignored: no test runs without --baseline."""
    message = one_line_error("-r", str(files["ref"]), "-i", str(files["good"]), flag, value)
    assert f"{flag} sets the significance test against --baseline" in message


def test_bad_options_are_one_line_errors(files):
    assert "unknown metric 'meteor'" in one_line_error("-r", str(files["ref"]), "--metrics", "bleu,meteor",
                                                       input=b"x\n")
    assert "unknown significance test" in one_line_error("-r", str(files["ref"]), "-i", str(files["good"]),
                                                         "--baseline", str(files["bad"]), "--test", "t")
    assert "--baseline needs" in one_line_error("-r", str(files["ref"]), "-i", str(files["good"]), "--metrics", "",
                                                "--tokenized-bleu", "--baseline", str(files["bad"]))


UNREAD_BY_THESE_METRICS = "is read by --metrics bleu and ter only (ter: to split Chinese, Japanese and Korean): add " \
                          "one of them or leave it out"


@pytest.mark.parametrize("args, message", [
    (("--metrics", "bleu,chrf", "--source", "REF"), "--source is for --metrics comet (COMET reads the source "
                                                    "sentences): add comet to --metrics or leave it out"),
    (("--comet-batch-size", "8"), "--comet-batch-size is for --metrics comet: add comet to --metrics or leave it out"),
    (("--comet-batch-size", "16"), "--comet-batch-size is for --metrics comet: add comet to --metrics or leave it out"),
    (("--metrics", "chrf", "--tokenize", "zh"), f"--tokenize {UNREAD_BY_THESE_METRICS}"),
    (("--metrics", "chrf,chrf++", "-l", "zh"), f"--target-lang {UNREAD_BY_THESE_METRICS}"),
    (("--metrics", "", "--tokenized-bleu", "-tok", "intl"), f"--tokenize {UNREAD_BY_THESE_METRICS}"),
])
def test_options_no_chosen_metric_reads_are_refused(files, args, message):
    """Each was accepted and ignored (a --source file read and counted, then unused); tokenized
    BLEU always tokenizes with 13a, so it reads no --tokenize either."""
    args = [str(files["ref"]) if arg == "REF" else arg for arg in args]
    assert one_line_error("-r", str(files["ref"]), "-i", str(files["good"]), *args) == f"nmtkit: error: {message}\n"


def test_the_json_names_a_tokenizer_only_when_bleu_used_it(files):
    """chrF never reads one and TER only chooses its CJK split from it (its signature says so):
    without BLEU the report claims no tokenizer."""
    args = ("-r", str(files["ref"]), "-i", str(files["good"]))
    assert list(score_json(*args, "--metrics", "chrf")) == ["hypotheses", "references", "sentences", "scores"]
    assert "tokenize" not in score_json(*args, "--metrics", "", "--tokenized-bleu")
    ter = score_json(*args, "--metrics", "ter", "--tokenize", "zh")  # read: TER splits CJK characters
    assert "tokenize" not in ter and "asian:yes" in ter["scores"]["ter"]["signature"]
    assert score_json(*args, "--metrics", "chrf,bleu", "-l", "zh")["tokenize"] == "zh"
