"""What a translation run is asked for: the recipe's decode settings (``DecodeConfig``, the one
place their defaults live) plus what only a translate call chooses (device, output format,
sampling, engine). No torch here, so the CLI can take its defaults from these dataclasses.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nmtkit.config import DecodeConfig
from nmtkit.errors import ConfigError

ENGINES = ("auto", "torch", "ctranslate2")


@dataclass
class TranslateOptions(DecodeConfig):
    """``DecodeConfig`` (beam_size, lenpen, max_len_a/b, min_len, batch_tokens, nbest; nbest > 1
    writes exactly nbest "index \\t score \\t text" lines per input line, best first) plus the
    settings below."""

    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bf16 | fp16 | int8 (CPU: Linear layers quantised dynamically)
    scores: bool = False  # prefix "score \t"
    alignments: bool = False  # append "\t i-j ..." (source piece i, target piece j)
    sample: bool = False  # sample instead of beam search
    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0
    seed: int = 1
    errors: str = "strict"  # invalid UTF-8: strict (error) | replace
    engine: str = "auto"  # auto (from the model directory) | torch | ctranslate2
    compile: bool = False  # torch.compile the decoder step (torch engine)

    @classmethod
    def from_decode(cls, decode: DecodeConfig, **settings) -> "TranslateOptions":
        """A recipe's decode section with ``settings`` (device, a different beam, ...) on top."""
        return cls(**{**dataclasses.asdict(decode), **settings})

    def validate(self) -> None:
        """Raise ConfigError for settings a user can get wrong."""
        problems = []
        if self.engine not in ENGINES:
            problems.append(f"--engine must be auto, torch or ctranslate2, not {self.engine!r}")
        if self.compile and self.engine == "ctranslate2":
            problems.append("--compile applies to the torch engine only")
        if self.errors not in ("strict", "replace"):
            problems.append(f"--errors must be strict or replace, not {self.errors!r}")
        if self.dtype not in ("auto", "float32", "bf16", "fp16", "int8"):
            problems.append(f"--dtype must be auto, float32, bf16, fp16 or int8, not {self.dtype!r}")
        if self.beam_size < 1 or self.nbest < 1 or self.batch_tokens < 1:
            problems.append("--beam-size, --nbest and --batch-tokens must be at least 1")
        if not self.sample and self.nbest > self.beam_size:
            problems.append(f"--nbest {self.nbest} needs --beam-size >= {self.nbest}")
        if self.min_len < 0 or self.max_len_b < 0 or self.max_len_a < 0:
            problems.append("--min-len, --max-len-a and --max-len-b must not be negative")
        if self.sample and (self.temperature <= 0 or not 0 < self.topp <= 1 or self.topk < 0):
            problems.append("sampling needs --temperature > 0, 0 < --topp <= 1 and --topk >= 0")
        if problems:
            raise ConfigError("; ".join(problems))
