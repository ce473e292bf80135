"""Sweep files: one base recipe and named variants of it, each a set of dotted overrides.

    recipe: ../quickstart.yaml          # the base recipe, relative to this file
    workdir: data/sweeps/mine           # default: data/sweeps/<file stem>
    overrides: {train.max_steps: 600}   # applied to every variant, before its own
    variants:
      - name: baseline                  # the first variant is the baseline of the p-values ...
      - name: prenorm
        overrides: {model.pre_norm: true}
      - name: lstm                      # a variant may start from another recipe
        recipe: ../quickstart-lstm.yaml
      - name: lr                        # a grid: one variant per combination, named
        grid:                           # lr,lr=0.002,warmup=100 ... (prefix, then key=value)
          train.lr: [0.002, 0.003]
          train.warmup: [100, 300]
    grid: {model.dropout: [0.0, 0.2]}   # shorthand for one more grid entry without a name
    seeds: [1, 2, 3]                    # every variant once per training seed (train.seed) ...
    splits: 2                           # ... and per data split (data.split_seed 0 .. splits-1)
    baseline: lstm                      # ... unless one is named here (or by --baseline)

Overrides are a mapping of dotted keys or a list of ``key=value`` strings; a nested mapping
({model: {pre_norm: true}}) is one dotted key per value of a section (model.pre_norm=true),
and one value for a mapping-valued key (data.files), replaced whole. Each variant's
config is the one ``nmtkit run RECIPE key=value ...`` would build, so every variant is
built (and validated like a recipe) before any work starts: a key a variant sets twice (its
overrides and its grid) is refused, two variants of the same settings are warned of. No torch here.

With ``seeds`` and/or ``splits`` (or ``nmtkit sweep --seeds 1,2 --splits 3``) each variant is
a group of runs, one per (seed, split), named ``NAME,seed=S,split=K``; split K sets
``data.split_seed=K`` (split 0 is the recipe's own), the same K splits for every variant, so
runs of two variants on one (seed, split) are paired and all variants of a split share its
prepare. Without either key a variant is one run, as before.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmtkit.config import Config, apply_overrides, from_dict, is_section, parse_value, read_recipe
from nmtkit.errors import ConfigError
from nmtkit.recipe_text import MAX_RECIPE_BYTES, plain_copy, safe_yaml  # no aliases: see recipe_text.py
from nmtkit.storage.files import read_regular
from nmtkit.sweep.replication import check_seeds, check_splits

SWEEP_KEYS = ("recipe", "workdir", "overrides", "variants", "grid", "seeds", "splits", "baseline")
VARIANT_KEYS = ("name", "recipe", "overrides", "grid")
RESERVED_OVERRIDES = ("name", "workdir")  # the sweep places every variant itself
MAX_VARIANTS = 10_000  # each variant is a training run: far past any sweep that finishes
VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=,+-]{0,119}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


@dataclass(frozen=True)
class Variant:
    name: str
    recipe: Path  # the sweep's base recipe unless the variant names its own
    overrides: tuple[str, ...]  # this variant's own ``key=value`` items (the sweep's shared ones excluded)
    config: Config
    group: str = ""  # the variant this run belongs to ("": not replicated, the run is the variant)
    seed: int | None = None  # its training seed and data split when replicated
    split: int | None = None
    replica: tuple[str, ...] = ()  # the ``key=value`` items that make this (seed, split) run

    @property
    def group_name(self) -> str:
        return self.group or self.name

    def settings(self, base_recipe: Path) -> list[str]:
        """What sets this variant apart, for tables: its own recipe (if any) and overrides."""
        return ([f"recipe:{self.recipe.name}"] if self.recipe != base_recipe else []) + list(self.overrides)

    # the digests are cached (the config never changes): a sweep's table asks each variant's
    # status after every run, which would otherwise rebuild N digests N times
    @functools.cached_property
    def _settings(self) -> dict:
        return changed_settings(self.config)

    @functools.cached_property
    def data_key(self) -> str:
        """Variants with the same key share one ``prepare``: a digest of what prepared/ depends on."""
        return self._data_digest(with_weights=False)  # training applies corpus weights; prepared/ does not hold them

    @functools.cached_property
    def legacy_data_key(self) -> str:
        """The key of nmtkit versions that hashed corpus weights too (their links stay valid)."""
        return self._data_digest(with_weights=True)

    def _data_digest(self, with_weights: bool) -> str:
        settings = self._settings
        vocab = {k: v for k, v in settings.get("vocab", {}).items() if k != "workers"}  # speed, not output
        data = dict(settings.get("data", {}))
        if not with_weights and isinstance(data.get("corpora"), list):
            data["corpora"] = [{k: v for k, v in c.items() if k != "weight"} if isinstance(c, dict) else c
                               for c in data["corpora"]]
        text = json.dumps({"data": data, "vocab": vocab}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @functools.cached_property
    def config_key(self) -> str:
        """A digest of the whole resolved config: a finished variant counts only for this config."""
        text = json.dumps(self._settings, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @functools.cached_property
    def training_key(self) -> str:
        """``config_key`` without the name and work directory the sweep gives each variant: two
        variants with one key would train the same model twice."""
        settings = {k: v for k, v in self._settings.items() if k not in RESERVED_OVERRIDES}
        return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def changed_settings(config: Config) -> dict:
    """The settings of ``config`` that differ from nmtkit's defaults: the digests above hash
    these, so a key added to nmtkit later (at its default) leaves finished variants finished."""
    def differ(value: Any, default: Any) -> Any:
        if isinstance(value, dict) and isinstance(default, dict):
            inner = {k: d for k, v in value.items() if (d := differ(v, default.get(k, _ABSENT))) is not _ABSENT}
            if set(default) - set(value):  # keys taken away: not a default, whatever remains
                return value
            return inner or _ABSENT
        return _ABSENT if value == default or (default is _ABSENT and value in ({}, [], None)) else value

    # against the old value of a key whose default changed (LEGACY_VALUES): a sweep written before
    # keeps its digests, a recipe relying on the new default gets new ones
    return differ(json.loads(json.dumps(config.to_dict(), default=str)), _legacy_defaults())


@functools.lru_cache(maxsize=1)
def _legacy_defaults() -> dict:
    """``Config.legacy_tree()`` as JSON reads it, built once (``differ`` only reads it)."""
    return json.loads(json.dumps(Config.legacy_tree(), default=str))


_ABSENT = object()


@dataclass(frozen=True)
class Sweep:
    name: str
    path: Path
    recipe: Path
    workdir: Path
    shared_overrides: tuple[str, ...]
    variants: tuple[Variant, ...]  # every run, in the order they run
    groups: tuple[Variant, ...] = ()  # replicated: the variants as the file names them (their seed/split 0 configs)
    seeds: tuple[int, ...] = ()
    splits: int = 0  # 0: not replicated
    baseline_name: str = ""  # the variant the p-values test against ("": the first)
    warnings: tuple[str, ...] = ()  # one line each, shown before the sweep lists or runs anything

    @property
    def replicated(self) -> bool:
        return bool(self.groups)

    @property
    def baseline(self) -> Variant:
        """The baseline's first run (its only one unless replicated)."""
        name = self.baseline_name or self.variants[0].group_name
        return next(v for v in self.variants if v.group_name == name)

    @property
    def baseline_group(self) -> Variant:
        """Replicated sweeps: the baseline as the file names it (one of ``groups``)."""
        return next(g for g in self.groups if g.name == self.baseline.group_name)

    def runs_of(self, group: str) -> list[Variant]:
        return [v for v in self.variants if v.group_name == group]

    def variant_dir(self, name: str) -> Path:
        return variant_dir(self.workdir, name)

    def select(self, names: list[str] | None) -> list[Variant]:
        """The runs named by ``--only`` (all when none), in sweep order; a replicated variant's
        name selects all its runs."""
        if not names:
            return list(self.variants)
        known = list(dict.fromkeys([v.group_name for v in self.variants] + [v.name for v in self.variants]))
        for name in names:
            if name not in known:
                shown = list(dict.fromkeys(v.group_name for v in self.variants))
                raise ConfigError(f"--only {name}: no such variant in {self.path} (variants: {', '.join(shown)})")
        return [v for v in self.variants if v.name in names or v.group_name in names]


def variant_dir(workdir: Path, name: str) -> Path:
    return workdir / "variants" / name


def load_sweep(path: str | Path, seeds: list[int] | None = None, splits: int | None = None,
               baseline: str | None = None) -> Sweep:
    """Read and check a sweep file and build every variant's config; raises ConfigError.
    ``seeds`` / ``splits`` / ``baseline`` (from the command line) replace the file's."""
    path = Path(path)
    raw = _read_yaml(path)
    unknown = sorted(set(raw) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown sweep key {unknown[0]}; valid keys: {', '.join(SWEEP_KEYS)}")
    recipe = _recipe_path(path, raw.get("recipe"), str(path))
    if "workdir" in raw and (not isinstance(raw["workdir"], str) or not raw["workdir"].strip()):
        raise ConfigError(f"{path}: workdir must name a directory, got {raw['workdir']!r} (leave the key out "
                          f"for data/sweeps/{path.stem})")
    workdir = Path(raw.get("workdir") or f"data/sweeps/{path.stem}")
    shared = tuple(_override_items(raw.get("overrides"), f"{path}: overrides"))
    if not isinstance(raw.get("variants") or [], list):
        raise ConfigError(f"{path}: `variants:` must be a list of entries with name, overrides and/or grid")
    entries = list(raw.get("variants") or [])
    if raw.get("grid") is not None:
        entries.append({"grid": raw["grid"]})
    named = []
    for index, entry in enumerate(entries, 1):
        named += _expand(entry, f"{path}: variant {index}")
        if len(named) > MAX_VARIANTS:
            raise ConfigError(f"{path}: more than {MAX_VARIANTS:,} variants; split the sweep into smaller ones")
    if not named:
        raise ConfigError(f"{path}: no variants (give `variants:` and/or `grid:`)")
    _check_names(path, [name for name, _, _ in named])
    recipes: dict[Path, dict] = {}  # each recipe file read once, however many variants start from it
    variants = []
    for name, own_recipe, items in named:
        variant_recipe = _recipe_path(path, own_recipe, f"{path}: variant {name}") if own_recipe is not None else recipe
        variants.append(Variant(name, variant_recipe, tuple(items),
                                _variant_config(path, variant_recipe, workdir, name, shared, items, recipes)))
    variants = tuple(variants)
    duplicates = _duplicates(path, variants)
    seeds = check_seeds(seeds, "--seeds") if seeds is not None else check_seeds(raw.get("seeds"), f"{path}: seeds")
    splits = check_splits(splits, "--splits") if splits is not None else check_splits(raw.get("splits"), f"{path}: splits")
    baseline = _baseline(baseline if baseline is not None else raw.get("baseline"), variants,
                         "--baseline" if baseline is not None else f"{path}: baseline")
    if not seeds and not splits:
        return Sweep(path.stem, path, recipe, workdir, shared, variants, baseline_name=baseline, warnings=duplicates)
    runs = _replicas(path, workdir, shared, variants, seeds, splits or 1, recipes)
    return Sweep(path.stem, path, recipe, workdir, shared, runs, variants, tuple(seeds), splits or 1, baseline,
                 duplicates)


def _baseline(value: Any, variants: tuple[Variant, ...], where: str) -> str:
    """The name of the variant the p-values test against ("" when not given: the first)."""
    if value is None or value == "":
        return ""
    names = [v.name for v in variants]
    if not isinstance(value, str) or value not in names:
        raise ConfigError(f"{where}: {value!r} is not a variant of this sweep (variants: {', '.join(names)})")
    return value


def _duplicates(path: Path, variants: tuple[Variant, ...]) -> tuple[str, ...]:
    """One warning per variant with the settings of an earlier one (``train.lr: [1e-3, 0.001]``,
    which YAML reads as text and a number; a baseline inside a grid): they train the same model
    twice. A warning, not an error: a baseline plus a grid over its value is a common sweep, and
    sweep files written before this check still load."""
    seen: dict[str, str] = {}
    found = []
    for variant in variants:
        other = seen.setdefault(variant.training_key, variant.name)
        if other != variant.name:
            found.append(f"{path}: variants {other} and {variant.name} have the same settings and will train the "
                         f"same model (`seeds:` repeats a run with other seeds)")
    return tuple(found)


def _replicas(path: Path, workdir: Path, shared: tuple[str, ...], variants: tuple[Variant, ...], seeds: list[int],
              splits: int, recipes: dict) -> tuple[Variant, ...]:
    """One run per (split, seed, variant), in that order: after the first round every variant
    has a run to compare. Without ``seeds`` each variant keeps its recipe's train.seed."""
    replaced = (["train.seed"] if seeds else []) + ["data.split_seed"]
    for variant in variants:
        for item in [*shared, *variant.overrides]:
            if any(_overlap(item.split("=", 1)[0].strip(), key) for key in replaced):
                raise ConfigError(f"{path}: variant {variant.name} sets {item.split('=', 1)[0].strip()}, which "
                                  f"`seeds:` / `splits:` set for every run; leave it to them")
    runs = []
    for split in range(splits):
        for seed in seeds or [None]:
            for variant in variants:
                run_seed = variant.config.train.seed if seed is None else seed
                replica = ((f"train.seed={run_seed}",) if seed is not None else ()) + (f"data.split_seed={split}",)
                name = f"{variant.name},seed={run_seed},split={split}"
                _check_names(path, [name])
                config = _variant_config(path, variant.recipe, workdir, name, shared, [*variant.overrides, *replica],
                                         recipes)
                runs.append(Variant(name, variant.recipe, variant.overrides, config, variant.name, run_seed, split,
                                    replica))
    return tuple(runs)


def _read_yaml(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise ConfigError(f"sweep file not found: {path}")
    try:
        raw = safe_yaml(read_regular(path, MAX_RECIPE_BYTES, ConfigError, "sweep file").decode("utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not a valid YAML sweep file ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a sweep file must be a mapping (recipe, variants, ...)")
    try:  # str keys and plain values only (no YAML dates, no numbers as keys), as in recipes
        return plain_copy(raw, "sweep")
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _recipe_path(sweep_path: Path, value: Any, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: `recipe:` must name a recipe (a path relative to the sweep file)")
    recipe = Path(os.path.normpath(sweep_path.parent / value))  # recipes/x.yaml, not recipes/sweeps/../x.yaml
    if not recipe.is_file():
        raise ConfigError(f"{where}: recipe not found: {recipe}")
    return recipe


def _override_items(value: Any, where: str) -> list[str]:
    """A mapping {dotted.key: value} or a list of ``key=value`` strings -> ``key=value`` strings,
    one per setting: a nested mapping ({model: {pre_norm: true}}, or ``model={pre_norm: true}``)
    becomes a dotted key per value of a section (model.pre_norm=true), so it sets those keys of
    the section, as on the command line, and the checks below see every key it sets."""
    if value is None:
        return []
    if isinstance(value, dict):
        items = [f"{key}={_text(leaf)}" for name, item in value.items() for key, leaf in _flat(str(name), item)]
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        items = []
        for item in value:
            key, text = item.split("=", 1) if "=" in item else (item, None)
            try:
                parsed = parse_value(text) if text is not None else None
            except ConfigError as err:  # a number of thousands of digits, say
                raise ConfigError(f"{where}: {key.strip()}: {err}") from None
            if isinstance(parsed, dict) and parsed:
                items += [f"{dotted}={_text(leaf)}" for dotted, leaf in _flat(key.strip(), parsed)]
            else:
                items.append(item)
    else:
        raise ConfigError(f"{where}: expected a mapping of dotted keys or a list of key=value, got {value!r}")
    keys: list[str] = []
    for item in items:
        key = item.split("=", 1)[0].strip()
        if "=" not in item or not key:
            raise ConfigError(f"{where}: {item!r} is not of the form key=value (e.g. train.lr=0.002)")
        if key in RESERVED_OVERRIDES:
            raise ConfigError(f"{where}: {key} cannot be overridden: the sweep names and places every variant")
        twice = next((other for other in keys if _overlap(key, other)), None)
        if twice is not None:  # the last would win, silently
            raise ConfigError(f"{where}: {key} is set twice" + (f" (also by {twice})" if twice != key else ""))
        keys.append(key)
    return items


def _flat(key: str, value: Any) -> list[tuple[str, Any]]:
    """(dotted key, value) of each leaf of a nested mapping: {model: {pre_norm: true}} ->
    [("model.pre_norm", True)]. Only a section is opened: a mapping for a dict-valued field
    ({data: {files: {...}}}) is one leaf that replaces the recipe's, as on the command line
    (set key by key, it would keep the recipe's other languages and splits); so is an empty one."""
    if isinstance(value, dict) and value and is_section(key.split(".")):
        return [pair for name, item in value.items() for pair in _flat(f"{key}.{name}", item)]
    return [(key, value)]


def _overlap(key: str, other: str) -> bool:
    """Whether two dotted keys set the same setting: equal, or one a section of the other."""
    return key == other or key.startswith(other + ".") or other.startswith(key + ".")


def _text(value: Any) -> str:
    """A value as override text that parses back to the same value: a string as it is when YAML
    reads it back unchanged, anything else as JSON (which YAML reads)."""
    import yaml

    if isinstance(value, str):
        try:  # read back as the override will be (recipe_text's rules: a huge number is refused there)
            if safe_yaml(value) == value:
                return value
        except (yaml.YAMLError, ConfigError):
            pass
    return json.dumps(value, ensure_ascii=False)


def _expand(entry: Any, where: str) -> list[tuple[str, Any, list[str]]]:
    """One sweep entry -> [(variant name, its own recipe or None, its override items)]; a grid
    gives every combination."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping with name, overrides and/or grid, got {entry!r}")
    unknown = sorted(set(entry) - set(VARIANT_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]}; valid keys: {', '.join(VARIANT_KEYS)}")
    name = entry.get("name")
    if name is not None and not isinstance(name, str):
        name = str(name)
    where = f"{where.rsplit(':', 1)[0]}: variant {name}" if name else where
    if "recipe" in entry and (not isinstance(entry["recipe"], str) or not entry["recipe"].strip()):
        raise ConfigError(f"{where}: recipe must name a recipe file (a path relative to the sweep file), got "
                          f"{entry['recipe']!r} (leave the key out for the sweep's recipe)")
    items = _override_items(entry.get("overrides"), where)
    grid = entry.get("grid")
    if grid is None:
        if not name:
            raise ConfigError(f"{where}: a variant without a grid needs a name")
        return [(name, entry.get("recipe"), items)]
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"{where}: grid must be a mapping of dotted keys to lists of values")
    own = [item.split("=", 1)[0].strip() for item in items]
    for index, (key, values) in enumerate(grid.items()):
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: grid key {key} needs a non-empty list of values, got {values!r}")
        _override_items({key: values[0]}, where)
        both = next((other for other in [*own, *list(grid)[:index]] if _overlap(key, other)), None)
        if both is not None:  # the grid's value would win over the variant's own, silently
            raise ConfigError(f"{where}: {key} is set both by the grid and by {both}; set it in one place")
    combinations = math.prod(len(values) for values in grid.values())
    if combinations > MAX_VARIANTS:  # sized before a single combination is made
        raise ConfigError(f"{where}: the grid has {combinations:,} combinations, more than a sweep runs "
                          f"(at most {MAX_VARIANTS:,} variants); split it into smaller sweeps")
    labels = _grid_labels(list(grid))
    combos = []
    for values in itertools.product(*grid.values()):
        generated = ",".join(f"{label}={_name_text(value)}" for label, value in zip(labels, values))
        grid_items = _override_items(dict(zip(grid, values)), where)
        combos.append((f"{name},{generated}" if name else generated, entry.get("recipe"), items + grid_items))
    return combos


def _grid_labels(keys: list[str]) -> list[str]:
    """The last part of each dotted key, or the whole key where two last parts collide."""
    leaves = [key.rsplit(".", 1)[-1] for key in keys]
    return [leaf if leaves.count(leaf) == 1 else key for leaf, key in zip(leaves, keys)]


def _name_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "-".join(_name_text(item) for item in value)
    return _UNSAFE.sub("-", str(value))


def _check_names(path: Path, names: list[str]) -> None:
    seen = set()
    for name in names:
        if not VARIANT_NAME.fullmatch(name):
            shown = repr(name) if len(name) <= 130 else f"{name[:120]!r}... ({len(name):,} characters)"
            raise ConfigError(f"{path}: variant name {shown} must start with a letter or digit and hold only "
                              f"letters, digits and . _ = , + - (at most 120 characters)")
        if name in seen:
            raise ConfigError(f"{path}: two variants are named {name}")
        seen.add(name)


def _variant_config(path: Path, recipe: Path, workdir: Path, name: str, shared: tuple[str, ...],
                    items: list[str], recipes: dict) -> Config:
    """The config ``nmtkit run RECIPE SHARED ITEMS name=... workdir=...`` builds; ``recipes``
    caches each recipe file's tree (a grid of 1,000 variants reads its recipe once)."""
    try:
        if recipe not in recipes:
            recipes[recipe] = read_recipe(recipe)
        raw = copy.deepcopy(recipes[recipe])
        return from_dict(apply_overrides(raw, [*shared, *items, *_placement(path.stem, workdir, name)]))
    except ConfigError as err:
        raise ConfigError(f"{path}: variant {name}: {err}") from None


def run_command(sweep: Sweep, variant: Variant) -> list[str]:
    """The ``nmtkit run`` arguments that build this variant's config (also shown to the user)."""
    return ["run", str(variant.recipe), *sweep.shared_overrides, *variant.overrides, *variant.replica,
            *_placement(sweep.name, sweep.workdir, variant.name)]


def _placement(sweep_name: str, workdir: Path, name: str) -> list[str]:
    return [f"name={_text(f'{sweep_name}-{name}')}", f"workdir={_text(str(variant_dir(workdir, name)))}"]
