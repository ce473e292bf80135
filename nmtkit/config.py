"""Typed experiment configuration: YAML recipe + dotted ``key=value`` overrides.

One recipe describes one experiment. Every section is a dataclass with defaults, so a
recipe only names what differs. Unknown keys and wrongly typed values are
``ConfigError`` s that name the key and the valid choices. This module imports nothing
heavy (no torch) so that ``nmtkit --help`` stays fast.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Optional

from nmtkit.errors import ConfigError
from nmtkit.limits import DEVICE_NAME, MAX_PARAMETERS, check_range
from nmtkit.recipe_text import plain_copy, safe_yaml


@dataclass
class CleanConfig:
    """Training-data filters; dev and test are never filtered."""

    max_len: int = 250  # drop pairs with more SentencePiece tokens than this on either side
    max_ratio: float = 3.0  # drop pairs whose token-length ratio exceeds this (0 disables)
    dedup: bool = True  # drop exact duplicate pairs


@dataclass
class SourceConfig:
    """One source of parallel data with its own keys: ``data`` itself, or one of ``data.corpora``."""

    # files | hf | sword: required, so a forgotten line cannot quietly train on another corpus;
    # each source's own keys below (files / hf_* / sword_*) are an error under another source
    source: str = ""
    src_lang: str = "en"
    tgt_lang: str = "es"
    # files: {split: {lang: path}} e.g. {"train": {"en": "a.en", "es": "a.es"}, ...}
    files: dict = field(default_factory=dict)
    # hf: a `datasets` dataset with a `translation` column
    hf_name: str = ""  # e.g. "wmt/wmt14" or a local directory (save_to_disk / parquet)
    hf_config: str = ""  # e.g. "de-en"
    hf_revision: str = ""  # pin the Hub revision for reproducibility
    hf_splits: dict = field(default_factory=lambda: {"train": "train", "dev": "validation", "test": "test"})
    max_train_pairs: int = 0  # keep only the first N training pairs (0: all)
    # sword: verse-aligned Bible modules installed under sword_path
    sword_src: str = "engWEB2015eb"
    sword_tgt: str = "spaRV1909eb"
    sword_path: str = "/usr/share/sword"
    # old: the books before Matthew; new: Matthew to Revelation (domain experiments); all: both
    sword_testament: Literal["all", "old", "new"] = "all"
    dev_size: int = 500
    test_size: int = 1000


@dataclass
class CorpusConfig(SourceConfig):
    """One training corpus of ``data.corpora``: a source (its keys as in ``data``), a weight and a tag."""

    src_lang: str = ""  # the languages of its source's files / hf columns (default: data's)
    tgt_lang: str = ""
    name: str = ""  # required: names the corpus in prepare's report and the manifest
    weight: float = 1.0  # pairs per epoch = round(weight x its cleaned pairs) (nmtkit/data/mixing.py)
    tag: str = ""  # prepended to each of its source sentences (e.g. <2es>, <bt>); reserved as one piece


@dataclass
class DataConfig(SourceConfig):
    # several training corpora instead of the one source above (whose keys then stay unset but
    # src_lang / tgt_lang, which name the prepared files); dev and test come from the first corpus
    corpora: list[CorpusConfig] = field(default_factory=list)
    clean: CleanConfig = field(default_factory=CleanConfig)

    def training_sources(self) -> list[CorpusConfig]:
        """The corpora with their languages filled in, or ``data`` itself as one untagged corpus."""
        if not self.corpora:
            own = {f.name: getattr(self, f.name) for f in dataclasses.fields(SourceConfig)}
            return [CorpusConfig(**own, name=self.source)]
        return [dataclasses.replace(c, src_lang=c.src_lang or self.src_lang, tgt_lang=c.tgt_lang or self.tgt_lang)
                for c in self.corpora]

    @property
    def tags(self) -> list[str]:
        """The corpora's tags, each once, in order (reserved as pieces of the SentencePiece model)."""
        return list(dict.fromkeys(c.tag for c in self.corpora if c.tag))


@dataclass
class VocabConfig:
    type: Literal["unigram", "bpe"] = "unigram"
    size: int = 8000
    joint: bool = True  # one shared model for both languages (enables full weight tying)
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000  # sample cap for SentencePiece training
    workers: int = 0  # encoding processes (0: one per CPU core)
    # reuse the SentencePiece model(s) of a model directory or a prepared directory instead of
    # training new ones (fine-tuning); type, size and joint must describe them (recipe key: vocab.from)
    from_: str = ""


@dataclass
class ModelConfig:
    arch: Literal["transformer", "rnn"] = "transformer"
    preset: str = ""  # "transformer-base" / "transformer-big" fill the dims below
    d_model: int = 512
    ffn_dim: int = 2048
    heads: int = 8
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    pre_norm: bool = False  # the paper is post-norm
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    ffn: Literal["relu", "gelu", "swiglu"] = "relu"
    # sinusoidal (the paper) | learned (a table of max_positions rows) | alibi | rope (no length limit)
    positions: Literal["sinusoidal", "learned", "alibi", "rope"] = "sinusoidal"
    # Mixture of Experts feed-forward layers (nmtkit/models/moe.py); 0 experts = dense layers
    moe_experts: int = 0  # experts per MoE layer
    moe_top_k: int = 2  # experts per token: 1 = Switch Transformer, 2 = GShard
    moe_every: int = 1  # every n-th layer of each stack is MoE (1: all; GShard: 2)
    moe_aux_weight: float = 0.01  # weight of the load-balancing loss (1 at uniform routing), per MoE layer
    moe_z_weight: float = 0.0  # weight of the router z-loss (ST-MoE: 0.001); 0 disables
    moe_capacity_factor: float = 0.0  # training only: expert capacity = factor * tokens * k / experts (0: dropless)
    tie_embeddings: Literal["all", "decoder", "none"] = "all"  # "all" needs a joint vocab
    max_positions: int = 1024
    # rnn only
    cell: Literal["lstm", "gru", "rnn"] = "lstm"
    embed_dim: int = 256
    hidden_dim: int = 512
    bidirectional: bool = True
    merge: Literal["concat", "sum"] = "concat"  # how the two encoder directions combine
    attention: Literal["bahdanau", "luong-dot", "luong-general", "none"] = "bahdanau"
    input_feed: bool = True

    @property
    def width(self) -> int:
        """The model dimension (the noam schedule scales its rate by width ** -0.5)."""
        return self.d_model if self.arch == "transformer" else self.hidden_dim


# the model keys only one architecture reads; every other key is shared (tests/test_config_arch.py)
ARCH_KEYS: dict[str, tuple[str, ...]] = {
    "transformer": ("preset", "d_model", "ffn_dim", "heads", "attention_dropout", "activation_dropout", "pre_norm",
                    "norm", "ffn", "max_positions", "positions", "moe_experts", "moe_top_k", "moe_every",
                    "moe_aux_weight", "moe_z_weight", "moe_capacity_factor"),
    "rnn": ("cell", "embed_dim", "hidden_dim", "bidirectional", "merge", "attention", "input_feed"),
}


def _check_arch_keys(model: ModelConfig) -> None:
    """A key of the other architecture would be silently ignored: name where it belongs. Keys left
    at their defaults pass, so a saved config (which lists every key) loads again."""
    defaults = ModelConfig()
    for arch, keys in ARCH_KEYS.items():
        for key in keys:
            if arch != model.arch and getattr(model, key) != getattr(defaults, key):
                raise ConfigError(f"model.{key} is a setting of model.arch={arch}, but this model is "
                                  f"model.arch={model.arch}; remove it (or set model.arch: {arch})")


@dataclass
class TrainConfig:
    max_tokens: int = 4096  # tokens (max of src, tgt) per batch, padding included
    update_freq: int = 1  # batches accumulated per optimizer step, per process (x GPUs under torchrun)
    # batches per optimizer step over ALL processes (0: off, use update_freq); each of N processes
    # takes batches_per_update / N of them (must divide), so the update is the same on 1, 8 or 64 GPUs
    batches_per_update: int = 0
    max_steps: int = 100_000
    max_epochs: int = 0  # 0: no epoch limit
    max_minutes: float = 0.0  # wall-clock budget (0: none); stops at the next step boundary
    # noam (the paper) | inverse_sqrt | constant | cosine / linear (warm-up, then decay to 0 at max_steps)
    schedule: Literal["noam", "inverse_sqrt", "constant", "cosine", "linear"] = "noam"
    lr: float = 1.0  # noam: multiplier of d_model^-0.5 ...; inverse_sqrt/constant: peak lr
    warmup: int = 4000
    betas: tuple = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    # subword regularisation: training sentences re-segmented every epoch by SentencePiece sampling,
    # seeded by (seed, epoch, sentence); dev and test keep their one segmentation. 0 turns it off.
    subword_alpha: float = 0.0  # unigram: sharpness of the sampling distribution (Kudo 2018: 0.1-0.5); bpe: dropout (0.1)
    subword_nbest: int = -1  # unigram: sample among the n best segmentations (-1: all of them)
    clip_norm: float = 0.0  # 0 disables
    ema_decay: float = 0.0  # 0 disables the exponential moving average of weights
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: Literal["auto", "float32", "bf16", "fp16"] = "auto"
    # torch.compile the model for training (TorchInductor; on CPU it needs a C++ compiler, else a
    # warning and uncompiled training); the first steps pay the compile time (benchmarks/compile_speed.py)
    compile: bool = False
    threads: int = 0  # CPU threads (0: auto, fewer when other processes keep cores busy at start)
    log_every: int = 50
    validate_every: int = 1000
    save_every: int = 1000
    keep_last: int = 5
    patience: int = 0  # validations without improvement before stopping (0: never)
    best_metric: Literal["bleu", "loss"] = "bleu"
    dev_bleu_beam: int = 1  # beam used for dev BLEU during training (1: greedy)
    dev_bleu_max_sentences: int = 500
    max_bad_steps: int = 5  # consecutive NaN/inf steps before giving up
    average_last: int = 5  # checkpoints averaged by `nmtkit run` (0/1: none)
    tensorboard: bool = False  # also write metrics as TensorBoard scalars to RUN_DIR/tensorboard (needs tensorboard)
    # fine-tuning: start from this model directory's weights (same architecture and vocabulary) with a
    # fresh optimizer, schedule and step counter; a resumed run continues from its own checkpoints
    init_from: str = ""


@dataclass
class DecodeConfig:
    beam_size: int = 4
    lenpen: float = 0.6  # GNMT alpha: score / ((5+|y|)/6)^alpha; 0 = raw log-prob
    max_len_a: float = 1.0
    max_len_b: int = 50  # output length limit = a * |x| + b
    min_len: int = 1
    batch_tokens: int = 6000


DECODE_SETTINGS = tuple(f.name for f in dataclasses.fields(DecodeConfig))


@dataclass
class Config:
    name: str = "experiment"
    workdir: str = ""  # default: data/<name>
    data: DataConfig = field(default_factory=DataConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    @property
    def work_path(self) -> Path:
        return Path(self.workdir or f"data/{self.name}")

    def to_dict(self) -> dict:
        """The config as a plain tree under its recipe keys (``vocab.from``, not ``from_``)."""
        return _recipe_keys(dataclasses.asdict(self))


def recipe_key(field_name: str) -> str:
    """The recipe key of a config field: a Python keyword is spelt with a trailing underscore
    in the dataclass (``VocabConfig.from_`` is ``vocab.from``)."""
    return field_name[:-1] if field_name.endswith("_") else field_name


def _recipe_keys(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {recipe_key(key): _recipe_keys(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_recipe_keys(value) for value in tree]
    return tree


PRESETS: dict[str, dict[str, Any]] = {
    # Vaswani et al. 2017, Table 3
    "transformer-base": dict(d_model=512, ffn_dim=2048, heads=8, encoder_layers=6, decoder_layers=6, dropout=0.1),
    "transformer-big": dict(d_model=1024, ffn_dim=4096, heads=16, encoder_layers=6, decoder_layers=6, dropout=0.3),
}


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a config dataclass (resolving them is slow; they never change)."""
    return typing.get_type_hints(cls)


def _section_type(annotation: Any) -> Optional[type]:
    """The dataclass of a ``list[Section]`` field (data.corpora), else None."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list and args and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check/convert ``value`` to the field type, or raise a ConfigError naming ``key``."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        choices = typing.get_args(annotation)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, choices))}")
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
        try:
            return int(value)
        except ValueError:
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
    section = _section_type(annotation)
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
    hints = _hints(cls)
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
            kwargs[field_name] = _build(hint, value or {}, f"{prefix}{name}.")
        else:
            kwargs[field_name] = _coerce(value, hint, f"{prefix}{name}")
    return cls(**kwargs)


def _parse_scalar(text: str) -> Any:
    """Parse an override value the way YAML would (numbers, booleans, lists)."""
    import yaml

    try:
        return safe_yaml(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Set dotted ``a.b.c=value`` overrides in a nested dict (before type checking)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. train.max_steps=1000)")
        key, text = item.split("=", 1)
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key}: {part} is not a section")
        node[parts[-1]] = _parse_scalar(text)
    return raw


_SOURCE_KEYS = {"files": ("files",), "hf": ("hf_name", "hf_config", "hf_revision", "hf_splits"),
                "sword": ("sword_src", "sword_tgt", "sword_path", "sword_testament")}


def _numeric_keys(cls: type, prefix: str) -> list[str]:
    """Dotted names of every int and float field under dataclass ``cls``."""
    keys, hints = [], _hints(cls)
    for f in dataclasses.fields(cls):
        section = hints[f.name] if dataclasses.is_dataclass(hints[f.name]) else _section_type(hints[f.name])
        if section is not None:  # a list of sections shares one rule per key: data.corpora.weight
            keys += _numeric_keys(section, f"{prefix}{f.name}.")
        elif hints[f.name] in (int, float):
            keys.append(f"{prefix}{f.name}")
    return keys


NUMERIC_KEYS = _numeric_keys(Config, "")


def _check_ranges(section: Any, prefix: str = "") -> None:
    """Every number of ``section`` (the whole config, or the one named by ``prefix``, e.g.
    "decode.") against its rule in ``nmtkit.limits``, before a model is built or a step taken."""
    for key in NUMERIC_KEYS:
        if not key.startswith(prefix):
            continue
        for shown, value in _values(section, key[len(prefix):].split("."), prefix):
            check_range(key, value, shown)


def _values(node: Any, parts: list[str], shown: str) -> Iterator[tuple[str, Any]]:
    """(name, value) of the field at dotted ``parts`` under ``node``; through a list of sections,
    one per entry, named like data.corpora[1].weight."""
    child = getattr(node, parts[0])
    if isinstance(child, list):
        for i, entry in enumerate(child):
            yield from _values(entry, parts[1:], f"{shown}{parts[0]}[{i}].")
    elif len(parts) == 1:
        yield f"{shown}{parts[0]}", child
    else:
        yield from _values(child, parts[1:], f"{shown}{parts[0]}.")


def decode_config_from_dict(values: dict) -> DecodeConfig:
    """The decode settings saved with a model directory, checked by the rules of a recipe."""
    decode = _build(DecodeConfig, values, "decode.")
    _check_ranges(decode, "decode.")
    return decode


def _check_betas(cfg: Config) -> None:
    betas = cfg.train.betas
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"train.betas must be two numbers in [0, 1), got {list(betas)}")


def _check_subword_sampling(cfg: Config) -> None:
    t = cfg.train
    if t.subword_nbest in (0, 1) or t.subword_nbest < -1:  # SentencePiece does not sample with 0 or 1
        raise ConfigError(f"train.subword_nbest must be -1 (all segmentations) or at least 2, got {t.subword_nbest}")
    if cfg.vocab.type == "bpe":
        if t.subword_alpha >= 1:
            raise ConfigError(f"train.subword_alpha is the BPE-dropout probability with vocab.type=bpe: "
                              f"it must be below 1, got {t.subword_alpha}")
        if t.subword_nbest != -1:
            raise ConfigError("train.subword_nbest applies to vocab.type=unigram only (BPE-dropout has no n-best)")


def _check_source(source: SourceConfig, prefix: str = "data.") -> None:
    """A source must be named, and no key of another source may be set."""
    if source.source not in _SOURCE_KEYS:
        given = f"{source.source!r} is not one of" if source.source else "is missing; choose one of"
        raise ConfigError(f"{prefix}source {given} {', '.join(_SOURCE_KEYS)}")
    defaults = SourceConfig()
    for owner, keys in _SOURCE_KEYS.items():
        for key in keys:
            if owner != source.source and getattr(source, key) != getattr(defaults, key):
                raise ConfigError(f"{prefix}{key} belongs to {prefix}source={owner}, but {prefix}source is "
                                  f"{source.source}")


CORPUS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# a tag is one SentencePiece piece: no whitespace or comma, no "▁" (its space), not a special piece
CORPUS_TAG = re.compile(r"[^\s,\u2581]{1,32}")
SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")


def _check_data(data: DataConfig) -> None:
    """One source in ``data``, or named, tagged corpora in ``data.corpora`` and no source in ``data``."""
    if not data.corpora:
        _check_source(data)
        return
    defaults = SourceConfig()
    for f in dataclasses.fields(SourceConfig):
        if f.name not in ("src_lang", "tgt_lang") and getattr(data, f.name) != getattr(defaults, f.name):
            raise ConfigError(f"data.{f.name} is a key of one source, but data.corpora lists the sources; "
                              f"set it on a corpus (dev and test come from the first)")
    names = set()
    for i, corpus in enumerate(data.corpora):
        where = f"data.corpora[{i}]"
        if not CORPUS_NAME.fullmatch(corpus.name):
            raise ConfigError(f"{where}.name must be a name of letters, digits, '_', '.' or '-', got {corpus.name!r}")
        if corpus.name in names:
            raise ConfigError(f"{where}.name: two corpora are called {corpus.name!r}")
        names.add(corpus.name)
        _check_source(corpus, f"{where}.")
        if corpus.tag and (not CORPUS_TAG.fullmatch(corpus.tag) or corpus.tag in SPECIAL_PIECES):
            raise ConfigError(f"{where}.tag must be up to 32 characters without spaces or commas and not one of "
                              f"{', '.join(SPECIAL_PIECES)}, got {corpus.tag!r}")


def _check_reused_vocab(vocab: VocabConfig) -> None:
    """With vocab.from no SentencePiece model is trained: its training-only settings would be ignored."""
    defaults = VocabConfig()
    for key in ("character_coverage", "input_sentence_size"):
        if vocab.from_ and getattr(vocab, key) != getattr(defaults, key):
            raise ConfigError(f"vocab.{key} applies when SentencePiece is trained, but vocab.from reuses "
                              f"the model(s) of {vocab.from_}; remove it")


def estimated_parameters(cfg: Config) -> int:
    """An upper estimate of the weights (plus position table) the model would allocate, from
    the config alone: refusing an absurd size here beats an allocation traceback later."""
    m, vocab = cfg.model, cfg.vocab.size
    if m.arch == "transformer":
        d, ffn = m.d_model, m.ffn_dim
        ffn *= max(m.moe_experts, 1)  # every layer counted as MoE: an upper estimate
        layers = m.encoder_layers * (4 * d * d + 3 * d * ffn) + m.decoder_layers * (8 * d * d + 3 * d * ffn)
        return 3 * vocab * d + layers + m.max_positions * d
    e, h = m.embed_dim, m.hidden_dim
    return 3 * vocab * max(e, h) + (m.encoder_layers + m.decoder_layers) * 8 * (e + 3 * h) * 2 * h


def validate(cfg: Config) -> Config:
    """Cross-field checks that a dataclass type cannot express."""
    m = cfg.model
    if m.preset:
        if m.preset not in PRESETS:
            raise ConfigError(f"model.preset: {m.preset!r} is not one of {', '.join(PRESETS)}")
    _check_data(cfg.data)
    _check_ranges(cfg)
    _check_betas(cfg)
    _check_arch_keys(m)
    if not DEVICE_NAME.fullmatch(cfg.train.device):
        raise ConfigError(f"train.device: {cfg.train.device!r} is not one of auto, cpu, cuda, cuda:N")
    if m.arch == "transformer" and m.d_model % m.heads:
        raise ConfigError(f"model.d_model ({m.d_model}) must be divisible by model.heads ({m.heads})")
    _check_subword_sampling(cfg)
    _check_reused_vocab(cfg.vocab)
    if m.moe_experts and not 1 <= m.moe_top_k <= m.moe_experts:
        raise ConfigError(f"model.moe_top_k must be between 1 and model.moe_experts ({m.moe_experts}), "
                          f"got {m.moe_top_k}")
    if m.arch == "transformer" and m.positions == "rope" and (m.d_model // m.heads) % 2:
        raise ConfigError(f"model.positions=rope rotates pairs of dimensions: d_model / heads "
                          f"({m.d_model // m.heads}) must be even")
    if m.tie_embeddings == "all" and not cfg.vocab.joint:
        raise ConfigError("model.tie_embeddings=all needs vocab.joint=true (use 'decoder' or 'none')")
    if estimated_parameters(cfg) > MAX_PARAMETERS:
        raise ConfigError(f"the model would have about {estimated_parameters(cfg):.2g} parameters "
                          f"(more than {MAX_PARAMETERS:.0e}): check model dimensions, layers and vocab.size")
    return cfg


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


def load_config(path: str | Path | None, overrides: Optional[list[str]] = None) -> Config:
    """Load a YAML recipe (or defaults when ``path`` is None) and apply overrides."""
    import yaml

    raw: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"recipe not found: {path}")
        try:
            raw = safe_yaml(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path}: not a valid YAML recipe ({str(err).splitlines()[0]})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: a recipe must be a mapping of sections")
        raw.setdefault("name", path.stem)
    return from_dict(apply_overrides(raw, list(overrides or [])))


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    import yaml

    from nmtkit.files import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(_plain(cfg.to_dict()), sort_keys=False))


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj
