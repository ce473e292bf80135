"""The documentation is checked like code: every relative link and image in README.md,
ARCHITECTURE.md and docs/*.md resolves (the file, and the heading an #anchor names), and
every ``nmtkit ...`` command line they show, in code blocks and inline code, parses with that
subcommand's own options, in-process through the Click objects behind the Typer app. A recipe
command's dotted overrides load with the recipe they name, and a sweep's ``--only`` names one
of its variants, so a renamed option, key or variant breaks this test, not a reader's paste."""
from __future__ import annotations

import re
import shlex
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.main

from nmtkit.cli import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}  # fenced blocks whose lines are commands
OPERATORS = {"|", "||", "&&", ";", "&", "<", ">", ">>", "(", ")", "<<", ";;"}
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)


@dataclass
class Markdown:
    """One page split into prose (code blocks blanked, line numbers kept) and fenced blocks."""
    path: Path
    prose: str
    blocks: list  # (language, first line number, text)


def read_markdown(path: Path) -> Markdown:
    prose, blocks, fence, lang, start, body = [], [], None, "", 0, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence, lang, start, body = match.group(1), match.group(2).lower(), number + 1, []
            prose.append("")
        elif fence is not None and line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
            blocks.append((lang, start, "\n".join(body)))
            fence = None
            prose.append("")
        elif fence is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    assert fence is None, f"{path.name}: a code block opened at line {start - 1} is never closed"
    return Markdown(path, "\n".join(prose), blocks)


PAGES = {path: read_markdown(path) for path in DOCS}


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


# ---------------------------------------------------------------- links and anchors

def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, markup and punctuation dropped, lower
    case, spaces to hyphens (letters, digits, ``_`` and ``-`` stay)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = "".join(ch for ch in text.strip().lower()
                   if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every #anchor a page's headings give; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    prose = PAGES[path].prose if path in PAGES else read_markdown(path).prose
    for match in re.finditer(r"^ {0,3}#{1,6}\s+(.+?)\s*#*\s*$", prose, re.MULTILINE):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def links(page: Markdown) -> list[tuple[int, str]]:
    """(line, target) of every link and image in a page's prose, inline code left out."""
    prose = INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), page.prose)
    return [(line_of(prose, m.start()), m.group(1)) for m in LINK.finditer(prose)]


def link_problem(page: Path, target: str) -> str | None:
    """Why a relative link does not resolve, or None (web links are not followed)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):
        return None
    file_part, _, anchor = target.partition("#")
    resolved = (page.parent / file_part).resolve() if file_part else page
    if not resolved.exists():
        return f"{file_part} does not exist"
    if ROOT not in resolved.parents and resolved != ROOT:
        return f"{file_part} is outside the repository"
    if anchor:
        if resolved.suffix != ".md":
            return f"#{anchor} on a file that is not Markdown"
        if anchor not in anchors(resolved):
            return f"{resolved.relative_to(ROOT)} has no heading #{anchor}"
    return None


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(path):
    problems = [f"{path.name}:{line}: ({target}) {why}" for line, target in links(PAGES[path])
                if (why := link_problem(path, target))]
    assert not problems, "\n".join(problems)


def test_the_docs_index_reaches_every_page():
    """A page nobody links to is a page nobody finds: README links every docs/*.md."""
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in links(PAGES[ROOT / "README.md"])}
    missing = [p.name for p in DOCS if p.parent == ROOT / "docs" and p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


def test_readme_is_a_front_door_with_a_line_per_command():
    """README stays short (the topics live in docs/) and lists every command once in its table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    listed = re.findall(r"^\| `nmtkit (\w+)", text, re.MULTILINE)
    assert sorted(listed) == sorted(GROUP.commands)


def test_slug_follows_githubs_rules():
    assert slug("Threads: `train.threads`") == "threads-trainthreads"
    assert slug("torch.compile on CPU (compile_speed.py, 2026-11)") == "torchcompile-on-cpu-compile_speedpy-2026-11"
    assert slug("The Transformer against the LSTM, per minute") == "the-transformer-against-the-lstm-per-minute"
    assert slug("See [the guide](x.md) — now") == "see-the-guide--now"


def test_link_checker_finds_broken_links(tmp_path, monkeypatch):
    """The checker itself: a missing file, a missing heading and a good anchor."""
    page = ROOT / "docs" / "install.md"
    assert link_problem(page, "no-such-page.md") == "no-such-page.md does not exist"
    assert "has no heading #nowhere" in link_problem(page, "training.md#nowhere")
    assert link_problem(page, "training.md#resume") is None
    assert link_problem(page, "https://example.org/x.md#y") is None


def test_every_guarantee_names_the_test_file_that_holds_it():
    """docs/guarantees.md is a list a reader can check: one promise a bullet, each ending in a
    link to the test file that holds it (the link test above checks that the file exists)."""
    page = PAGES[ROOT / "docs" / "guarantees.md"]
    bullets = [line for line in page.prose.splitlines() if line.startswith("- ")]
    assert len(bullets) >= 40
    unchecked = [line for line in bullets
                 if not re.search(r"\[test_\w+\.py\]\(\.\./tests/test_\w+\.py\)$", line.rstrip())]
    assert not unchecked, "promises without their test file:\n" + "\n".join(unchecked)


def test_the_architecture_table_names_the_function_each_command_calls():
    """ARCHITECTURE.md's "command -> core function -> module" table stays true: one row per
    command, and that command in cli.py imports the named function from the named module,
    which defines it."""
    import inspect

    row = re.compile(r"^\| `nmtkit (\w+)[^`]*` \| `(\w+)`[^|]* \| \[`([\w/]+)\.py`\]", re.MULTILINE)
    rows = row.findall(PAGES[ROOT / "ARCHITECTURE.md"].prose)
    assert sorted(name for name, _, _ in rows) == sorted(GROUP.commands)
    for name, function, module in rows:
        source = inspect.getsource(GROUP.commands[name].callback)  # `import` is cli.import_model
        dotted = module.replace("/", ".")
        imported = rf"from {re.escape(dotted)} import [^\n]*\b{function}\b"
        assert re.search(imported, source), f"nmtkit {name} calls no {dotted}.{function}"
        assert re.search(rf"^def {function}\(", (ROOT / f"{module}.py").read_text(encoding="utf-8"), re.MULTILINE)


# ---------------------------------------------------------------- command lines

@dataclass
class Shown:
    """One ``nmtkit`` invocation shown in the docs: where, and its arguments (None: the line
    itself is not valid shell, ``error`` says why)."""
    where: str
    args: list | None
    error: str = ""
    inline: bool = False


def tokens_of(line: str) -> list[str]:
    """Shell words and operators of one command line, comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def invocations(line: str, where: str, inline: bool = False) -> list[Shown]:
    """Each ``nmtkit`` (or ``python -m nmtkit``) in a command line, up to the next shell operator."""
    try:
        tokens = tokens_of(line)
    except ValueError as err:  # an unclosed quote: a reader's paste would fail too
        return [Shown(where, None, f"{err}: {line}")]
    found = []
    for i, token in enumerate(tokens):
        if token == "nmtkit":
            args = []
            for word in tokens[i + 1:]:
                if word in OPERATORS:
                    break
                args.append(word)
            found.append(Shown(where, args, inline=inline))
    return found


def shown_commands(page: Markdown) -> list[Shown]:
    name = page.path.relative_to(ROOT)
    shown = []
    for lang, start, text in page.blocks:
        if lang not in SHELL_BLOCKS:
            continue
        lines = text.split("\n")
        number = 0
        while number < len(lines):
            first, line = number, lines[number]
            while line.endswith("\\") and number + 1 < len(lines):  # a continued command line
                number += 1
                line = line[:-1] + " " + lines[number]
            shown += invocations(line, f"{name}:{start + first}")
            number += 1
    for match in INLINE_CODE.finditer(page.prose):
        code = " ".join(match.group(2).split())  # inline code may wrap across lines
        if re.search(r"(^|[\s|;&(])nmtkit(\s|$)", code):
            shown += invocations(code, f"{name}:{line_of(page.prose, match.start())}", inline=True)
    return shown


ALL_SHOWN = [shown for page in PAGES.values() for shown in shown_commands(page)]
GROUP = typer.main.get_command(app)


def is_placeholder(value: str) -> bool:
    """MODEL, N, RUN_DIR, W/train, $VAR, ...: a value the reader fills in, not checked for type."""
    head = re.split(r"[/.=]", value, maxsplit=1)[0]
    return value == "..." or value.startswith("$") or bool(re.fullmatch(r"[A-Z][A-Z0-9_]*", head))


def parse_shown(args: list[str], mention: bool = False):
    """Parse one invocation as the CLI would: (command, its parsed values), or raise AssertionError
    naming what is wrong. Values that are placeholders are not type-checked; ``...`` stands for
    an elided part. ``mention``: inline code in prose, whose last option may name the option
    without its value."""
    ctx = GROUP.context_class(GROUP, info_name="nmtkit")
    group_opts, rest, _ = GROUP.make_parser(ctx).parse_args(args=list(args))  # global options first
    if not rest or group_opts.get("help") or group_opts.get("version"):
        return None, group_opts
    name, rest = rest[0], rest[1:]
    assert name in GROUP.commands, f"no command {name!r} (commands: {', '.join(sorted(GROUP.commands))})"
    command = GROUP.commands[name]
    sub_ctx = command.context_class(command, info_name=name, parent=ctx)
    if mention and rest and rest[-1].startswith("-"):  # prose naming an option: `nmtkit score --baseline`
        rest = rest + ["..."]
    try:
        values, extra, _ = command.make_parser(sub_ctx).parse_args(args=rest)
    except Exception as err:  # click's UsageError family: an unknown option, a missing value
        raise AssertionError(f"nmtkit {name}: {err}") from None
    extra = [word for word in extra if word != "..."]  # an elided part, not an argument
    assert not extra, f"nmtkit {name}: unexpected argument(s) {extra}"
    for param in command.params:
        given = values.get(param.name)
        if isinstance(given, (list, tuple)):
            given = [value for value in given if not is_placeholder(value)] or None
        elif isinstance(given, str) and is_placeholder(given):
            given = None
        if given is not None and not isinstance(given, bool):
            try:
                convert_value(param, given, sub_ctx)
            except Exception as err:  # click's BadParameter: not a number, out of range, not a choice
                raise AssertionError(f"nmtkit {name}: {'/'.join(param.opts)}: {err}") from None
    return name, values


def convert_value(param, value, ctx):
    """A parsed value converted as the CLI converts it (Typer's own types where Typer has them,
    click's ``ParamType`` otherwise)."""
    if hasattr(param, "get_runtime_param"):
        return param.get_runtime_param().coerce(value, param=param, ctx=ctx)
    return param.type_cast_value(ctx, value)


def check_recipe_values(name: str, values: dict) -> None:
    """A recipe command's overrides load with its recipe; a sweep's --only names a variant."""
    from nmtkit.config import load_config
    from nmtkit.sweep.spec import load_sweep

    if name in ("run", "train", "prepare"):
        recipe, overrides = values.get("recipe"), list(values.get("overrides") or [])
        if recipe and (ROOT / recipe).is_file() and not any(is_placeholder(o.partition("=")[0].split(".")[-1])
                                                            or is_placeholder(o.partition("=")[2]) for o in overrides):
            load_config(ROOT / recipe, overrides)
    if name == "sweep" and (ROOT / (values.get("sweep_file") or "")).is_file():
        # a run's name, or a replicated variant's, which selects all its (seed, split) runs
        variants = {name for v in load_sweep(ROOT / values["sweep_file"]).variants for name in (v.name, v.group_name)}
        unknown = [o for o in values.get("only") or [] if not is_placeholder(o) and o not in variants]
        assert not unknown, f"{values['sweep_file']} has no variant {unknown}"


def test_the_docs_show_commands():
    """The extraction finds the commands (a page of prose only would pass the next test vacuously)."""
    where = {shown.where.split(":")[0] for shown in ALL_SHOWN}
    assert len(ALL_SHOWN) > 100
    assert {"README.md", "docs/translating.md", "docs/training.md"} <= where
    names = {shown.args[0] for shown in ALL_SHOWN if shown.args and not shown.args[0].startswith("-")}
    assert set(GROUP.commands) <= names, f"commands no page shows: {set(GROUP.commands) - names}"


def test_every_command_line_shown_parses():
    problems = []
    for shown in ALL_SHOWN:
        if shown.args is None:
            problems.append(f"{shown.where}: {shown.error}")
            continue
        try:
            name, values = parse_shown(shown.args, mention=shown.inline)
            if name:
                check_recipe_values(name, values)
        except Exception as err:  # an AssertionError of ours or the recipe's ConfigError: both are findings
            problems.append(f"{shown.where}: nmtkit {' '.join(shown.args)}\n    {err}")
    assert not problems, f"{len(problems)} command line(s) do not parse:\n" + "\n".join(problems)


@pytest.mark.parametrize("args, why", [
    (["translate", "-m", "M", "--beam", "4"], "No such option"),
    (["translate", "-m", "M", "--beam-size", "four"], "valid integer"),
    (["translate", "-m"], "requires an argument"),
    (["score", "-r", "ref", "hyp"], "unexpected argument"),
    (["tranlsate", "-m", "M"], "no command 'tranlsate'"),
    (["average", "run", "--last", "0"], "greater than or equal to 1"),
    (["translate", "-m", "M", "--errors"], "requires an argument"),
])
def test_a_wrong_command_line_is_caught(args, why):
    with pytest.raises(AssertionError, match=why):
        parse_shown(args)


def test_recipe_overrides_and_sweep_variants_are_checked():
    from nmtkit.errors import ConfigError

    name, values = parse_shown(["train", "recipes/quickstart.yaml", "train.max_step=10"])
    with pytest.raises(ConfigError, match="max_step"):
        check_recipe_values(name, values)
    name, values = parse_shown(["sweep", "recipes/sweeps/quickstart-transformer.yaml", "--only", "no-such"])
    with pytest.raises(AssertionError, match="no variant"):
        check_recipe_values(name, values)
    name, values = parse_shown(["train", "recipes/quickstart.yaml", "model.KEY=VALUE", "--dry-run"])
    check_recipe_values(name, values)  # a placeholder is not a key


def test_continuations_comments_and_pipes_are_understood():
    page = Markdown(ROOT / "x.md", "use `echo hi | nmtkit translate -m M\n--nbest 2 > out` here",
                    [("bash", 1, "nmtkit run r.yaml a=1 \\\n    b=2   # a comment, nmtkit sweep\n"
                                 "OMP_NUM_THREADS=1 python -m nmtkit -q score -r x < h && nmtkit info M")])
    assert [s.args for s in shown_commands(page)] == [
        ["run", "r.yaml", "a=1", "b=2"], ["-q", "score", "-r", "x"], ["info", "M"],
        ["translate", "-m", "M", "--nbest", "2"]]
