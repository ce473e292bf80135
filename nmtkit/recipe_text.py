"""Recipe text to a plain tree: YAML without anchors or aliases, and nothing but str-keyed
mappings, lists and scalars, of a size a recipe can have. Checked before anything is copied
or compared, so a hostile recipe costs milliseconds, not gigabytes."""
from __future__ import annotations

import re
from typing import Any, Optional

from nmtkit.errors import ConfigError

_PLAIN_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
MAX_RECIPE_BYTES = 16 << 20  # a recipe or sweep file is a few kB; past this it is not one
MAX_INT_DIGITS = 100  # every integer setting fits in 19 digits; Python refuses int() past 4,300


def safe_yaml(text: str) -> Any:
    """``yaml.safe_load`` without anchors and aliases: a few hundred bytes of nested aliases
    expand to billions of values (a "billion laughs"), and a recipe never needs them."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent) or getattr(self.peek_event(), "anchor", None):
                mark = self.peek_event().start_mark
                raise ConfigError(f"YAML anchors and aliases (&name, *name) are not allowed in recipes "
                                  f"(line {mark.line + 1}); write the values out")
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            # YAML lets the last of two equal keys win: a second `train:` section would silently
            # drop every setting of the first
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` lets keys of the mapping it
                    # names in silently (a key given beside it wins), past the duplicate check below
                    raise ConfigError(f"YAML merge keys (<<) are not allowed in recipes (line "
                                      f"{key_node.start_mark.line + 1}); write the keys out")
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key is not None and key in seen:
                    raise ConfigError(f"the key {key!r} appears twice in one mapping (again on line "
                                      f"{key_node.start_mark.line + 1}); merge the two")
                seen.add(key)
            return super().construct_mapping(node, deep)

        def construct_yaml_int(self, node):
            # YAML 1.1 reads 0123456 as octal (42798), 1_000 as 1000 and 1:20 as 80: as a string
            # (a revision, a name) the text would silently change, so only plain decimals are
            # numbers; the rest stay text, which an integer setting reads as decimal or refuses
            if _PLAIN_INT.fullmatch(node.value):
                digits = len(node.value.lstrip("+-"))
                if digits > MAX_INT_DIGITS:
                    raise ConfigError(f"line {node.start_mark.line + 1}: a number of {digits:,} digits is out "
                                      f"of range for every setting (at most {MAX_INT_DIGITS}); put text in quotes")
                return super().construct_yaml_int(node)
            return self.construct_scalar(node)

    NoAliasLoader.add_constructor("tag:yaml.org,2002:int", NoAliasLoader.construct_yaml_int)
    loader = NoAliasLoader(text)  # a SafeLoader subclass, driven directly so no generic load call appears
    try:
        return loader.get_single_data()
    except RecursionError:
        raise ConfigError("YAML nested too deeply for a recipe") from None
    finally:
        loader.dispose()


def has_comment(text: str) -> bool:
    """Whether YAML would drop a ``# comment`` from ``text`` (a ``#`` between its tokens, not one
    inside a value): on a command line ``key=runs/exp #2`` means the whole text, not ``runs/exp``."""
    import yaml

    if "#" not in text:
        return False
    end = 0
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if "#" in text[end:token.start_mark.index]:
                return True
            end = max(end, token.end_mark.index)
    except yaml.YAMLError:
        return False  # not YAML at all: the caller takes it as text
    return "#" in text[end:]


_MAX_DEPTH, _MAX_VALUES = 16, 100_000  # a recipe is a few sections of a few dozen keys


def plain_copy(value: Any, key: str = "recipe", budget: Optional[list] = None, depth: int = 0) -> Any:
    """A deep copy of a recipe tree of str-keyed dicts, lists and scalars, or a ConfigError
    naming the first key with anything else (a YAML date, a non-string key) or a tree too
    deep or too large to be a recipe."""
    budget = budget if budget is not None else [_MAX_VALUES]
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_DEPTH:
        raise ConfigError(f"{key}: nested too deeply or too large for a recipe")
    if isinstance(value, dict):
        bad = next((k for k in value if not isinstance(k, str)), None)
        if bad is not None:
            raise ConfigError(f"{key}: keys must be names, got {bad!r}")
        return {k: plain_copy(v, f"{key}.{k}" if depth else k, budget, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_copy(v, f"{key}[{i}]", budget, depth + 1) for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ConfigError(f"{key}: {value!r} is not a plain value (a number, string, list or mapping)")
