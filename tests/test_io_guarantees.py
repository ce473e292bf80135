"""What a user sees at the command line around files and outputs: help text, significance
verdicts, averaging fewer checkpoints than asked, paths from recipes, byte-order marks,
pipes as inputs."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import save_tiny_model, tiny_sentences
from support.cli import cli_in_process, run_cli

COMMANDS = ("prepare", "train", "translate", "serve", "score", "run", "sweep", "average", "plot", "attention", "info",
            "export", "import", "verses")


def help_text(monkeypatch, capsys, *command: str) -> str:
    """``--help`` as one line of words (rich boxes and line wrapping removed); in this process:
    the text is a subprocess's but for the program name on its usage line."""
    code, out, err = cli_in_process(monkeypatch, capsys, *command, "--help")
    assert code == 0, err
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_spm) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("model") / "model", tiny_spm, seed=0)


def one_line_error(result, code: int = 2) -> str:
    return one_line(result.returncode, result.stderr.decode("utf-8"), code)


def one_line(returncode: int, stderr: str, code: int = 2) -> str:
    """Exit ``code`` and a stderr of exactly one ``nmtkit: error:`` line (of a subprocess or of
    ``cli_in_process``)."""
    assert returncode == code, stderr
    assert "Traceback" not in stderr and stderr.startswith("nmtkit: error: ") and stderr.count("\n") == 1, stderr
    return stderr


def translated(monkeypatch, capsys, *args: str, input: str) -> bytes:
    """stdout of ``nmtkit translate ARGS`` run in this process on ``input`` as its stdin: the
    bytes to compare a subprocess's output with."""
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(input.encode("utf-8"))))
    code, out, err = cli_in_process(monkeypatch, capsys, "translate", *args)
    assert code == 0, err
    return out.encode("utf-8")


# --- help text -----------------------------------------------------------------------------

def test_help_shows_no_python_types(monkeypatch, capsys):
    import typer.main

    from nmtkit.cli import app

    assert sorted(COMMANDS) == sorted(typer.main.get_command(app).commands)  # every command is checked
    for command in ((), *((name,) for name in COMMANDS)):
        text = help_text(monkeypatch, capsys, *command)
        assert "<bool>" not in text and "<list" not in text, (command, text)
    translate = help_text(monkeypatch, capsys, "translate")
    assert "--scores Prefix" in translate  # a flag shows no value placeholder
    assert "-m <path>... Model directory" in translate  # a repeatable option shows its element type


def test_help_says_what_run_translates_and_what_alignments_index(monkeypatch, capsys):
    assert "translate dev and test" in help_text(monkeypatch, capsys, "run")
    translate = help_text(monkeypatch, capsys, "translate")
    assert "source word i is aligned to target word j, words split at whitespace" in translate
    assert "--alignment-units" in translate and "pieces (SentencePiece pieces;" in translate


# --- significance verdicts -------------------------------------------------------------------

def test_no_winner_is_named_without_significance(tmp_path, monkeypatch, capsys):
    refs = tiny_sentences(30, seed=1)
    system = [line if i % 2 else line + " the" for i, line in enumerate(refs)]
    baseline = [line if i % 2 == 0 else line + " the" for i, line in enumerate(refs)]  # as good, other lines
    for path, lines in (("ref", refs), ("sys", system), ("base", baseline)):
        (tmp_path / path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    args = ("score", "-r", str(tmp_path / "ref"), "-i", str(tmp_path / "sys"), "--baseline", str(tmp_path / "base"),
            "--resamples", "200", "--metrics", "bleu")
    code, out, err = cli_in_process(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    report = json.loads(out)
    bleu = report["significance"]["metrics"]["bleu"]
    assert bleu["delta"] != 0 and bleu["p_value"] >= 0.05  # a difference, not a significant one
    assert (bleu["better"], bleu["significant"], report["significance"]["alpha"]) == ("none", False, 0.05)
    code, table, err = cli_in_process(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "no significant difference" in table and "system better" not in table
    # the same data at a level the p-value is below names the system that scores higher
    code, out, err = cli_in_process(monkeypatch, capsys, *args, "--json", "--alpha", "0.999")
    generous = json.loads(out)["significance"]["metrics"]["bleu"]
    assert generous["significant"] and generous["better"] == ("system" if bleu["delta"] > 0 else "baseline")
    code, _, err = cli_in_process(monkeypatch, capsys, *args, "--alpha", "1.5")
    assert "alpha must be between 0 and 1" in one_line(code, err)
    assert "alpha must be between 0 and 1" in one_line_error(run_cli(*args, "--alpha", "1.5"))  # a real process too


# --- average with fewer checkpoints than asked -----------------------------------------------

def fake_run(root: Path, model_dir: Path, steps: tuple[int, ...]) -> Path:
    """A run directory whose checkpoints are copies of ``model_dir`` (averaging reads model dirs only)."""
    for step in steps:
        shutil.copytree(model_dir, root / "checkpoints" / f"step_{step:08d}")
    return root


def test_average_says_how_many_checkpoints_exist(tmp_path, model_dir, monkeypatch, capsys):
    run = fake_run(tmp_path / "run", model_dir, (10, 20, 30))
    code, _, stderr = cli_in_process(monkeypatch, capsys, "average", str(run), "--last", "50")
    assert code == 0, stderr
    assert "--last 50" in stderr and "holds only 3 checkpoint(s)" in stderr and "averaging those 3" in stderr
    meta = json.loads((run / "averaged" / "config.json").read_text())
    assert meta["averaged_from"] == ["step_00000010", "step_00000020", "step_00000030"]
    code, _, stderr = cli_in_process(monkeypatch, capsys, "average", str(run), "--last", "2")
    assert code == 0 and "warning" not in stderr


@pytest.mark.parametrize("change", [{"d_model": 32, "ffn_dim": 64}, {"positions": "rope"}])
def test_average_refuses_checkpoints_of_another_model(tmp_path, model_dir, tiny_spm, change, monkeypatch, capsys):
    """Another architecture among the averaged checkpoints (other shapes, or the same shapes with
    another meaning) is one line naming it, never a traceback or a silently wrong average."""
    from nmtkit.config import ModelConfig
    from nmtkit.models.build import build_model
    from nmtkit.modeldir import load_model_dir, save_model_dir

    run = fake_run(tmp_path / "run", model_dir, (10, 20))
    base = load_model_dir(model_dir).model_cfg
    other = ModelConfig(**{**base.__dict__, **change})
    size = load_model_dir(model_dir).model.output_proj.weight.shape[0]
    save_model_dir(build_model(other, size, size), other, run / "checkpoints" / "step_00000005", tiny_spm, tiny_spm, {})
    code, _, err = cli_in_process(monkeypatch, capsys, "average", str(run), "--last", "3", "-o", str(tmp_path / "avg"))
    assert "step_00000005 is another model than step_00000020" in one_line(code, err)
    assert not (tmp_path / "avg").exists()
    assert cli_in_process(monkeypatch, capsys, "average", str(run), "--last", "2", "-o", str(tmp_path / "avg"))[0] == 0


def test_run_says_when_it_averages_fewer_checkpoints_than_average_last(tmp_path, model_dir):
    """train.keep_last below train.average_last caps the average: `run` says so instead of silently."""
    from nmtkit.config import from_dict
    from nmtkit.pipeline import choose_model

    class Console:
        def __init__(self):
            self.warnings = []

        def warn(self, message):
            self.warnings.append(message)

        def info(self, *objects, **kwargs):
            pass

    run = fake_run(tmp_path / "run", model_dir, (10, 20))
    console = Console()
    chosen, meta = choose_model(from_dict({"data": {"source": "files"}, "train": {"average_last": 5, "keep_last": 2}}),
                                run, console)
    assert meta["averaged_from"] == ["step_00000010", "step_00000020"]
    assert console.warnings == [f"train.average_last=5 but {run / 'checkpoints'} holds 2 checkpoint(s) "
                                f"(train.keep_last=2): averaging those 2"]
    console = Console()
    choose_model(from_dict({"data": {"source": "files"}, "train": {"average_last": 2, "keep_last": 2}}), run, console)
    assert console.warnings == []


# --- paths given by a recipe -----------------------------------------------------------------

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


def test_a_relative_workdir_is_shown_with_the_directory_it_was_relative_to(tmp_path, monkeypatch, capsys):
    """The default workdir (data/NAME) is relative: run from the wrong directory, train names where it looked."""
    from support.cli import assert_error, cli

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"name": "paths", "data": {"source": "files"}}))
    monkeypatch.chdir(elsewhere)
    code, err = cli(monkeypatch, capsys, "train", str(recipe))
    assert_error(code, err, 2, f"{elsewhere}/data/paths/prepared/spm.model (workdir = 'data/paths', relative to "
                               f"the current directory {elsewhere}) not found: run `nmtkit prepare`")


# --- text inputs: byte-order marks, CRLF, pipes ----------------------------------------------

def test_translate_reads_pipes_and_dev_stdin_and_ignores_a_bom_and_crlf(tmp_path, model_dir, monkeypatch, capsys):
    from support.cli import cli_stdout

    text = "the cat sat\n\na red dog\n"
    plain = tmp_path / "plain.txt"
    plain.write_text(text, encoding="utf-8")
    expected = cli_stdout(monkeypatch, capsys, "translate", "-m", str(model_dir), *FAST, "-i", str(plain))
    assert len(expected.splitlines()) == 3
    windows = tmp_path / "windows.txt"
    windows.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    assert cli_stdout(monkeypatch, capsys, "translate", "-m", str(model_dir), *FAST, "-i", str(windows)) == expected
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(text, encoding="utf-8"))
    writer.start()
    assert cli_stdout(monkeypatch, capsys, "translate", "-m", str(model_dir), *FAST, "-i", str(fifo)) == expected
    writer.join()
    piped = run_cli("translate", "-m", str(model_dir), *FAST, "-i", "/dev/stdin", input=text)
    assert piped.returncode == 0 and piped.stdout.decode("utf-8") == expected, piped.stderr.decode()


def test_score_ignores_a_byte_order_mark_and_crlf(tmp_path, monkeypatch, capsys):
    refs = tiny_sentences(20, seed=3)
    plain = tmp_path / "ref.txt"
    plain.write_text("".join(line + "\n" for line in refs), encoding="utf-8")
    windows = tmp_path / "ref-windows.txt"
    windows.write_bytes(b"\xef\xbb\xbf" + "".join(line + "\r\n" for line in refs).encode("utf-8"))
    scores = {}
    for ref, hyp in ((plain, plain), (plain, windows), (windows, plain)):
        code, out, err = cli_in_process(monkeypatch, capsys, "score", "-r", str(ref), "-i", str(hyp), "--json",
                                        "--metrics", "bleu,chrf,ter")
        assert code == 0, err
        scores[ref, hyp] = {name: round(s["score"], 9) for name, s in json.loads(out)["scores"].items()}
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


# --- n-best lists --------------------------------------------------------------------------

FAST = ("--beam-size", "3", "--max-len-a", "0", "--max-len-b", "4", "--device", "cpu")


def test_nbest_gives_n_attributable_lines_for_every_input_line(model_dir, monkeypatch, capsys):
    lines = ["the cat sat", "", "   ", "a dog ran under the mat"]
    out = translated(monkeypatch, capsys, "-m", str(model_dir), *FAST, "--nbest", "3", "--alignments",
                     input="".join(line + "\n" for line in lines))
    rows = [row.split("\t") for row in out.decode("utf-8").splitlines()]
    assert len(rows) == 3 * len(lines)
    assert [int(row[0]) for row in rows] == [i for i in range(len(lines)) for _ in range(3)]
    assert all(len(row) == 4 for row in rows)  # index, score, text, alignments
    for i in range(len(lines)):
        scores = [float(row[1]) for row in rows[3 * i:3 * i + 3]]
        assert scores == sorted(scores, reverse=True)
    assert rows[3] == ["1", "0.0000", "", ""] and rows[4] == rows[5] == ["1", "-inf", "", ""]
    assert "exactly N lines per input line" in help_text(monkeypatch, capsys, "translate")


# --- -o: never destroy what nmtkit did not create --------------------------------------------

def test_translate_output_to_a_pipe_a_link_and_refused_places(tmp_path, model_dir, monkeypatch, capsys):
    """The pipe in a subprocess; links and refusals are paths, checked in this process."""
    text = "the cat sat\n\na red dog\n"
    expected = translated(monkeypatch, capsys, "-m", str(model_dir), *FAST, input=text)
    assert expected.count(b"\n") == 3
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = run_cli("translate", "-m", str(model_dir), *FAST, "-o", str(fifo), input=text)
    reader.join()
    assert result.returncode == 0, result.stderr.decode()
    assert fifo.is_fifo() and received == [expected]  # written in place, not replaced by a file

    target, link = tmp_path / "real.txt", tmp_path / "link.txt"
    target.write_text("old\n")
    link.symlink_to(target)
    assert translated(monkeypatch, capsys, "-m", str(model_dir), *FAST, "-o", str(link), input=text) == b""
    assert link.is_symlink() and target.read_bytes() == expected  # the link is followed, not replaced
    device_link = tmp_path / "null"
    device_link.symlink_to("/dev/null")
    assert translated(monkeypatch, capsys, "-m", str(model_dir), *FAST, "-o", str(device_link), input=text) == b""
    assert Path("/dev/null").is_char_device() and device_link.is_symlink()

    plain = tmp_path / "plain.txt"
    plain.write_text("mine\n")
    for output, fragment in (("", "-o is empty"), (str(tmp_path), "is a directory"),
                             (str(plain / "out.txt"), f"{plain} is not a directory")):
        # checked before the model is even looked for: the (missing) model is not the error
        code, _, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(tmp_path / "no-model"), "-o", output)
        assert fragment in one_line(code, err)
    assert plain.read_text() == "mine\n"
    alias = tmp_path / "alias.txt"
    alias.symlink_to(plain)
    for output in (plain, alias):  # the input itself, or a link to it: never replaced by its translation
        code, _, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(model_dir), *FAST, "-i", str(plain),
                                      "-o", str(output))
        assert "is the input file" in one_line(code, err)
    # once as a real process too: a stray warning on stderr would show there, not in this one
    assert "is the input file" in one_line_error(run_cli("translate", "-m", str(model_dir), *FAST, "-i", str(plain),
                                                         "-o", str(alias)))
    assert plain.read_text() == "mine\n" and alias.is_symlink()



def test_translate_to_open_descriptors_and_dashes(tmp_path, model_dir, monkeypatch, capsys):
    """``-o /dev/stdout`` writes through the descriptor: a ``>>`` file keeps what it held (it
    was once replaced), a pipe stays a pipe (was a missing /proc path); ``-`` is stdin/stdout."""
    text = "the cat sat\n\na red dog\n"
    expected = translated(monkeypatch, capsys, "-m", str(model_dir), *FAST, input=text)
    assert expected.count(b"\n") == 3
    command = [sys.executable, "-m", "nmtkit", "translate", "-m", str(model_dir), *FAST]
    appended = tmp_path / "all.txt"
    appended.write_bytes(b"precious line\n")
    for _ in range(2):
        with open(appended, "ab") as shell_append:  # what `>> all.txt` gives the command
            done = subprocess.run([*command, "-o", "/dev/stdout"], input=text.encode(), stdout=shell_append,
                                  stderr=subprocess.PIPE, timeout=600)
        assert done.returncode == 0, done.stderr.decode()
    assert appended.read_bytes() == b"precious line\n" + expected + expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.txt"]
    for output in ("/dev/stdout", "/dev/fd/1", "-"):  # stdout a pipe
        result = run_cli("translate", "-m", str(model_dir), *FAST, "-i", "-", "-o", output, input=text)
        assert result.returncode == 0 and result.stdout == expected, (output, result.stderr.decode())
    assert not Path("-").exists()
    message = one_line_error(run_cli("translate", "-m", str(model_dir), *FAST, "-o", "/dev/fd/9", input=text))
    assert "no such open file descriptor" in message
    closed = subprocess.run(["bash", "-c", '"$@" <&-', "bash", *command], capture_output=True, timeout=600)
    assert "stdin is closed" in one_line_error(closed)


def test_translate_never_writes_over_its_side_files(tmp_path, model_dir):
    source, prefixes = tmp_path / "in.txt", tmp_path / "prefixes.txt"
    source.write_text("the cat\na dog\n")
    prefixes.write_text("\n\n")
    message = one_line_error(run_cli("translate", "-m", str(model_dir), *FAST, "-i", str(source),
                                     "--prefix-file", str(prefixes), "-o", str(prefixes)))
    assert "-o" in message and "is the --prefix-file" in message
    assert prefixes.read_text() == "\n\n" and source.read_text() == "the cat\na dog\n"


def test_translate_never_writes_into_its_stdin_its_input_or_its_model(tmp_path, model_dir, monkeypatch, capsys):
    """``< FILE -o FILE`` replaced its input; ``-i FILE >> FILE`` and ``< FILE >> FILE`` read their
    own translations back without end; ``-o MODEL/model.safetensors`` destroyed the model in use.
    Each is refused before the model loads, and no file changes. In this process, with real files
    as stdin and stdout, as a shell's redirections give them."""
    from conftest import options
    from nmtkit.errors import ConfigError
    from nmtkit.translate_files import translate_file
    from support.text_io import quiet_console

    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    source = tmp_path / "in.txt"
    source.write_text("the cat\na dog\n")
    weights = tmp_path / "weights"
    os.link(model / "model.safetensors", weights)  # another name of a model file
    before = tree(tmp_path)

    def refused(input, output, stdin=os.devnull, stdout=os.devnull) -> str:
        with open(stdin) as fake_stdin, open(stdout, "a") as fake_stdout, pytest.raises(ConfigError) as error:
            monkeypatch.setattr(sys, "stdin", fake_stdin)
            monkeypatch.setattr(sys, "stdout", fake_stdout)
            translate_file([str(model)], input, output, options(), quiet_console())
        monkeypatch.undo()
        return str(error.value)

    assert refused(None, str(source), stdin=source).startswith(f"-o {source} is the input file (stdin): ")
    assert refused("-", str(source), stdin=source).startswith(f"-o {source} is the input file (stdin): ")
    assert refused(str(source), None, stdout=source) == (
        "stdout is the input file: the translation would go into the text it is made from (`> FILE` empties it "
        "before translate starts, `>> FILE` appends to it and reads that back); send stdout elsewhere or give -o FILE")
    assert refused(None, "-", stdin=source, stdout=source).startswith("stdout is the input file (stdin): ")
    for output in (model / "model.safetensors", model / "new.txt"):
        assert refused(str(source), str(output)).startswith(f"-o {output} is inside the model directory {model}: ")
    assert refused(str(source), str(weights)) == (f"-o {weights} is {model / 'model.safetensors'}, a file of the "
                                                  f"model in use: the translation would destroy it; write it elsewhere")
    assert refused(str(source), None, stdout=model / "config.json").startswith(
        f"stdout is {model / 'config.json'}, a file of the model in use")
    assert tree(tmp_path) == before
    with open(source) as stdin:  # the command line's one error line
        monkeypatch.setattr(sys, "stdin", stdin)
        code, _, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(model), *FAST, "-o", str(source))
    assert "is the input file (stdin)" in one_line(code, err)
    assert tree(tmp_path) == before


def test_one_same_file_check_for_translate_and_verses(tmp_path):
    """translate's output-in-the-model check and verses' -o/--refs check had two copies of this
    with different rules (only one saw an output not made yet through ``..``): both use one."""
    import nmtkit.data.verses as verses
    import nmtkit.translate_files as translate_files
    from nmtkit.storage.outputs import same_file

    assert translate_files.same_file is verses.same_file is same_file
    assert not hasattr(translate_files, "_same_file") and not hasattr(verses, "_same_file")
    (tmp_path / "d").mkdir()
    (tmp_path / "a").write_text("x\n")
    os.link(tmp_path / "a", tmp_path / "hard")
    (tmp_path / "soft").symlink_to(tmp_path / "d")
    (tmp_path / "b").write_text("x\n")
    assert same_file(tmp_path / "new", tmp_path / "d" / ".." / "new")  # not made yet, one path resolved
    assert same_file(tmp_path / "soft" / "new", tmp_path / "d" / "new")  # through a link to a directory
    assert same_file(tmp_path / "a", tmp_path / "hard") and same_file(tmp_path / "soft", tmp_path / "d")
    assert not same_file(tmp_path / "a", tmp_path / "b")  # the same text is not the same file
    assert not same_file(tmp_path / "new", tmp_path / "other")


def test_a_file_without_write_permission_is_refused_even_to_root(tmp_path, monkeypatch, capsys):
    """os.access lets root write anything, so root's -o once replaced a file of mode 0444."""
    locked = tmp_path / "locked.txt"
    locked.write_text("keep\n")
    locked.chmod(0o444)
    code, _, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(tmp_path / "no-model"), "-o", str(locked))
    assert "is read-only: nmtkit will not replace it" in one_line(code, err)
    assert locked.read_text() == "keep\n" and sorted(p.name for p in tmp_path.iterdir()) == ["locked.txt"]


@pytest.mark.parametrize("args, fragment", [
    (("--topk", "5"), "--topk applies to --sample only"),
    (("--temperature", "2"), "--temperature applies to --sample only"),
    (("--seed", "3"), "--seed applies to --sample only"),
    (("--topp", "0.5"), "--topp applies to --sample only"),
    (("--sample", "--beam-size", "4"), "--beam-size does not apply with --sample"),
    (("--stream", "--chunk-lines", "10"), "--chunk-lines does not apply with --stream"),
    (("--alignment-units", "pieces"), "--alignment-units applies to --alignments only"),
    (("--stream", "-o", "OUT"), "--stream flushes each line"),
])
def test_translate_refuses_options_that_would_have_no_effect(tmp_path, model_dir, args, fragment):
    args = [str(tmp_path / "out.txt") if arg == "OUT" else arg for arg in args]
    message = one_line_error(run_cli("translate", "-m", str(model_dir), "--device", "cpu", *args, input="a cat\n"))
    assert fragment in message
    assert not (tmp_path / "out.txt").exists()

def fake_checkpoints(run: Path, model_dir: Path, steps: tuple[int, ...]) -> Path:
    """``fake_run`` whose checkpoints carry a trainer.json, as real ones do."""
    fake_run(run, model_dir, steps)
    for step in steps:
        (run / "checkpoints" / f"step_{step:08d}" / "trainer.json").write_text("{}\n")
    (run / "metrics.jsonl").write_text('{"type": "train", "step": 10, "loss": 3.0, "lr": 0.001}\n')
    return run


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_average_and_export_replace_only_directories_they_wrote(tmp_path, model_dir, monkeypatch, capsys):
    """In this process: what is checked is the files each command leaves, and its one-line error."""
    run = fake_checkpoints(tmp_path / "run", model_dir, (10, 20))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    plain = tmp_path / "plain.txt"
    plain.write_text("mine\n")
    before = tree(tmp_path)
    refusals = [("average", str(run), "-o", str(run)), ("average", str(run), "-o", str(mine)),
                ("average", str(run), "-o", str(plain)), ("average", str(run), "-o", ""),
                ("average", str(run), "-o", str(run / "checkpoints" / "step_00000010")),
                ("average", str(run), "-o", str(plain / "avg")),
                ("export", str(model_dir), "-o", str(mine)), ("export", str(model_dir), "-o", str(plain)),
                ("export", str(model_dir), "-o", str(model_dir)),
                ("plot", str(run), "-o", str(mine)), ("attention", "-m", str(model_dir), "the cat", "-o", str(mine))]
    for args in refusals:
        code, _, err = cli_in_process(monkeypatch, capsys, *args)
        assert "-o" in one_line(code, err), args
    for args in (refusals[0], refusals[6]):  # as real processes too: a stray warning would show there
        assert "-o" in one_line_error(run_cli(*args)), args
    assert tree(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["mine", "plain.txt", "run"]
    averaged = tmp_path / "averaged"
    for _ in range(2):  # a model directory that average wrote may be replaced
        code, _, err = cli_in_process(monkeypatch, capsys, "average", str(run), "-o", str(averaged))
        assert code == 0, err
    assert sorted(p.name for p in averaged.iterdir()) == ["checksums.json", "config.json", "model.safetensors", "spm.model"]
    # a `.averaged.old` of the user's own is where a replacement once parked the old copy: never removed
    theirs = tmp_path / ".averaged.old"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("keep me\n")
    code, _, err = cli_in_process(monkeypatch, capsys, "average", str(run), "-o", str(averaged))
    assert code == 0, err
    assert (theirs / "notes.txt").read_text() == "keep me\n" and sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".averaged.old", "averaged", "mine", "plain.txt", "run"]
    assert (averaged / "model.safetensors").is_file()


# --- temporary files of killed runs, invalid UTF-8 while streaming ----------------------------

# Starts ``python -m nmtkit ARGS`` with SIGINT and SIGTERM as an interactive shell leaves them. A
# suite started in the background (`nohup pytest &`: the shell ignores SIGINT for background jobs)
# passes SIGINT on ignored, and nmtkit rightly keeps it so, so the Ctrl-C case would hang. (Not
# a preexec_fn: the test process has threads, where one is unsafe.)
AS_A_SHELL_STARTS_IT = ("import os, signal, sys\n"
                        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})\n"
                        "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
                        "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
                        "os.execv(sys.executable, [sys.executable, '-m', 'nmtkit', *sys.argv[1:]])\n")


def signal_masks(pid: int | str = "self") -> str:
    """The blocked, ignored and caught signal masks of a process, for a failure message."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return " ".join(line.strip() for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    except OSError:  # it has just ended
        return "(gone)"


def finished(process: subprocess.Popen, seconds: float = 60) -> int:
    """The exit code of ``process``; on a timeout, its signal masks and the test's in the message."""
    try:
        return process.wait(seconds)
    except subprocess.TimeoutExpired:
        state = signal_masks(process.pid)
        process.kill()
        pytest.fail(f"still running after {seconds} s: child {state}; test process {signal_masks()}")


def start_translation(model_dir: Path, output: Path) -> subprocess.Popen:
    """A translation to ``output`` that waits on its stdin, once its temporary file exists."""
    process = subprocess.Popen([sys.executable, "-c", AS_A_SHELL_STARTS_IT, "translate", "-m", str(model_dir),
                                *FAST, "-o", str(output)], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 300
    while not list(output.parent.glob(f".{output.name}.nmtkit-*.tmp")):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read().decode()
        time.sleep(0.01)
    return process


def test_temp_files_of_killed_translations_are_removed(tmp_path, model_dir):
    out = tmp_path / "out.txt"
    terminated = start_translation(model_dir, out)
    terminated.send_signal(signal.SIGTERM)
    assert finished(terminated) == 143 and b"terminated" in terminated.stderr.read()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # SIGTERM: cleaned on the way out

    interrupted = start_translation(model_dir, out)
    interrupted.send_signal(signal.SIGINT)  # Ctrl-C: exit 130, one line saying so, temp removed
    assert finished(interrupted) == 130 and interrupted.stderr.read().decode().endswith("nmtkit: interrupted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == []

    killed = start_translation(model_dir, out)
    killed.kill()
    killed.wait(60)
    killed.stderr.close()
    [left] = tmp_path.glob(".out.txt.nmtkit-*.tmp")
    alive = tmp_path / left.name.replace(f"-{killed.pid}-", f"-{os.getpid()}-")  # a running process's
    alive.write_text("")
    unrelated = tmp_path / ".out.txt.mine.tmp"
    unrelated.write_text("")
    result = run_cli("translate", "-m", str(model_dir), *FAST, "-o", str(out), input="the cat\n")
    assert result.returncode == 0, result.stderr.decode()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, unrelated.name, "out.txt"])


def test_invalid_utf8_while_streaming_says_what_was_written(tmp_path, model_dir, monkeypatch, capsys):
    good = ["the cat sat", "", "a dog", "the red house", "on the mat"]
    data = "".join(line + "\n" for line in good).encode("utf-8") + b"the \xff dog\nthe cat\n"
    expected = translated(monkeypatch, capsys, "-m", str(model_dir), *FAST, input="".join(line + "\n" for line in good))
    assert expected.count(b"\n") == 5
    result = run_cli("translate", "-m", str(model_dir), *FAST, input=data)
    message = one_line_error(result)
    assert "<stdin>: line 6 is not valid UTF-8" in message
    assert "the 5 line(s) before it were translated and written to stdout" in message
    assert result.stdout == expected  # exactly the lines before the bad one
    out = tmp_path / "out.txt"
    message = one_line_error(run_cli("-q", "translate", "-m", str(model_dir), *FAST, "-o", str(out), input=data))
    assert f"line 6 is not valid UTF-8 (byte 4); nothing was written to {out}" in message
    assert list(tmp_path.iterdir()) == []


def test_invalid_utf8_after_whole_chunks_says_what_was_written(model_dir, monkeypatch, capsys):
    """A bad line 12,001 after chunks of 10,000, at a small scale: chunks of 2,
    the bad line after two whole chunks and a part, and right after a whole chunk."""
    import io

    from nmtkit.cli import main

    good = ["the cat sat", "", "a dog", "the red house", "on the mat"]
    for before in (5, 4):
        expected = translated(monkeypatch, capsys, "-m", str(model_dir), *FAST,
                              input="".join(line + "\n" for line in good[:before])).decode("utf-8")
        data = "".join(line + "\n" for line in good[:before]).encode("utf-8") + b"the \xff dog\nthe cat\n"
        monkeypatch.setattr(sys, "argv", ["nmtkit", "translate", "-m", str(model_dir), *FAST, "--chunk-lines", "2"])
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        with pytest.raises(SystemExit) as stopped:
            main()
        captured = capsys.readouterr()
        assert stopped.value.code == 2 and captured.err.count("\n") == 1, captured.err
        assert f"<stdin>: line {before + 1} is not valid UTF-8 (byte 4); the {before} line(s) before it were " \
               f"translated and written to stdout" in captured.err
        assert captured.out == expected and len(expected.splitlines()) == before


# --- exit codes ----------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("translate", "-m", "{missing}"), ("average", "{missing}"), ("score", "-r", "{missing}", "-i", "{missing}"),
    ("export", "{missing}", "-o", "{tmp}/out"), ("attention", "-m", "{missing}", "the cat", "-o", "{tmp}/a.png"),
    ("plot", "{missing}", "-o", "{tmp}/c.png"), ("info", "{missing}"), ("serve", "-m", "{missing}", "--port", "0"),
    ("sweep", "{missing}"), ("prepare", "{missing}"), ("train", "{missing}"), ("run", "{missing}"),
])
def test_a_missing_input_exits_2(tmp_path, args):
    args = [a.format(missing=tmp_path / "missing", tmp=tmp_path) for a in args]
    message = one_line_error(run_cli(*args, input=b"the cat\n"), code=2)
    assert str(tmp_path / "missing") in message


def test_a_failed_write_exits_1(tmp_path, model_dir):
    full = tmp_path / "full"
    full.symlink_to("/dev/full")  # a device whose writes fail with ENOSPC
    message = one_line_error(run_cli("-q", "translate", "-m", str(model_dir), *FAST, "-o", str(full),
                                     input="the cat\n"), code=1)
    assert "No space left on device" in message


# --- an exported model is translated by CTranslate2 without --engine ---------------------------

def test_translate_detects_an_export_directory(tmp_path, model_dir):
    pytest.importorskip("ctranslate2")
    from nmtkit.ctranslate2.export import export_ctranslate2

    exported = export_ctranslate2(model_dir, tmp_path / "model.ct2")
    text = "the cat sat\n\na red dog\n"
    auto = run_cli("translate", "-m", str(exported), *FAST, input=text)
    explicit = run_cli("translate", "-m", str(exported), *FAST, "--engine", "ctranslate2", input=text)
    assert auto.returncode == 0, auto.stderr.decode()
    assert auto.stdout == explicit.stdout and len(auto.stdout.splitlines()) == 3
    message = one_line_error(run_cli("translate", "-m", str(exported), "--engine", "torch", input=text))
    assert "is a CTranslate2 export" in message and "leave out --engine" in message
    message = one_line_error(run_cli("translate", "-m", str(exported), "-m", str(model_dir), input=text))
    assert "cannot ensemble the CTranslate2 export" in message


def test_an_input_that_changes_while_it_is_translated_writes_nothing(tmp_path, model_dir, monkeypatch, capsys):
    """A file that grew during `translate -i FILE -o FILE` once gave an output missing its new
    lines (one output line per input line broken) with exit 0."""
    from support.cli import cli

    import nmtkit.translate_files as translate_files

    source, out = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("the cat sat\na red dog\n")
    translate_chunk = translate_files.translate_chunk

    def while_a_writer_appends(*args, **kwargs):
        with open(source, "a") as handle:
            handle.write("one more line\n")
        return translate_chunk(*args, **kwargs)

    monkeypatch.setattr(translate_files, "translate_chunk", while_a_writer_appends)
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(model_dir), *FAST, "-i", str(source), "-o", str(out))
    assert code == 2 and f"{source} changed while it was translated: nothing was written to {out}" in err
    assert not out.exists()
    monkeypatch.setattr(translate_files, "translate_chunk", translate_chunk)
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(model_dir), *FAST, "-i", str(source), "-o", str(out))
    assert code == 0 and out.read_text().count("\n") == 3  # the same command, once the file is complete


def test_an_input_that_changes_while_it_is_streamed_is_an_error(tmp_path, model_dir, monkeypatch, capsys):
    """To stdout, a file that grew while it was translated gave the translations of its old lines,
    exit 0. Now no chunk read after the change is written, and the one error line says what was."""
    import nmtkit.translate_files as translate_files

    lines = ["the cat sat", "a red dog", "the mat"]
    first = translated(monkeypatch, capsys, "-m", str(model_dir), *FAST, input=lines[0] + "\n").decode("utf-8")
    translate_chunk = translate_files.translate_chunk
    for changed_at, written in ((2, "the 1 line(s) translated before it changed were written to stdout"),
                                (1, "nothing was written to stdout")):
        source = tmp_path / f"in{changed_at}.txt"
        source.write_text("".join(line + "\n" for line in lines))
        calls = []

        def while_a_writer_appends(*args, **kwargs):
            calls.append(args)
            if len(calls) == changed_at:
                with open(source, "a") as handle:
                    handle.write("one more line\n")
            return translate_chunk(*args, **kwargs)

        monkeypatch.setattr(translate_files, "translate_chunk", while_a_writer_appends)
        code, out, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(model_dir), *FAST,
                                        "--chunk-lines", "1", "-i", str(source))
        assert one_line(code, err) == (f"nmtkit: error: {source} changed while it was translated: {written}; run "
                                       f"the command again once the file is complete\n")
        assert out == (first if changed_at == 2 else "")
