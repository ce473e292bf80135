"""The valid range of every number a recipe or a command-line option can set.

One table serves recipes and flags alike (``decode.beam_size`` and ``translate --beam-size``
share a rule), so the two cannot drift apart. The bounds are sanity limits, far past any real
experiment, yet low enough that a value cannot overflow a 64-bit integer, ask for terabytes
before a tensor exists, or turn into inf/nan arithmetic. Imports nothing heavy.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

from nmtkit.errors import ConfigError

DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d{1,4})?")  # the devices nmtkit runs on (no mps, meta, xla)
MAX_STEPS = 2**62  # step and epoch counters: far from int64 overflow in any arithmetic on them
MAX_SEED = 2**63 - 1  # torch's manual_seed and numpy's SeedSequence both take [0, 2**63 - 1]
MAX_DIM = 65_536  # a width (d_model, ffn, hidden) past this is a typo, not an experiment
MAX_PARAMETERS = 10**10  # ~40 GB of float32 weights before the optimizer's two copies


@dataclass(frozen=True)
class Bound:
    """A closed interval [low, high]; ``low_open`` / ``high_open`` exclude an end."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def problem(self, value) -> Optional[str]:
        """None when ``value`` is allowed, else what is wrong with it."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {value}"
        below = value <= self.low if self.low_open else value < self.low
        above = value >= self.high if self.high_open else value > self.high
        if below or above:
            return f"must be in {self.describe()}, got {value}"
        return None

    def describe(self) -> str:
        return f"{'(' if self.low_open else '['}{_number(self.low)}, {_number(self.high)}{')' if self.high_open else ']'}"


def _number(value: float) -> str:
    """1000, 10**9, 2**62, 2**63-1 or 0.5: short and unambiguous inside an interval."""
    if isinstance(value, int) and value >= 10**6:
        for base in (10, 2):
            power = round(math.log(value, base))
            if base**power == value:
                return f"{base}**{power}"
            if base**power - 1 == value:
                return f"{base}**{power}-1"
    return str(value) if isinstance(value, int) else f"{value:g}"


COUNT = Bound(1, MAX_STEPS)  # a positive count of steps, batches, sentences
OPTIONAL_COUNT = Bound(0, MAX_STEPS)  # the same where 0 means "off" / "all"
FRACTION = Bound(0, 1, high_open=True)
WIDTH = Bound(1, MAX_DIM)

RANGES: dict[str, Bound] = {
    "data.max_train_pairs": OPTIONAL_COUNT, "data.dev_size": OPTIONAL_COUNT, "data.test_size": OPTIONAL_COUNT,
    "data.corpora.max_train_pairs": OPTIONAL_COUNT, "data.corpora.dev_size": OPTIONAL_COUNT,
    "data.corpora.test_size": OPTIONAL_COUNT, "data.split_seed": Bound(0, 2**31 - 1),
    "data.corpora.weight": Bound(0, 1000, low_open=True),  # x its pairs per epoch: 0 would leave it out
    "data.clean.max_len": Bound(0, 1_000_000), "data.clean.max_ratio": Bound(0, 1000),
    "vocab.size": Bound(8, 1_000_000),  # the 4 specials plus a few pieces; SentencePiece's own ceiling is far above
    "vocab.character_coverage": Bound(0, 1, low_open=True),
    "vocab.input_sentence_size": Bound(0, 10**9), "vocab.input_bytes": Bound(0, 10**13), "vocab.workers": Bound(0, 1024),
    "model.d_model": WIDTH, "model.ffn_dim": Bound(1, 16 * MAX_DIM), "model.heads": Bound(1, 1024),
    "model.key_dim": Bound(0, MAX_DIM),
    "model.encoder_layers": Bound(1, 1000), "model.decoder_layers": Bound(1, 1000),
    "model.dropout": FRACTION, "model.attention_dropout": FRACTION, "model.activation_dropout": FRACTION,
    "model.max_positions": Bound(1, 1_000_000),
    "model.moe_experts": Bound(0, 1024), "model.moe_top_k": Bound(0, 1024), "model.moe_every": Bound(1, 1000),
    "model.moe_aux_weight": Bound(0, 100), "model.moe_z_weight": Bound(0, 100),
    "model.moe_capacity_factor": Bound(0, 1024), "model.embed_dim": WIDTH, "model.hidden_dim": WIDTH,
    "train.max_tokens": Bound(1, 10**9), "train.update_freq": Bound(1, 1_000_000),
    "train.batches_per_update": Bound(0, 1_000_000), "train.max_steps": COUNT, "train.max_epochs": OPTIONAL_COUNT,
    "train.max_minutes": Bound(0, 10**9), "train.max_flops": Bound(0, 1e30), "train.lr": Bound(0, 100, low_open=True), "train.warmup": OPTIONAL_COUNT,
    "train.eps": Bound(0, 1), "train.weight_decay": Bound(0, 10), "train.label_smoothing": FRACTION,
    "train.clip_norm": Bound(0, 10**9), "train.ema_decay": FRACTION, "train.seed": Bound(0, MAX_SEED),
    "train.log_every": COUNT, "train.validate_every": COUNT, "train.save_every": COUNT,
    "train.keep_last": Bound(0, 1_000_000), "train.patience": OPTIONAL_COUNT, "train.dev_bleu_beam": Bound(1, 1000),
    "train.dev_bleu_max_sentences": OPTIONAL_COUNT, "train.max_bad_steps": Bound(1, 1_000_000),
    "train.average_last": Bound(0, 1_000_000),
    "train.threads": Bound(0, 4096),
    "train.subword_alpha": Bound(0, 10), "train.subword_nbest": Bound(-1, 1_000_000),  # -1: all segmentations
    "decode.beam_size": Bound(1, 1000), "decode.lenpen": Bound(0, 10),
    # outputs are buffered as [sentences, beam, limit] ids: a limit past 10k pieces only allocates
    "decode.max_len_a": Bound(0, 100), "decode.max_len_b": Bound(0, 10_000), "decode.min_len": Bound(0, 10_000),
    "decode.batch_tokens": Bound(1, 10**9),
    "eval.comet_batch_size": Bound(1, 100_000),
    # translate options without a recipe key
    "translate.nbest": Bound(1, 1000), "translate.topk": Bound(0, 1_000_000),
    "translate.topp": Bound(0, 1, low_open=True),
    "translate.temperature": Bound(0.01, 100),  # below 0.01 logits / T overflow float32 (and it is greedy anyway)
    "translate.seed": Bound(0, MAX_SEED), "translate.chunk_lines": Bound(1, 10**8),
    "translate.max_source_len": Bound(0, 10**8), "translate.threads": Bound(0, 4096),
    "translate.workers": Bound(0, 4096),
    # other commands' options
    "score.resamples": Bound(1, 10**6),  # each resample scores the whole test set once
    "serve.port": Bound(0, 65_535), "serve.batch_window_ms": Bound(0, 60_000),
}
COMMAND_OPTIONS = ("translate.", "score.", "serve.")  # RANGES keys of options, not of recipe keys


def range_problem(key: str, value, shown: str = "") -> Optional[str]:
    """``"<shown> must be in [a, b], got v"`` when ``value`` breaks the rule for ``key``, else None."""
    problem = RANGES[key].problem(value)
    return f"{shown or key} {problem}" if problem else None


def check_range(key: str, value, shown: str = "") -> None:
    """Raise a one-line ConfigError when ``value`` is outside the range of ``key``."""
    problem = range_problem(key, value, shown)
    if problem:
        raise ConfigError(problem)
