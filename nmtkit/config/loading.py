"""Recipe text to a checked ``Config`` and back: YAML (``nmtkit.recipe_text``), dotted
``key=value`` overrides, values converted to their field types with unknown keys and wrong
types refused naming the key, then the rules of ``rules.py``."""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Literal, Optional

from nmtkit.config.rules import check_ranges, validate
from nmtkit.config.schema import (PRESETS, Config, DataConfig, DecodeConfig, ModelConfig, VocabConfig, field_types,
                                  recipe_key, section_type)
from nmtkit.errors import ConfigError
from nmtkit.recipe_text import MAX_INT_DIGITS, MAX_RECIPE_BYTES, has_comment, plain_copy, safe_yaml


def _shown_choice(choice: Any) -> str:
    """A Literal choice as a recipe writes it: true/false, "" for the empty string."""
    if isinstance(choice, bool):
        return str(choice).lower()
    return '""' if choice == "" else str(choice)


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check/convert ``value`` to the field type, or raise a ConfigError naming ``key``."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        choices = typing.get_args(annotation)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(_shown_choice, choices))}")
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, str) and len(value.strip()) > MAX_INT_DIGITS + 2:  # past int()'s limit too
            raise ConfigError(f"{key}: expected an integer, got text of {len(value):,} characters "
                              f"(an integer setting has at most {MAX_INT_DIGITS} digits)")
        try:
            return int(value)
        except ValueError:
            pass
        try:  # 0x10, 0o17, 0b101 (which recipe text keeps as text: see recipe_text.py)
            return int(value, 0)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if annotation is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if annotation is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        if isinstance(value, (bool, float)):  # YAML read `no` (Norwegian) as false, `1.10` as 1.1
            raise ConfigError(f"{key}: expected a string, got {value!r} (YAML read it as a "
                              f"{type(value).__name__}): put the text in quotes")
        return "" if value is None else str(value)
    if annotation is tuple:
        if isinstance(value, str):
            value = [v for v in value.strip("()[] ").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        try:
            return tuple(float(v) for v in value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{key}: expected a list of numbers, got {value!r}") from None
    if annotation is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return value
    section = section_type(annotation)
    if section is not None:  # a list of sections (data.corpora): each entry checked like a section
        if value is None:
            return []
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list of mappings, got {value!r}")
        return [_build(section, entry, f"{key}[{i}].") for i, entry in enumerate(value)]
    return value


def _build(cls: type, values: dict, prefix: str) -> Any:
    """Build dataclass ``cls`` from a (possibly partial) dict, rejecting unknown keys."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'recipe'}: expected a mapping, got {values!r}")
    hints = field_types(cls)
    fields = {recipe_key(f.name): f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields), key=str)
    if unknown:
        raise ConfigError(
            f"unknown config key {prefix}{unknown[0]!s}; valid keys under "
            f"{prefix.rstrip('.') or 'the top level'}: {', '.join(fields)}"
        )
    kwargs = {}
    for name, value in values.items():
        field_name = fields[name]
        hint = hints[field_name]
        if dataclasses.is_dataclass(hint):
            # an empty section (None) is the defaults; `clean: false` is not "no cleaning": refused below
            kwargs[field_name] = _build(hint, {} if value is None else value, f"{prefix}{name}.")
        else:
            kwargs[field_name] = _coerce(value, hint, f"{prefix}{name}")
    return cls(**kwargs)


def parse_value(text: str) -> Any:
    """Parse an override value the way YAML would (numbers, booleans, lists, mappings), except
    that a ``#`` is part of the text: a command line has no comments, and YAML would cut
    ``workdir=runs/exp #2`` to ``runs/exp`` (``name= # x`` to nothing)."""
    import yaml

    if text.lstrip().startswith(("*", "&")):  # a path like *x.txt, which YAML would take for an alias
        return text
    if has_comment(text):
        return text.strip()
    try:
        return safe_yaml(text)
    except yaml.YAMLError:
        return text


def _annotation_at(parts: list[str]) -> Any:
    """The schema type of the dotted key ``parts`` (a section's dataclass, a field's type), or
    None where the key is not a recipe key (then ``_build`` names it)."""
    cls, annotation = Config, None
    for part in parts:
        if cls is None:
            return None
        names = {recipe_key(f.name): f.name for f in dataclasses.fields(cls)}
        if part not in names:
            return None
        annotation = field_types(cls)[names[part]]
        cls = annotation if dataclasses.is_dataclass(annotation) else None
    return annotation


def is_section(parts: list[str]) -> bool:
    """Whether the dotted key ``parts`` names a section of the schema (data, data.clean, model,
    ...), whose keys a mapping sets one by one; a dict-valued field (data.files, data.hf_splits)
    is one value, replaced whole."""
    return dataclasses.is_dataclass(_annotation_at(parts))


def _merge(into: dict, value: dict, parts: list[str]) -> dict:
    """``value`` merged into the section ``parts`` key by key, its subsections recursively:
    ``model={pre_norm: true}`` sets one key of the recipe's model section, as
    ``model.pre_norm=true`` does. Any other mapping replaces what it meets: ``data={files: {...}}``
    merged into the recipe's files would keep a language or split the new value leaves out."""
    for key, item in value.items():
        if isinstance(item, dict) and isinstance(into.get(key), dict) and is_section([*parts, key]):
            _merge(into[key], item, [*parts, key])
        else:
            into[key] = item
    return into


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Set dotted ``a.b.c=value`` overrides in a nested dict (before type checking); a mapping
    value is merged into a section, never replacing it whole, and replaces any other value."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. train.max_steps=1000)")
        key, text = item.split("=", 1)
        key = key.strip()
        node = raw
        parts = key.split(".")
        value = parse_value(text)
        if value is None or value == "":
            # `train=` would reset a section to its defaults, `name=` put the work directory at
            # data/ itself, `workdir=` drop the recipe's: an unset shell variable, most likely
            typed = f"{key}={text.strip()}"  # as given: workdir=null, workdir=~ (YAML's nulls) or workdir=
            if dataclasses.is_dataclass(_annotation_at(parts)):
                raise ConfigError(f"override {typed} has no value: {key} is a section; set its keys "
                                  f"({key}.KEY=VALUE) or a mapping ({key}={{KEY: VALUE}})")
            if key in ("name", "workdir"):
                raise ConfigError(f"override {typed} has no value: give a {key} (or leave the override out)")
        for part in parts[:-1]:
            if node.get(part) is None:  # absent, or an empty section (`model:` with nothing under it)
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"override {key}: {part} is not a section")
        if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict) and is_section(parts):
            _merge(node[parts[-1]], value, parts)
        else:
            node[parts[-1]] = value
    return raw


def decode_config_from_dict(values: dict) -> DecodeConfig:
    """The decode settings saved with a model directory, checked by the rules of a recipe."""
    decode = _build(DecodeConfig, values, "decode.")
    check_ranges(decode, "decode.")
    return decode


def from_dict(raw: dict) -> Config:
    raw = plain_copy(raw)
    model = raw.get("model") or {}
    preset = model.get("preset") if isinstance(model, dict) else None
    if isinstance(preset, str) and preset in PRESETS:  # preset values are defaults that explicit keys override
        raw["model"] = {**PRESETS[preset], **model}
    return validate(_build(Config, raw, ""))


def model_config_from_dict(values: dict, joint_vocab: bool) -> ModelConfig:
    """The ``model`` section of a saved model directory, type-checked with unknown keys rejected
    and held to the rules of a recipe's model section (heads=0 or d_model<0 are errors there too)."""
    model = _build(ModelConfig, values, "model.")
    validate(Config(model=model, vocab=VocabConfig(joint=joint_vocab), data=DataConfig(source="files")))
    return model


def read_recipe(path: str | Path) -> dict:
    """A YAML recipe file as a plain tree, its ``name`` defaulting to the file's stem."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe not found: {path}")
    from nmtkit.storage.files import read_regular

    try:
        raw = safe_yaml(read_regular(path, MAX_RECIPE_BYTES, ConfigError, "recipe").decode("utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not a valid YAML recipe ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections")
    raw.setdefault("name", path.stem)
    return raw


def load_config(path: str | Path | None, overrides: Optional[list[str]] = None) -> Config:
    """Load a YAML recipe (or defaults when ``path`` is None) and apply overrides."""
    raw = read_recipe(path) if path is not None else {}
    return from_dict(apply_overrides(raw, list(overrides or [])))


SAVED_HEADER = "# The resolved recipe, written by nmtkit (which rewrites this file).\n"


def save_config(cfg: Config, path: str | Path, only_ours: bool = False) -> None:
    """Write the resolved config as YAML (atomically). A file that already holds it is left alone
    (and its mtime): prepare and every training session save theirs, mostly unchanged. With
    ``only_ours`` (the work directory's, where a user's file may be), a file there that nmtkit
    did not write (no header, and not a whole resolved config as older versions wrote: a
    user's recipe named config.yaml in ``workdir: .``) is not replaced."""
    import yaml

    from nmtkit.storage.files import refuse_foreign, write_text_if_changed

    tree = _plain(cfg.to_dict())
    path = Path(path)
    if only_ours and path.is_file() and not _written_by_nmtkit(path, tree):
        refuse_foreign(path, "the resolved recipe")
    write_text_if_changed(path, SAVED_HEADER + yaml.safe_dump(tree, sort_keys=False))


def _written_by_nmtkit(path: Path, tree: dict) -> bool:
    """Whether ``path`` is a saved config: it starts with the header, or it is an older nmtkit's
    dump (no header): every section resolved (far more keys than a recipe names, which lists
    what differs from the defaults) and text exactly as YAML writes it (nmtkit's dumps
    round-trip byte for byte; a hand-written recipe, with comments and its own layout, does not)."""
    import yaml

    from nmtkit.errors import NmtkitError
    from nmtkit.storage.files import read_regular

    try:
        text = read_regular(path, MAX_RECIPE_BYTES, what="saved config").decode("utf-8")
    except (NmtkitError, UnicodeDecodeError):
        return False
    if text.startswith(SAVED_HEADER):
        return True
    try:
        saved = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    sections = ("data", "vocab", "model", "train")
    if not isinstance(saved, dict) or not all(isinstance(saved.get(key), dict) for key in sections):
        return False
    resolved = sum(len(saved[key]) for key in sections) >= 0.6 * sum(len(tree[key]) for key in sections)
    return resolved and text == yaml.safe_dump(saved, sort_keys=False)


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj
