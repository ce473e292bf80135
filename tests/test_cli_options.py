"""Every option and argument of every command, given any value, either works or is refused in
one line (exit 2 for a bad value, 1 for a runtime failure), never a traceback.

The options are read from the command line app itself, so a new option is fuzzed as soon as
it exists. Each command starts from an invocation that succeeds quickly on a tiny model; one
option (or argument) at a time gets a value drawn by hypothesis. Commands run in this process
(as ``nmtkit.cli.main``), in a scratch directory, so relative paths land there.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import typer.main
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import reversal_pairs, tiny_recipe, write_prepared
from support.marian_models import make_marian
from nmtkit.cli import app

MODEL = dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1)
NOT_FUZZED = {"--help", "--debug"}  # --debug shows tracebacks by design


def commands() -> dict:
    return typer.main.get_command(app).commands


def is_option(param) -> bool:
    return param.param_type_name == "option"  # Typer's parameters are not click's classes (it vendors click)


def names(param) -> str:
    """How a parameter is given on the command line: its longest flag, or its argument name."""
    return max(param.opts, key=len) if is_option(param) else param.name


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    """A trained run (2 checkpoints, best/, metrics), references and hypotheses, a recipe whose
    data files are missing (prepare and run stop at once), a sweep file and an export."""
    from nmtkit.config import from_dict
    from nmtkit.ctranslate2.export import export_ctranslate2
    from nmtkit.runtime.console import get_console
    from nmtkit.training.trainer import train

    root = tmp_path_factory.mktemp("cli-options")
    write_prepared(root / "work", reversal_pairs(60, 0, length=4), reversal_pairs(4, 1, length=4))
    recipe = tiny_recipe(root / "work", model=MODEL, train=dict(max_steps=4, save_every=2, validate_every=2,
                                                                max_tokens=100, keep_last=5))
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    run = train(from_dict(recipe), get_console(-1))
    missing = tiny_recipe(root / "missing-work", model=MODEL, data={"files": {
        split: {"src": str(root / "nowhere.src"), "tgt": str(root / "nowhere.tgt")} for split in ("train", "dev", "test")}})
    (root / "missing.yaml").write_text(yaml.safe_dump(missing))
    (root / "sweep.yaml").write_text(yaml.safe_dump({"recipe": "recipe.yaml", "workdir": str(root / "sweep"),
                                                     "variants": [{"name": "a"}, {"name": "b", "overrides": {
                                                         "model.d_model": 32}}]}))
    lines = "".join(src + "\n" for src, _ in reversal_pairs(4, 2, length=4))
    for name in ("ref.txt", "hyp.txt"):
        (root / name).write_text(lines)
    (root / "input.txt").write_text("a b c\n")
    (root / "base.txt").write_text(lines.replace("a", "b"))
    export = export_ctranslate2(run / "best", root / "model.ct2")
    marian = make_marian(root / "marian", layers=1)  # what `import` reads; a Hub id is never fetched here
    hub_offline = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield {"root": root, "run": run, "model": run / "best", "export": export, "marian": marian}
    if hub_offline is None:
        del os.environ["HF_HUB_OFFLINE"]
    else:
        os.environ["HF_HUB_OFFLINE"] = hub_offline


def base_invocation(command: str, s: dict) -> tuple[dict[str, list[str]], list[str]]:
    """(options, arguments) of a quick invocation of ``command`` that succeeds (or, for
    prepare and run, stops at once on the recipe's missing data)."""
    root, model = s["root"], str(s["model"])
    return {
        "prepare": ({}, [str(root / "missing.yaml")]),
        "run": ({}, [str(root / "missing.yaml")]),
        "train": ({"--dry-run": []}, [str(root / "recipe.yaml")]),
        "translate": ({"--model": [model], "--input": [str(root / "input.txt")], "--max-len-b": ["3"]}, []),
        "serve": ({"--model": [model], "--port": ["0"]}, []),
        "score": ({"--ref": [str(root / "ref.txt")], "--input": [str(root / "hyp.txt")],
                   "--baseline": [str(root / "base.txt")], "--resamples": ["20"]}, []),
        "sweep": ({"--dry-run": []}, [str(root / "sweep.yaml")]),
        "average": ({"--output": ["averaged"], "--last": ["2"]}, [str(s["run"])]),
        "plot": ({"--size": ["400x300"]}, [str(s["run"])]),
        "attention": ({"--model": [model], "--format": ["json"], "--beam-size": ["1"]}, ["a b c"]),
        "info": ({}, [model]),
        "export": ({"--output": ["exported"]}, [model]),
        "import": ({"--output": ["imported"]}, [str(s["marian"])]),
        "verses": ({"--output": ["verses.txt"], "--testament": ["new"]}, ["engWEB2015eb"]),  # the quickstart's module
    }[command]


SAFE_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/~\\"), max_size=12)
VALUES = st.one_of(
    st.integers(min_value=-3, max_value=70).map(str),  # valid values stay cheap to run
    st.sampled_from([str(2**63), str(10**11), str(-10**11), str(2**70)]),
    st.floats().map(str),
    st.sampled_from(["", "-", ".", "..", "nan", "inf", "-inf", "1e400", "0", "1", "2", "0.5", "-1", "1_0", "0x10",
                     "true", "auto", "cpu", "cuda", "cuda:1", "xla", "json", "png", "x.svg", "x.png", "x.txt",
                     "a/b.png", "200x150", "0x0", "99999x99999", "step", "time", "bleu,chrf", "ter", "ar",
                     "bootstrap", "int8", "float16", "ctranslate2", "torch", "replace", "strict", "fp16",
                     "/dev/null", "train.lr=0.5", "model.d_model=8", "name=x", "=", "a=b"]),
    SAFE_TEXT)
HOSTS = st.sampled_from(["127.0.0.1", "::1", "0.0.0.0", "", "localhost", "300.1.1.1", "1.2.3.4", "x y"])


def values_for(param) -> st.SearchStrategy:
    """Any text; an address for --host (a random name would wait on DNS); a device whose
    writes fail for an output (a read from it never ends, so not for an input)."""
    if names(param) == "--host":
        return HOSTS
    return VALUES | st.just("/dev/full") if names(param) == "--output" else VALUES


def fuzzable(command: str) -> list:
    return [p for p in commands()[command].params if not set(p.opts) & NOT_FUZZED]


def invocation(command: str, s: dict, param=None, value: str | None = None) -> list[str]:
    """The base invocation with ``param`` set to ``value`` (a flag: given; a repeatable
    option or the overrides: one more value; anything else: replaced)."""
    options, arguments = base_invocation(command, s)
    options = {name: list(values) for name, values in options.items()}
    arguments = list(arguments)
    if param is None:
        pass
    elif is_option(param):
        flag = names(param)
        if param.is_flag:
            options[flag] = []
        elif param.multiple:
            options[flag] = options.get(flag, []) + [value]
        else:
            options[flag] = [value]
    else:
        index = [p.name for p in commands()[command].params if not is_option(p)].index(param.name)
        if param.nargs == -1:
            arguments.append(value)
        else:
            arguments[index] = value
    argv = [part for flag, values in options.items() for part in ([flag] if not values else
                                                                  [x for v in values for x in (flag, v)])]
    return [command, *argv, "--", *arguments] if arguments else [command, *argv]


def check_outcome(code: int, err: str) -> None:
    """Success, Typer's own usage error for a value of the wrong type, or one nmtkit error line."""
    assert "Traceback" not in err, err
    if code == 0:
        return
    if "Usage:" in err:
        assert code == 2, err
        return
    errors = [line for line in err.split("\n") if line.startswith("nmtkit: error: ")]
    assert code in (1, 2) and len(errors) == 1 and err.rstrip("\n").endswith(errors[0]), err
    assert errors[0].isprintable(), err  # no control character from a name breaks the line


def run_command(monkeypatch, capsys, argv: list[str]) -> tuple[int, str]:
    """``nmtkit -q ARGV`` in this process, with a line on stdin: (exit code, stderr)."""
    import io

    from nmtkit.cli import main

    monkeypatch.setattr(sys, "argv", ["nmtkit", "-q", *argv])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b c\n")))
    with pytest.raises(SystemExit) as stopped:
        main()
    return stopped.value.code or 0, capsys.readouterr().err


@pytest.fixture()
def scratch(tmp_path, monkeypatch):
    """A working directory for relative outputs; the server returns once it listens, and
    --compile finds no C++ compiler (it would compile for tens of seconds)."""
    import nmtkit.runtime.compiler
    import nmtkit.serving.app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(nmtkit.serving.app, "run_until_stopped", lambda server, sock: None)
    monkeypatch.setattr(nmtkit.runtime.compiler, "missing_compiler", lambda device: "no compiler in this test")
    return tmp_path


COMMANDS = sorted(commands())


ANSWERS_ON_STDERR = ("train", "sweep")  # --dry-run's table is the answer, printed even with -q


def test_every_command_has_a_base_invocation_that_works_quietly(setup, scratch, monkeypatch, capsys):
    """The starting points work, and with -q a successful command prints nothing on stderr."""
    for command in COMMANDS:
        code, err = run_command(monkeypatch, capsys, invocation(command, setup))
        if command in ("prepare", "run"):
            assert code == 2 and "file not found" in err, err
        else:
            assert code == 0 and (err == "" or command in ANSWERS_ON_STDERR), (command, err)
        for leftover in scratch.iterdir():  # the next command starts from an empty directory
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()



# runs per option: 1 keeps the suite fast; NMTKIT_FUZZ=20 (say) for a thorough local run
RUNS_PER_OPTION = int(os.environ.get("NMTKIT_FUZZ", "1"))


@pytest.mark.parametrize("command", COMMANDS)
def test_any_value_of_any_option_works_or_is_one_line(setup, scratch, monkeypatch, capsys, command):
    params = fuzzable(command)
    assert params, command

    @settings(max_examples=RUNS_PER_OPTION, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=st.data())
    def check(data):
        for param in params:  # every option and argument gets a value in every example
            value = None if is_option(param) and param.is_flag else data.draw(values_for(param), label=names(param))
            code, err = run_command(monkeypatch, capsys, invocation(command, setup, param, value))
            check_outcome(code, err)
            assert Path("/dev/null").is_char_device()  # -o /dev/null writes to the device, never replaces it

    check()


@settings(max_examples=15 * RUNS_PER_OPTION, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_any_recipe_value_builds_the_model_or_is_one_line(setup, scratch, monkeypatch, capsys, data):
    """Beyond loading (test_config_rules): a value that loads also builds its model, in ``train
    --dry-run`` (on the meta device, so a size this machine cannot hold still gets its table)."""
    from support.recipe_space import VALUES as RECIPE_VALUES
    from support.recipe_space import config_keys

    key = data.draw(st.sampled_from(config_keys()), label="key")
    value = data.draw(RECIPE_VALUES.map(lambda v: json.dumps(v) if not isinstance(v, str) else v), label="value")
    code, err = run_command(monkeypatch, capsys, ["train", "--dry-run", str(setup["root"] / "recipe.yaml"),
                                                  f"{key}={value}"])
    check_outcome(code, err)


def test_control_characters_in_a_name_stay_inside_the_one_error_line(setup, scratch, monkeypatch, capsys):
    """Found by NMTKIT_FUZZ=30: a path holding a newline, a carriage return or a C1 control was
    printed as it was, so the "one line" error spanned several."""
    for argv in (["translate", "-m", "bad\nname\r\x8b"], ["score", "-r", "\r", "-i", "x\n"], ["info", "a\u2028b"]):
        code, err = run_command(monkeypatch, capsys, argv)
        check_outcome(code, err)
        assert code == 2 and err.count("\n") == 1 and "\r" not in err and "\u2028" not in err, err
    assert "bad\\nname\\r\\x8b" in run_command(monkeypatch, capsys, ["translate", "-m", "bad\nname\r\x8b"])[1]


@pytest.mark.parametrize("command", COMMANDS)
def test_an_option_of_one_value_given_twice_is_one_line(setup, scratch, monkeypatch, capsys, command):
    """The parser keeps an option's last value and drops the others: `translate -i a.txt -i b.txt`
    translated b.txt alone, exit 0. Every option that is not repeatable, given twice (a flag too),
    is one line naming it; a repeatable one still repeats (-m: an ensemble)."""
    base = invocation(command, setup)
    for param in fuzzable(command):
        if not is_option(param) or param.multiple:
            continue
        once = [names(param)] if param.is_flag else [names(param), "1"]  # "1": any type's value
        code, err = run_command(monkeypatch, capsys, [command, *once, *once, *base[1:]])
        check_outcome(code, err)
        assert code == 2 and f"nmtkit: error: {'/'.join(param.opts)} given " in err, (names(param), err)
    if command == "translate":
        ensemble = invocation(command, setup, next(p for p in fuzzable(command) if names(p) == "--model"),
                              str(setup["model"]))
        assert run_command(monkeypatch, capsys, ensemble) == (0, "")


class _OtherParser:
    """A parser of another click: parse_args gone, or giving no order of parameters."""

    def __init__(self, result):
        self.result = result

    def parse_args(self, args):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


@pytest.mark.parametrize("parser", [object(), _OtherParser(({}, [])), _OtherParser(({}, [], ["--beam-size"] * 2)),
                                    _OtherParser(TypeError("parse_args() got an unexpected keyword argument")),
                                    _OtherParser(({}, [], None))])
def test_the_repeat_check_is_skipped_where_clicks_parser_differs(setup, scratch, monkeypatch, capsys, parser):
    """The check parses the arguments again with click's internal parser (``make_parser(ctx)
    .parse_args``), which another click may not have or may answer otherwise: then the command
    runs as click parsed it (the last of a repeated value), never a traceback."""
    from nmtkit.cli import _Command

    real, calls = _Command.make_parser, []

    def make_parser(self, ctx):  # click's own parse first, the check's second
        calls.append(ctx)
        return real(self, ctx) if len(calls) == 1 else parser

    monkeypatch.setattr(_Command, "make_parser", make_parser)
    base = invocation("translate", setup)
    assert run_command(monkeypatch, capsys, [*base, "--beam-size", "2", "--beam-size", "1"]) == (0, "")
    assert len(calls) == 2

