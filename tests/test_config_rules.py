"""Every recipe key either takes effect or is refused in one line: no default data source,
no YAML alias bombs, a range for every number, and no key that nothing reads."""
from __future__ import annotations

import ast
import dataclasses
import math
import re
import time
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmtkit.config import NUMERIC_KEYS, Config, apply_overrides, from_dict, load_config
from nmtkit.errors import ConfigError
from nmtkit.limits import COMMAND_OPTIONS, RANGES
from support.recipe_space import VALUES, config_keys

PACKAGE = Path(__file__).resolve().parent.parent / "nmtkit"
SOURCE = {"data": {"source": "files"}}


def with_key(key: str, value, base: dict | None = None) -> dict:
    raw = {k: dict(v) for k, v in (base or SOURCE).items()}
    node = raw
    *sections, last = key.split(".")
    for part in sections:
        node = node.setdefault(part, {})
    node[last] = value
    return raw


# --- data.source -------------------------------------------------------------------------------

def test_a_recipe_without_a_source_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"^data.source is missing; choose one of files, hf, sword$"):
        from_dict({"data": {"files": {"train": {"en": "a", "es": "b"}}}})
    with pytest.raises(ConfigError, match="data.source 'bible' is not one of files, hf, sword"):
        from_dict({"data": {"source": "bible"}})


@pytest.mark.parametrize("source, key, value, owner", [
    ("sword", "files", {"train": {"en": "a.en"}}, "files"),
    ("files", "hf_name", "wmt/wmt14", "hf"),
    ("files", "hf_splits", {"train": "train"}, "hf"),
    ("hf", "sword_src", "engKJV", "sword"),
    ("sword", "hf_revision", "abc", "hf"),
    ("hf", "dev_size", 200, "sword"),  # an hf or files source brings its own dev and test splits
    ("files", "test_size", 50, "sword"),
])
def test_keys_of_another_source_are_refused_naming_where_they_belong(source, key, value, owner):
    with pytest.raises(ConfigError, match=f"^data.{key} belongs to data.source={owner}, but data.source is {source}$"):
        from_dict({"data": {"source": source, key: value}})


@pytest.mark.parametrize("splits", [{"train": "train", "dev": ["validation"], "test": "test"},
                                    {"train": "train", "valid": "validation"}, {"train": 3}])
def test_hf_splits_must_name_our_splits_with_strings(splits):
    with pytest.raises(ConfigError, match=r"^data.hf_splits must map train, dev and test to split names"):
        from_dict({"data": {"source": "hf", "hf_name": "x", "hf_splits": splits}})
    with pytest.raises(ConfigError, match=r"^data.corpora\[0\].hf_splits must map"):
        from_dict({"data": {"corpora": [{"name": "a", "source": "hf", "hf_name": "x", "hf_splits": splits}]}})


def test_each_source_accepts_its_own_keys_and_a_saved_config_reloads():
    cfg = from_dict({"data": {"source": "hf", "hf_name": "wmt/wmt14", "hf_config": "de-en"}})
    assert (cfg.data.source, cfg.data.hf_name, cfg.data.hf_config) == ("hf", "wmt/wmt14", "de-en")
    assert from_dict(cfg.to_dict()) == cfg  # a resolved config lists every key at its default


def test_the_cli_refuses_a_recipe_without_source_before_any_work(tmp_path):
    from support.cli import run_cli

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"workdir: {tmp_path / 'work'}\ndata: {{src_lang: en, tgt_lang: es}}\n")
    out = run_cli("prepare", str(recipe))
    assert out.returncode == 2
    assert out.stderr.decode() == "nmtkit: error: data.source is missing; choose one of files, hf, sword\n"
    assert not (tmp_path / "work").exists()


# --- YAML alias bombs --------------------------------------------------------------------------

def test_an_alias_bomb_is_refused_in_one_line_before_it_expands(tmp_path):
    levels = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]" for i in range(8)]
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text("\n".join(levels) + "\n")  # 10**9 leaves once expanded
    assert recipe.stat().st_size < 600
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"anchors and aliases .* are not allowed in recipes \(line 1\)"):
        load_config(recipe)
    assert time.perf_counter() - start < 5  # expanding it would take hours
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_config(None, ["data.source=files", "train.betas=[&x 0.9, *x]"])


def test_a_key_twice_in_one_mapping_is_refused_naming_its_line(tmp_path):
    """YAML's rule (the last one wins) would drop the whole first section without a word."""
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("data: {source: files}\ntrain:\n  max_steps: 7\nmodel: {d_model: 32}\ntrain:\n  lr: 0.003\n")
    with pytest.raises(ConfigError, match=r"^the key 'train' appears twice in one mapping \(again on line 5\)"):
        load_config(recipe)
    recipe.write_text("data: {source: files}\ntrain: {max_steps: 7, lr: 0.003, max_steps: 8}\n")
    with pytest.raises(ConfigError, match=r"^the key 'max_steps' appears twice .*line 2"):
        load_config(recipe)


@pytest.mark.parametrize("text, shown", [("data.src_lang: no", "False"), ("name: 1.10", "1.1"),
                                         ("vocab.from: yes", "True")])
def test_text_settings_that_yaml_reads_as_booleans_or_numbers_ask_for_quotes(text, shown):
    key, value = text.split(": ")
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: expected a string, got {shown} .*put the text in quotes$"):
        load_config(None, ["data.source=files", f"{key}={value}"])
    node = load_config(None, ["data.source=files", f"{key}='{value}'"])
    for part in key.split("."):
        node = getattr(node, "from_" if part == "from" else part)
    assert node == value


def test_numbers_yaml_would_rewrite_stay_text_so_a_revision_keeps_its_digits(tmp_path):
    """YAML 1.1 reads 0123456 as octal 42798: a pinned hf_revision would silently name another commit."""
    recipe = tmp_path / "hf.yaml"
    recipe.write_text("data:\n  source: hf\n  hf_name: x/y\n  hf_config: 1:20\n  hf_revision: 0123456\n"
                      "  src_lang: de\n  tgt_lang: en\ntrain: {max_steps: 0100, save_every: 1_000, validate_every: 250}\n")
    cfg = load_config(recipe)
    assert (cfg.data.hf_revision, cfg.data.hf_config) == ("0123456", "1:20")
    assert (cfg.train.max_steps, cfg.train.save_every, cfg.train.validate_every) == (100, 1000, 250)  # decimal, not octal
    assert load_config(recipe, ["data.hf_revision=0777"]).data.hf_revision == "0777"
    assert load_config(recipe, ["train.max_steps=0x10"]).train.max_steps == 16  # YAML 1.1's hex, as before
    with pytest.raises(ConfigError, match=r"^train.max_steps: expected an integer, got '0x1g'$"):
        load_config(recipe, ["train.max_steps=0x1g"])


def test_overrides_reach_an_empty_section_and_take_paths_starting_with_a_star(tmp_path):
    recipe = tmp_path / "empty.yaml"
    recipe.write_text("data: {source: files}\nmodel:\n")
    assert load_config(recipe, ["model.encoder_layers=2"]).model.encoder_layers == 2
    cfg = load_config(None, ["data.source=files", "data.files.train.en=*x.txt", "vocab.from=&y"])
    assert cfg.data.files == {"train": {"en": "*x.txt"}} and cfg.vocab.from_ == "&y"


def test_a_merge_key_is_refused_in_recipes_and_sweep_files(tmp_path):
    """``<<:`` merges a mapping in under the keys given beside it, which win: it would get a
    second value of a key past the duplicate-key refusal, silently dropped."""
    from nmtkit.sweep.spec import load_sweep

    recipe = tmp_path / "merge.yaml"
    recipe.write_text("data: {source: files}\ntrain:\n  lr: 0.001\n  <<: {lr: 0.5}\n")
    with pytest.raises(ConfigError, match=r"^YAML merge keys \(<<\) are not allowed in recipes \(line 4\)"):
        load_config(recipe)
    recipe.write_text("data: {source: files}\ntrain: {'<<': 1}\n")  # quoted: a key like any other
    with pytest.raises(ConfigError, match="unknown config key train.<<"):
        load_config(recipe)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("recipe: merge.yaml\nvariants: [{name: a, <<: {name: b}}]\n")
    with pytest.raises(ConfigError, match="merge keys"):
        load_sweep(sweep)


# --- overrides ---------------------------------------------------------------------------------

SMALL = {"data": {"source": "files"}, "model": {"d_model": 16, "ffn_dim": 32, "heads": 2},
         "train": {"max_steps": 12, "lr": 0.003}}


def test_a_mapping_override_sets_its_keys_and_keeps_the_rest_of_the_section(tmp_path):
    """``model={pre_norm: true}`` replaced the whole model section by the defaults (44M
    parameters instead of the recipe's few thousand); it means model.pre_norm=true."""
    import yaml

    recipe = tmp_path / "small.yaml"
    recipe.write_text(yaml.safe_dump(SMALL))
    dotted = load_config(recipe, ["model.pre_norm=true", "train.seed=5"])
    for overrides in (["model={pre_norm: true}", "train={seed: 5}"], ["model=pre_norm: true", "train={seed: 5}"]):
        cfg = load_config(recipe, overrides)
        assert cfg == dotted
    assert (dotted.model.d_model, dotted.model.pre_norm, dotted.train.max_steps, dotted.train.seed) == (16, True, 12, 5)
    nested = load_config(recipe, ["data={files: {train: {en: a.en}}}", "data.files.train.es=a.es"])
    assert nested.data.source == "files" and nested.data.files == {"train": {"en": "a.en", "es": "a.es"}}
    assert load_config(recipe, ["model={}"]) == load_config(recipe)
    with pytest.raises(ConfigError, match="unknown config key model.pre_nrom"):
        load_config(recipe, ["model={pre_nrom: true}"])


DE_EN = {"train": {"de": "a.de", "en": "a.en"}, "dev": {"de": "d.de", "en": "d.en"},
         "test": {"de": "t.de", "en": "t.en"}}
FR_EN = {"train": {"fr": "a.fr", "en": "a.en"}, "dev": {"fr": "d.fr", "en": "d.en"},
         "test": {"fr": "t.fr", "en": "t.en"}}


@pytest.mark.parametrize("overrides, files", [
    (["data.src_lang=fr", f"data.files={FR_EN}"], FR_EN),
    (["data.src_lang=fr", f"data={{files: {FR_EN}}}"], FR_EN),  # through the section: files is still one value
    (["data.files.train={fr: b.fr, en: b.en}"], {**DE_EN, "train": {"fr": "b.fr", "en": "b.en"}}),
    (["data.files={train: {de: a.de, en: a.en}}"], {"train": {"de": "a.de", "en": "a.en"}}),  # dev/test gone too
])
def test_a_mapping_override_replaces_a_dict_valued_key_whole(tmp_path, overrides, files):
    """``data.files`` is a value, not a section: merged into the recipe's, a new language kept
    the old one (refused as a third language) and a split left out stayed."""
    import yaml

    recipe = tmp_path / "de.yaml"
    recipe.write_text(yaml.safe_dump({**SMALL, "data": {"source": "files", "src_lang": "de", "tgt_lang": "en",
                                                        "files": DE_EN, "clean": {"max_len": 50}}}))
    cfg = load_config(recipe, overrides)
    assert cfg.data.files == files
    assert cfg.data.clean.max_len == 50 and cfg.model.d_model == 16  # the sections around it kept
    splits = {"train": "train", "dev": "validation", "test": "test"}
    for override in ("data.hf_splits={train: tr}", "data={hf_splits: {train: tr}}"):
        raw = apply_overrides({"data": {"hf_splits": dict(splits)}}, [override])
        assert raw == {"data": {"hf_splits": {"train": "tr"}}}  # not merged into {train, dev, test}
    merged = load_config(recipe, ["data={clean: {max_ratio: 2.0}}"]).data
    assert (merged.clean.max_len, merged.clean.max_ratio, merged.files) == (50, 2.0, DE_EN)  # a subsection merges


@pytest.mark.parametrize("override", ["train=", "model= ", "train=null", "train=~", "data.clean=", "eval="])
def test_a_section_override_with_no_value_is_refused(override):
    """``train=`` (an unset shell variable) would reset the section to the defaults."""
    key, text = (part.strip() for part in override.split("="))
    with pytest.raises(ConfigError, match=rf"^override {re.escape(key)}={re.escape(text)} has no value: "
                                          rf"{re.escape(key)} is a section"):
        load_config(None, ["data.source=files", override])


@pytest.mark.parametrize("override, read, expected", [
    ("workdir=runs/exp #2", lambda cfg: cfg.workdir, "runs/exp #2"),
    ("data.files.train.en=data/ #1.src", lambda cfg: cfg.data.files["train"]["en"], "data/ #1.src"),
    ("name= # x", lambda cfg: cfg.name, "# x"),
    ("name=#x", lambda cfg: cfg.name, "#x"),
    ("name=a#b", lambda cfg: cfg.name, "a#b"),
    ("data.src_lang='a #b'", lambda cfg: cfg.data.src_lang, "a #b"),  # quoted: YAML's text, as before
])
def test_a_hash_in_an_override_is_text_not_a_comment(override, read, expected):
    """YAML would cut ``runs/exp #2`` to ``runs/exp`` and ``data/ #1.src`` to ``data/``: the run
    would write to, or read, another path than the one typed."""
    assert read(load_config(None, ["data.source=files", override])) == expected
    with pytest.raises(ConfigError, match=r"^train.max_steps: expected an integer, got '12 # twelve'$"):
        load_config(None, ["data.source=files", "train.max_steps=12 # twelve"])


@pytest.mark.parametrize("override, message", [
    ("name=", "override name= has no value"), ("name=null", "override name=null has no value"),
    ("workdir=", "override workdir= has no value"), ("workdir= ", "override workdir= has no value"),
    ("workdir=null", "override workdir=null has no value"), ("workdir=~", "override workdir=~ has no value"),
    ("workdir=''", "override workdir='' has no value"),  # as typed, never a value it was read as
])
def test_an_empty_name_or_workdir_override_is_refused(override, message):
    """``name=`` put the work directory at data/ itself; ``workdir=`` dropped the recipe's."""
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}: give a "):
        load_config(None, ["data.source=files", override])


@pytest.mark.parametrize("text", ["name:\n", "name: ''\n", "name: '  '\n"])
def test_a_recipe_with_an_empty_name_is_refused(tmp_path, text):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data: {source: files}\n" + text)
    with pytest.raises(ConfigError, match=r"^name is empty: name the experiment"):
        load_config(recipe)
    assert load_config(recipe, ["name=x"]).work_path == Path("data/x")


def test_a_sweep_file_with_aliases_is_refused_too(tmp_path):
    from nmtkit.sweep.spec import load_sweep

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("recipe: &r ../quickstart.yaml\nvariants: [{name: a, recipe: *r}]\n")
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_sweep(sweep)


def test_deep_or_huge_recipes_and_non_plain_values_are_config_errors(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("data: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError):
        load_config(deep)
    with pytest.raises(ConfigError, match="nested too deeply or too large"):
        from_dict({"data": {"source": "files", "files": {"train": list(range(200_000))}}})
    with pytest.raises(ConfigError, match=r"train.seed: datetime.date\(2020, 1, 1\) is not a plain value"):
        load_config(None, ["data.source=files", "train.seed=2020-01-01"])
    with pytest.raises(ConfigError, match="data.files: keys must be names, got 1"):
        from_dict({"data": {"source": "files", "files": {1: "x"}}})


# --- ranges ------------------------------------------------------------------------------------

def test_every_number_in_a_recipe_has_a_range():
    assert sorted(NUMERIC_KEYS) == sorted(k for k in RANGES if not k.startswith(COMMAND_OPTIONS))


@pytest.mark.parametrize("override, message", [
    ("model.arch=rnn model.encoder_layers=0", "model.encoder_layers must be in [1, 1000], got 0"),
    ("model.decoder_layers=0", "model.decoder_layers must be in [1, 1000], got 0"),
    ("model.d_model=1099511627776", "model.d_model must be in [1, 65536], got 1099511627776"),
    ("model.max_positions=1000000000000", "model.max_positions must be in [1, 10**6], got 1000000000000"),
    ("train.seed=18446744073709551616", "train.seed must be in [0, 2**63-1], got 18446744073709551616"),
    ("train.lr=1e300", "train.lr must be in (0, 100], got 1e+300"),
    ("train.lr=.nan", "train.lr must be a finite number, got nan"),
    ("train.max_minutes=.inf", "train.max_minutes must be a finite number, got inf"),
    ("train.clip_norm=1e400", "train.clip_norm must be a finite number, got inf"),
    ("vocab.input_sentence_size=-1", "vocab.input_sentence_size must be in [0, 10**9], got -1"),
    ("train.max_steps=0", "train.max_steps must be in [1, 2**62], got 0"),
    ("train.device=mps", "train.device: 'mps' is not one of auto, cpu, cuda, cuda:N"),
    ("train.device=meta", "train.device: 'meta' is not one of auto, cpu, cuda, cuda:N"),
    ("train.device=xla", "train.device: 'xla' is not one of auto, cpu, cuda, cuda:N"),
    ("decode.max_len_b=100000000000", "decode.max_len_b must be in [0, 10000], got 100000000000"),
    ("decode.lenpen=.nan", "decode.lenpen must be a finite number, got nan"),
    ("model.d_model=65536 model.heads=64 model.ffn_dim=1048576",
     "the model would have about 2.8e+12 parameters (more than 1e+10)"),
])
def test_values_that_used_to_crash_later_are_refused_on_load(override, message):
    with pytest.raises(ConfigError) as raised:
        load_config(None, ["data.source=files", *override.split()])
    assert str(raised.value).startswith(message), str(raised.value)


def test_a_cuda_device_without_cuda_is_a_clear_error():
    import torch

    from nmtkit.runtime.device import resolve_device

    for name in ("xla", "mps", "meta", "cuda:x", "cpu:0"):
        with pytest.raises(ConfigError, match=f"unknown device '{name}'"):
            resolve_device(name)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="'cuda:1' requested but CUDA is not available"):
            resolve_device("cuda:1")
    else:
        with pytest.raises(ConfigError, match="only"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(key=st.sampled_from(config_keys()), value=VALUES)
def test_any_value_for_any_key_loads_or_is_a_config_error(key, value):
    """From a recipe mapping (any type) and from an override (any text): never another exception."""
    for attempt in (lambda: from_dict(with_key(key, value)),
                    lambda: from_dict(apply_overrides(dict(SOURCE, data=dict(SOURCE["data"])), [f"{key}={value}"]))):
        try:
            cfg = attempt()
        except ConfigError as err:
            assert "\n" not in str(err)
            continue
        for dotted in NUMERIC_KEYS:  # whatever loaded is within its range
            for node in leaves(cfg, dotted.split(".")):
                assert math.isfinite(node) and RANGES[dotted].problem(node) is None


def leaves(node, parts: list[str]) -> list:
    """The values at dotted ``parts`` under ``node``: one per entry through a list of sections (data.corpora)."""
    if isinstance(node, list):
        return [value for entry in node for value in leaves(entry, parts)]
    return leaves(getattr(node, parts[0]), parts[1:]) if parts else [node]


# --- no key without an effect ------------------------------------------------------------------

# keys that the config package itself applies, so nothing else needs to read them
APPLIED_BY_CONFIG = {"model.preset": "expanded into the model dims by from_dict",
                     "workdir": "read by Config.work_path, the one way every command finds the work directory",
                     "vocab.byte_fallback": "resolved by VocabConfig.uses_byte_fallback (auto: on from 1,024 pieces), "
                                            "which prepare calls",
                     "eval.metrics": "parsed by EvalConfig.metric_names (BLEU first), which run, validation and sweeps call"}
# keys accepted before their reader exists: none (an entry must go when its reader lands)
NOT_YET_READ: dict[str, str] = {}


def section_classes(cls: type = Config, prefix: str = "") -> dict[str, str]:
    """The dotted section each config class is (``TrainConfig`` -> ``train``), and the classes
    that carry a section's fields elsewhere: sources (a corpus has data's source keys) and the
    decode settings a translate call or a search holds."""
    found, hints = {}, typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            found[hints[f.name].__name__] = prefix + f.name
            found.update(section_classes(hints[f.name], f"{prefix}{f.name}."))
    return found


SECTIONS = {**section_classes(), "Config": "", "SourceConfig": "data", "CorpusConfig": "data",
            "TranslateOptions": "decode", "SearchSettings": "decode"}


def chain(node: ast.AST) -> list[str]:
    """``a.b.c`` as ["a", "b", "c"] ("?" for a start that is not a plain name)."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return [node.id if isinstance(node, ast.Name) else "?"] + names[::-1]


def section_named(name: str, aliases: dict[str, str]) -> str | None:
    """The section a variable or attribute holds: by its type annotation or assignment
    (``aliases``), by the convention ``train_cfg`` / ``model_config``, or the whole recipe (``cfg``)."""
    if name in aliases:
        return aliases[name]
    stem = name.rsplit("_", 1)[0]
    if name.endswith(("_cfg", "_config")) and stem in SECTIONS.values():
        return stem
    return "" if name in ("cfg", "config") else None


def key_of(names: list[str], aliases: dict[str, str], known: set[str]) -> str | None:
    """The dotted recipe key (or section) an attribute chain reads, or None: every name after
    the one that holds a section must continue a real key (``cfg.train.dtype``, not ``x.dtype``)."""
    for start, name in enumerate(names):
        path = section_named(name, aliases)
        if path is None and start > 0 and name in SECTIONS.values() and "." not in name:
            path = name  # ``whatever.train.dtype``: a section reached through an object we cannot type
        for rest in names[start + 1:] if path is not None else ():
            path = f"{path}.{rest}" if path else rest
            if path not in known:
                break
        else:
            if path is not None and path in known:
                return path
    return None


def assignments(scope: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """(target, value) of every ``a = b`` in ``scope``, ``a, b = c, d`` taken pair by pair."""
    pairs = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                pairs += zip(target.elts, value.elts)
            else:
                pairs.append((target, value))
    return [(target, value) for target, value in pairs if isinstance(value, (ast.Attribute, ast.Name))]


def keys_read(path: Path, known: set[str]) -> set[str]:
    """The recipe keys a module reads, scope by scope: a name holds a section when annotated with
    its class or assigned from a chain that names one; ``self.x = section`` types ``x`` module-wide."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    fields: dict[str, str] = {}
    scopes = [tree] + [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = set()
    for _ in range(2):  # the second pass sees the ``self.x`` fields every scope assigned
        for scope in scopes:
            aliases = dict(fields)
            arguments = scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs if scope is not tree else []
            for argument in arguments:
                annotation = ast.unparse(argument.annotation).strip("'\"") if argument.annotation else ""
                if annotation.split(".")[-1] in SECTIONS:
                    aliases[argument.arg] = SECTIONS[annotation.split(".")[-1]]
            for target, value in assignments(scope):
                held = key_of(chain(value), aliases, known)
                if held in SECTIONS.values():
                    if isinstance(target, ast.Name):
                        aliases[target.id] = held
                    elif isinstance(target, ast.Attribute):
                        fields[target.attr] = held
            found |= {key for node in ast.walk(scope) if isinstance(node, ast.Attribute)
                      for key in [key_of(chain(node), aliases, known)] if key is not None}
    return found


def test_every_config_key_is_read_outside_config():
    """Each key is read by its full dotted name (``train.dtype`` read as ``cfg.train.dtype``, or
    as ``.dtype`` of a value typed or named as the train section), not by its last name alone."""
    keys = set(config_keys())
    known = keys | set(SECTIONS.values()) - {""}
    outside = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in ("config", "limits.py")]
    read = set().union(*(keys_read(p, known) for p in outside))
    assert keys - read == set(APPLIED_BY_CONFIG) | set(NOT_YET_READ)


def test_the_key_matcher_needs_the_section_not_just_the_last_name(tmp_path):
    """``tensor.dtype`` or ``vocab.size`` of an untyped object reads no key; a typed, assigned,
    conventionally named or stored section does."""
    module = tmp_path / "m.py"
    module.write_text(
        "def f(tensor, spm, train: TrainConfig, cfg):\n"
        "    tensor.dtype, spm.size, train.lr\n"
        "    v = cfg.vocab\n    v.size\n"
        "def g(model_cfg, options: 'TranslateOptions'):\n    model_cfg.d_model, options.lenpen\n"
        "class M:\n    def __init__(self, cfg: ModelConfig):\n        self.cfg = cfg\n"
        "    def h(self):\n        self.cfg.heads, self.other.train.seed\n")
    keys = set(config_keys())
    assert keys_read(module, keys | set(SECTIONS.values()) - {""}) & keys == {
        "train.lr", "vocab.size", "model.d_model", "decode.lenpen", "model.heads", "train.seed"}
