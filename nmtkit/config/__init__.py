"""Typed experiment configuration: a YAML recipe plus dotted ``key=value`` overrides.

One recipe describes one experiment. ``schema.py`` holds a dataclass per section (what a
recipe may say, with defaults), ``loading.py`` turns recipe text into a ``Config`` (unknown
keys and wrongly typed values are ``ConfigError`` s naming the key and the valid choices)
and back, ``rules.py`` checks what types cannot (ranges, one data source, per-architecture
keys, cross-field rules). Everyone imports from here. Nothing heavy (no torch), so that
``nmtkit --help`` stays fast.
"""
from nmtkit.config.loading import (apply_overrides, decode_config_from_dict, from_dict, is_section, load_config,
                                   model_config_from_dict, parse_value, read_recipe, save_config)
from nmtkit.config.rules import NUMERIC_KEYS, estimated_parameters, validate
from nmtkit.config.schema import (ARCH_KEYS, DECODE_SETTINGS, PRESETS, CleanConfig, Config, CorpusConfig, DataConfig,
                                  DecodeConfig, EvalConfig, ModelConfig, SourceConfig, TrainConfig,
                                  VocabConfig)

__all__ = ["ARCH_KEYS", "DECODE_SETTINGS", "NUMERIC_KEYS", "PRESETS", "CleanConfig", "Config", "CorpusConfig",
           "DataConfig", "DecodeConfig", "EvalConfig", "ModelConfig", "SourceConfig", "TrainConfig", "VocabConfig",
           "apply_overrides", "decode_config_from_dict", "estimated_parameters", "from_dict", "is_section",
           "load_config", "model_config_from_dict", "parse_value", "read_recipe", "save_config", "validate"]
