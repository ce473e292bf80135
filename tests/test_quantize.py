"""translate --dtype int8: dynamically quantised Linear layers on CPU."""
from __future__ import annotations

import pytest

from conftest import reversal_pairs, train_tiny
from nmtkit.decoding.translate import TranslateOptions, translate_lines
from nmtkit.errors import ConfigError
from support.cli import run_cli


def test_int8_keeps_lines_and_mostly_agrees_with_float32(reversal_spm, tmp_path):
    from nmtkit.modeldir import load_model_dir

    model_dir = train_tiny(reversal_spm, tmp_path / "model")
    lines = [s for s, _ in reversal_pairs(30, 7, length=6)]
    lines[4] = ""
    common = dict(beam_size=2, device="cpu", max_len_b=20)
    ours = translate_lines([load_model_dir(model_dir)], lines, TranslateOptions(dtype="float32", **common))
    int8 = translate_lines([load_model_dir(model_dir)], lines, TranslateOptions(dtype="int8", **common))
    assert len(int8) == len(lines) and int8[4] == ""
    assert sum(a == b for a, b in zip(ours, int8)) >= 0.8 * len(lines)


def test_int8_is_cpu_only_and_named_in_errors(reversal_spm, tmp_path):
    with pytest.raises(ConfigError, match="int8"):
        TranslateOptions(dtype="int4").validate()
    done = run_cli("translate", "-m", str(tmp_path / "none"), "--dtype", "int8", "--device", "cuda", input="a\n")
    assert done.returncode == 2 and done.stderr.decode().count("\n") == 1
