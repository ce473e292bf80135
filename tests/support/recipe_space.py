"""Every recipe key (dotted) and a hypothesis strategy of values of any type for them: the
space the recipe-rule and CLI-option fuzz tests draw from."""
from __future__ import annotations

import dataclasses
import typing

from hypothesis import strategies as st

from nmtkit.config import Config


def config_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Dotted names of every leaf field of the config dataclasses."""
    keys, hints = [], typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += config_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
    | st.sampled_from(["nan", "inf", "-1", "1e400", "0", "true", "cuda:0", "files", "[1, 2]", "2**64"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=5)
