"""What a user sees at the command line around files and outputs: help text, significance
verdicts, averaging fewer checkpoints than asked, paths from recipes, byte-order marks,
pipes as inputs (issue 14)."""
from __future__ import annotations

import json
import os
import re
import shutil
import threading
from pathlib import Path

import pytest

from conftest import run_cli, tiny_sentences
from test_translate import save_tiny_model

COMMANDS = ("prepare", "train", "translate", "score", "run", "average", "plot", "attention", "info", "export")


def help_text(*command: str) -> str:
    """``--help`` as one line of words (rich boxes and line wrapping removed)."""
    result = run_cli(*command, "--help")
    assert result.returncode == 0, result.stderr.decode()
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.stdout.decode("utf-8")).split())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_spm) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("model") / "model", tiny_spm, seed=0)


def one_line_error(result, code: int = 2) -> str:
    stderr = result.stderr.decode("utf-8")
    assert result.returncode == code, stderr
    assert "Traceback" not in stderr and stderr.startswith("nmtkit: error: ") and stderr.count("\n") == 1, stderr
    return stderr


# --- help text (item 10) -------------------------------------------------------------------

def test_help_shows_no_python_types():
    for command in ((), *((name,) for name in COMMANDS)):
        text = help_text(*command)
        assert "<bool>" not in text and "<list" not in text, (command, text)
    translate = help_text("translate")
    assert "--scores Prefix" in translate  # a flag shows no value placeholder
    assert "-m <path>... Model directory" in translate  # a repeatable option shows its element type


def test_help_says_what_run_translates_and_what_alignments_index():
    assert "translate dev and test" in help_text("run")
    assert "index SentencePiece pieces (not words)" in help_text("translate")


# --- significance verdicts (item 11) ---------------------------------------------------------

def test_no_winner_is_named_without_significance(tmp_path):
    refs = tiny_sentences(30, seed=1)
    system = [line if i % 2 else line + " the" for i, line in enumerate(refs)]
    baseline = [line if i % 2 == 0 else line + " the" for i, line in enumerate(refs)]  # as good, other lines
    for path, lines in (("ref", refs), ("sys", system), ("base", baseline)):
        (tmp_path / path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    args = ("score", "-r", str(tmp_path / "ref"), "-i", str(tmp_path / "sys"), "--baseline", str(tmp_path / "base"),
            "--resamples", "200", "--metrics", "bleu")
    result = run_cli(*args, "--json")
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    bleu = report["significance"]["metrics"]["bleu"]
    assert bleu["delta"] != 0 and bleu["p_value"] >= 0.05  # a difference, not a significant one
    assert (bleu["better"], bleu["significant"], report["significance"]["alpha"]) == ("none", False, 0.05)
    table = run_cli(*args).stdout.decode("utf-8")
    assert "no significant difference" in table and "system better" not in table
    # the same data at a level the p-value is below names the system that scores higher
    generous = json.loads(run_cli(*args, "--json", "--alpha", "0.999").stdout)["significance"]["metrics"]["bleu"]
    assert generous["significant"] and generous["better"] == ("system" if bleu["delta"] > 0 else "baseline")
    assert "alpha must be between 0 and 1" in one_line_error(run_cli(*args, "--alpha", "1.5"))


# --- average with fewer checkpoints than asked (item 7) --------------------------------------

def fake_run(root: Path, model_dir: Path, steps: tuple[int, ...]) -> Path:
    """A run directory whose checkpoints are copies of ``model_dir`` (averaging reads model dirs only)."""
    for step in steps:
        shutil.copytree(model_dir, root / "checkpoints" / f"step_{step:08d}")
    return root


def test_average_says_how_many_checkpoints_exist(tmp_path, model_dir):
    run = fake_run(tmp_path / "run", model_dir, (10, 20, 30))
    result = run_cli("average", str(run), "--last", "50")
    stderr = result.stderr.decode("utf-8")
    assert result.returncode == 0, stderr
    assert "--last 50" in stderr and "holds only 3 checkpoint(s)" in stderr and "averaging those 3" in stderr
    meta = json.loads((run / "averaged" / "config.json").read_text())
    assert meta["averaged_from"] == ["step_00000010", "step_00000020", "step_00000030"]
    quiet = run_cli("average", str(run), "--last", "2")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr.decode("utf-8")


# --- paths given by a recipe (item 12) -------------------------------------------------------

def test_a_missing_recipe_file_names_the_absolute_path_and_the_directory(tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    files = {split: {"en": f"data/{split}.en", "es": f"data/{split}.es"} for split in ("train", "dev", "test")}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"name": "paths", "workdir": str(tmp_path / "work"), "vocab": {"size": 30},
                                  "data": {"source": "files", "src_lang": "en", "tgt_lang": "es", "files": files}}))
    message = one_line_error(run_cli("prepare", str(recipe), cwd=work))
    assert f"{work}/data/train.en" in message  # the absolute path tried
    assert "'data/train.en'" in message and f"relative to the current directory {work}" in message


# --- text inputs: byte-order marks, CRLF, pipes (item 18) ------------------------------------

def test_score_ignores_a_byte_order_mark_and_crlf(tmp_path):
    refs = tiny_sentences(20, seed=3)
    plain = tmp_path / "ref.txt"
    plain.write_text("".join(line + "\n" for line in refs), encoding="utf-8")
    windows = tmp_path / "ref-windows.txt"
    windows.write_bytes(b"\xef\xbb\xbf" + "".join(line + "\r\n" for line in refs).encode("utf-8"))
    scores = {}
    for ref, hyp in ((plain, plain), (plain, windows), (windows, plain)):
        result = run_cli("score", "-r", str(ref), "-i", str(hyp), "--json", "--metrics", "bleu,chrf,ter")
        assert result.returncode == 0, result.stderr.decode()
        scores[ref, hyp] = {name: round(s["score"], 9) for name, s in json.loads(result.stdout)["scores"].items()}
    assert scores[plain, plain] == {"bleu": 100.0, "chrf": 100.0, "ter": 0.0}
    assert scores[plain, windows] == scores[windows, plain] == scores[plain, plain]


def test_score_reads_pipes_and_dev_stdin(tmp_path):
    refs = tiny_sentences(20, seed=4)
    ref = tmp_path / "ref.txt"
    ref.write_text("".join(line + "\n" for line in refs), encoding="utf-8")
    text = "".join(line + "\n" for line in refs)
    result = run_cli("score", "-r", str(ref), "-i", "/dev/stdin", "--json", "--metrics", "bleu", input=text)
    assert result.returncode == 0, result.stderr.decode()
    assert round(json.loads(result.stdout)["scores"]["bleu"]["score"], 9) == 100.0
    fifo = tmp_path / "hyp.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(text, encoding="utf-8"))
    writer.start()
    result = run_cli("score", "-r", str(ref), "-i", str(fifo), "--json", "--metrics", "bleu")
    writer.join()
    assert result.returncode == 0, result.stderr.decode()
    assert round(json.loads(result.stdout)["scores"]["bleu"]["score"], 9) == 100.0
    assert "is a directory" in one_line_error(run_cli("score", "-r", str(ref), "-i", str(tmp_path)))
