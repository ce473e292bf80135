"""Property tests over what users write by hand: constraint and prefix file lines, and sweep
files. Whatever they hold, the outcome is a result or an ``nmtkit`` error (one line at the
CLI), never another exception, and never an allocation past the search bound."""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tiny_recipe
from nmtkit.decoding.guides import GuideFiles, guides_digest, parse_constraints
from nmtkit.errors import NmtkitError
from nmtkit.sweep.spec import MAX_VARIANTS, load_sweep
from conftest import options

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
ANY_CHAR = st.characters(blacklist_categories=())  # surrogates included
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10**4300, max_value=10**4400),
                    st.floats(allow_nan=True), st.text(ANY_CHAR, max_size=12))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=12)


def json_text(value) -> str:
    """JSON of ``value`` as a file holds it: ASCII escapes, so a surrogate is \\udXXX there."""
    try:
        return json.dumps(value, allow_nan=True)
    except ValueError:  # an integer past Python's digit limit for str()
        return "9" * 5000


@SETTINGS
@given(st.one_of(JSON_VALUES.map(json_text), st.text(ANY_CHAR, max_size=40)))
def test_a_constraints_line_is_phrases_or_a_data_error(line):
    try:
        phrases = parse_constraints(line, "c.jsonl: line 1")
    except NmtkitError as err:
        assert str(err).startswith("c.jsonl: line 1: ") and "\n" not in str(err)
        return
    assert isinstance(phrases, tuple)
    for phrase in phrases:
        assert isinstance(phrase, str) and phrase.strip()
        phrase.encode("utf-8")  # a character string: no lone surrogate


@SETTINGS
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_guide_files_of_any_bytes_read_as_guides_or_a_data_error(tmp_path_factory, prefixes, constraints):
    root = tmp_path_factory.mktemp("guides")
    (root / "p").write_bytes(prefixes)
    (root / "c").write_bytes(constraints)
    for files in (GuideFiles(prefix=root / "p"), GuideFiles(constraints=root / "c"),
                  GuideFiles(prefix=root / "p", constraints=root / "c")):
        for errors in ("strict", "replace"):
            try:
                guides = files.read(errors)
            except NmtkitError as err:
                assert "\n" not in str(err)
                continue
            data = prefixes if files.prefix else constraints
            assert len(guides) == data.count(b"\n") + (bool(data) and not data.endswith(b"\n"))  # a line per \n
            assert len(guides_digest(guides)) == 64


LINES = st.lists(st.one_of(JSON_VALUES.map(json_text), st.just('["a b"]'), st.just("[]"), st.just("")),
                 min_size=1, max_size=4)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(LINES, st.lists(st.text(ANY_CHAR, max_size=8), min_size=1, max_size=4))
def test_translate_with_any_guide_lines_answers_or_refuses_in_one_line(tmp_path_factory, model_dir,  # noqa: F811
                                                                        constraint_lines, prefix_lines):
    from nmtkit.runtime.console import NmtConsole
    from nmtkit.translate_files import translate_file

    root = tmp_path_factory.mktemp("guided")
    source = root / "in.txt"
    source.write_text("the cat\n" * len(constraint_lines), encoding="utf-8")
    (root / "c").write_text("".join(line.replace("\n", " ") + "\n" for line in constraint_lines), encoding="utf-8")
    prefixes = [line.replace("\n", " ").replace("\r", " ").encode("utf-8", "surrogatepass") for line in prefix_lines]
    (root / "p").write_bytes(b"".join(line + b"\n" for line in prefixes))
    out = root / "out.txt"
    try:
        translate_file([str(model_dir)], str(source), str(out), options(beam_size=2), NmtConsole(verbosity=-1),
                       GuideFiles(prefix=root / "p", constraints=root / "c"))
    except NmtkitError as err:
        assert "\n" not in str(err) and not out.exists()
        return
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(constraint_lines)


SWEEP_VALUES = st.recursive(SCALARS | st.sampled_from(["train.lr=0.1", "model.dropout=0.2", "x=y", "=", "a.b.c=1"]),
                            lambda inner: st.lists(inner, max_size=4) |
                            st.dictionaries(st.sampled_from(["train.lr", "model.dropout", "name", "grid", "recipe",
                                                             "overrides", "train.max_steps", "nope"]),
                                            inner, max_size=3), max_leaves=16)
SWEEPS = st.dictionaries(st.sampled_from(["recipe", "workdir", "overrides", "variants", "grid", "other"]),
                         SWEEP_VALUES, max_size=5).map(lambda sweep: {"recipe": "base.yaml", **sweep})


def write_base(root: Path) -> None:
    recipe = tiny_recipe(root / "work")
    recipe["data"]["files"] = {"train": {"src": "t.src", "tgt": "t.tgt"}}
    (root / "base.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")


@SETTINGS
@given(SWEEPS)
def test_a_sweep_file_of_any_shape_loads_or_is_a_config_error(tmp_path_factory, sweep):
    root = tmp_path_factory.mktemp("sweep")
    write_base(root)
    path = root / "s.yaml"
    try:
        path.write_text(yaml.safe_dump(sweep, allow_unicode=False), encoding="utf-8")
    except (ValueError, yaml.YAMLError):  # not representable as YAML (an int past the digit limit)
        path.write_text(f"recipe: base.yaml\ngrid: {{train.lr: [{'9' * 5000}]}}\n", encoding="utf-8")
    try:
        loaded = load_sweep(path)
    except NmtkitError as err:
        assert "\n" not in str(err) and len(str(err)) < 2000
        return
    assert 1 <= len(loaded.variants) <= MAX_VARIANTS
    assert len({variant.name for variant in loaded.variants}) == len(loaded.variants)


@SETTINGS
@given(st.text(ANY_CHAR, max_size=300))
def test_sweep_file_text_of_any_kind_loads_or_is_a_config_error(tmp_path_factory, text):
    root = tmp_path_factory.mktemp("sweeptext")
    write_base(root)
    path = root / "s.yaml"
    # surrogatepass: a lone surrogate becomes bytes no UTF-8 decoder accepts (surrogateescape takes only U+DC80-DCFF)
    path.write_bytes(f"recipe: base.yaml\n{text}".encode("utf-8", "surrogatepass"))
    try:
        load_sweep(path)
    except NmtkitError as err:
        assert "\n" not in str(err)
