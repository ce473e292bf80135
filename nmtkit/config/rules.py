"""The rules a recipe must meet beyond its types: every number in its range, one data source
(or named, tagged corpora) and only its keys, no model key of the other architecture, and the
cross-field checks a dataclass cannot express (heads divide d_model, a joint vocab for full
tying, a sane size)."""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterator, Optional

from nmtkit.config.schema import (ARCH_KEYS, PRESETS, SCORE_METRICS, SPM_TRAINING_KEYS, Config, DataConfig,
                                  EvalConfig, ModelConfig, SourceConfig, VocabConfig, field_types, section_type)
from nmtkit.errors import ConfigError
from nmtkit.limits import DEVICE_NAME, MAX_PARAMETERS, check_range

_SOURCE_KEYS = {"files": ("files",), "hf": ("hf_name", "hf_config", "hf_revision", "hf_splits"),
                "sword": ("sword_src", "sword_tgt", "sword_path", "sword_testament", "dev_size", "test_size")}


def _numeric_keys(cls: type, prefix: str) -> list[str]:
    """Dotted names of every int and float field under dataclass ``cls``."""
    keys, hints = [], field_types(cls)
    for f in dataclasses.fields(cls):
        section = hints[f.name] if dataclasses.is_dataclass(hints[f.name]) else section_type(hints[f.name])
        if section is not None:  # a list of sections shares one rule per key: data.corpora.weight
            keys += _numeric_keys(section, f"{prefix}{f.name}.")
        elif hints[f.name] in (int, float):
            keys.append(f"{prefix}{f.name}")
    return keys


NUMERIC_KEYS = _numeric_keys(Config, "")


def check_ranges(section: Any, prefix: str = "") -> None:
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


def _foreign_key(section: Any, owners: dict[str, tuple[str, ...]], chosen: str) -> Optional[tuple[str, str]]:
    """(owner, key) of the first key that belongs to another choice than ``chosen`` (another
    architecture, another data source) and is set away from its default, else None. Keys left at
    their defaults pass, so a saved config (which lists every key) loads again."""
    defaults = type(section)()
    for owner, keys in owners.items():
        for key in keys:
            if owner != chosen and getattr(section, key) != getattr(defaults, key):
                return owner, key
    return None


def _check_arch_keys(model: ModelConfig) -> None:
    """A key of the other architecture would be silently ignored: name where it belongs."""
    foreign = _foreign_key(model, ARCH_KEYS, model.arch)
    if foreign is not None:
        arch, key = foreign
        raise ConfigError(f"model.{key} is a setting of model.arch={arch}, but this model is "
                          f"model.arch={model.arch}; remove it (or set model.arch: {arch})")


# (key, when another setting leaves it unread, why): a value away from its default there changes nothing.
# Warned of, not refused: a sweep or an override that switches the other setting (train.schedule=constant
# over a recipe's warmup) would otherwise have to reset the key to its default by hand
_INERT_KEYS = (
    ("train.warmup", lambda c: c.train.schedule == "constant", "train.schedule is constant (no warm-up)"),
    ("train.dev_bleu_beam", lambda c: c.train.best_metric != "bleu", "train.best_metric is not bleu (no dev BLEU)"),
    ("train.dev_bleu_max_sentences", lambda c: c.train.best_metric != "bleu",
     "train.best_metric is not bleu (no dev BLEU)"),
    ("train.subword_nbest", lambda c: c.train.subword_alpha == 0, "train.subword_alpha is 0 (no subword sampling)"),
    *((f"model.{key}", lambda c: c.model.moe_experts == 0, "model.moe_experts is 0 (no MoE layers)")
      for key in ("moe_top_k", "moe_every", "moe_aux_weight", "moe_z_weight", "moe_capacity_factor")),
    ("model.sinusoid_layout", lambda c: c.model.positions != "sinusoidal",
     "model.positions is not sinusoidal (no sinusoid table)"),
    ("model.merge", lambda c: not c.model.bidirectional, "model.bidirectional is false (one direction to merge)"),
)


def unread_settings(cfg: Config) -> list[str]:
    """One line per key that another setting leaves unread, set away from its default (``train``
    prints them as warnings)."""
    found = []
    for key, unread, because in _INERT_KEYS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value != getattr(type(getattr(cfg, section))(), name) and unread(cfg):
            found.append(f"{key} ({value!r}) is not read: {because}")
    return found


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
    foreign = _foreign_key(source, _SOURCE_KEYS, source.source)
    if foreign is not None:
        owner, key = foreign
        raise ConfigError(f"{prefix}{key} belongs to {prefix}source={owner}, but {prefix}source is {source.source}")
    splits = source.hf_splits
    if source.source == "hf" and (not isinstance(splits, dict) or not set(splits) <= {"train", "dev", "test"}
                                  or not all(isinstance(name, str) for name in splits.values())):
        raise ConfigError(f"{prefix}hf_splits must map train, dev and test to split names of the dataset "
                          f"(e.g. {{train: train, dev: validation, test: test}}), got {splits!r}")


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
    for key in ("character_coverage", "input_sentence_size", "input_bytes", *SPM_TRAINING_KEYS):
        if vocab.from_ and getattr(vocab, key) != getattr(defaults, key):
            raise ConfigError(f"vocab.{key} applies when SentencePiece is trained, but vocab.from reuses "
                              f"the model(s) of {vocab.from_}; remove it")


def _check_eval(evaluation: EvalConfig) -> None:
    """eval.metrics names known metrics; comet needs its model directory (checked when it scores),
    and its settings need comet: set without it, they would be read by nothing."""
    names = evaluation.metric_names()
    unknown = [name for name in names if name not in SCORE_METRICS]
    if unknown:
        raise ConfigError(f"eval.metrics: unknown metric {unknown[0]!r} (choose from {', '.join(SCORE_METRICS)})")
    if "comet" in names and not evaluation.comet_model:
        raise ConfigError("eval.metrics names comet but eval.comet_model is empty: give a local COMET model "
                          "directory (docs/languages.md says how to fetch one)")
    if evaluation.comet_model and "comet" not in names:
        raise ConfigError("eval.comet_model is set but eval.metrics does not name comet: add it, or remove the model")
    if evaluation.comet_batch_size != EvalConfig.comet_batch_size and "comet" not in names:
        raise ConfigError(f"eval.comet_batch_size is {evaluation.comet_batch_size} but eval.metrics does not name "
                          "comet: add it, or remove the key")


def estimated_parameters(cfg: Config) -> int:
    """An upper estimate of the weights (plus position table) the model would allocate, from
    the config alone: refusing an absurd size here beats an allocation traceback later."""
    m, vocab = cfg.model, cfg.vocab.size
    if m.arch == "transformer":
        d, ffn = m.d_model, m.ffn_dim
        ffn *= max(m.moe_experts, 1)  # every layer counted as MoE: an upper estimate
        attention = 2 * d * d + 2 * d * max(d, m.heads * m.key_dim)  # v and output + q and k
        layers = m.encoder_layers * (attention + 3 * d * ffn) + m.decoder_layers * (2 * attention + 3 * d * ffn)
        return 3 * vocab * d + layers + m.max_positions * d
    e, h = m.embed_dim, m.hidden_dim
    return 3 * vocab * max(e, h) + (m.encoder_layers + m.decoder_layers) * 8 * (e + 3 * h) * 2 * h


def validate(cfg: Config) -> Config:
    """Cross-field checks that a dataclass type cannot express."""
    if not cfg.name.strip():  # `name:` with nothing would put the work directory at data/ itself
        raise ConfigError("name is empty: name the experiment (its work directory is data/<name> unless "
                          "workdir says otherwise)")
    m = cfg.model
    if m.preset:
        if m.preset not in PRESETS:
            raise ConfigError(f"model.preset: {m.preset!r} is not one of {', '.join(PRESETS)}")
    _check_data(cfg.data)
    check_ranges(cfg)
    _check_betas(cfg)
    _check_arch_keys(m)
    if not DEVICE_NAME.fullmatch(cfg.train.device):
        raise ConfigError(f"train.device: {cfg.train.device!r} is not one of auto, cpu, cuda, cuda:N")
    if m.arch == "transformer" and m.d_model % m.heads:
        raise ConfigError(f"model.d_model ({m.d_model}) must be divisible by model.heads ({m.heads})")
    _check_subword_sampling(cfg)
    _check_reused_vocab(cfg.vocab)
    _check_eval(cfg.eval)
    if m.moe_experts and not 1 <= m.moe_top_k <= m.moe_experts:
        raise ConfigError(f"model.moe_top_k must be between 1 and model.moe_experts ({m.moe_experts}), "
                          f"got {m.moe_top_k}")
    if m.arch == "transformer" and m.positions == "rope" and m.key_size % 2:
        size = f"model.key_dim ({m.key_dim})" if m.key_dim else f"d_model / heads ({m.d_model // m.heads})"
        raise ConfigError(f"model.positions=rope rotates pairs of dimensions: {size} must be even")
    if m.tie_embeddings == "all" and not cfg.vocab.joint and not cfg.vocab.from_:  # vocab.from: checked by prepare
        raise ConfigError("model.tie_embeddings=all needs vocab.joint=true (use 'decoder' or 'none')")
    if estimated_parameters(cfg) > MAX_PARAMETERS:
        raise ConfigError(f"the model would have about {estimated_parameters(cfg):.2g} parameters "
                          f"(more than {MAX_PARAMETERS:.0e}): check model dimensions, layers and vocab.size")
    return cfg
