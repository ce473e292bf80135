"""A model directory carries its recipe's decode settings: `translate` uses them unless a flag
says otherwise, `info` shows them, `average` defaults to the run's train.average_last; and
every numeric translate option is checked where it enters (one line, exit 2)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import reversal_pairs, tiny_recipe, train_tiny, write_prepared
from nmtkit.config import DecodeConfig, from_dict
from support.cli import assert_error, cli, cli_in_process, cli_stdout

SAVED = {"beam_size": 2, "lenpen": 0.0, "max_len_a": 0.0, "max_len_b": 2, "min_len": 1, "batch_tokens": 500,
         "eos_at_limit": "free"}


@pytest.fixture(scope="module")
def models(tmp_path_factory, reversal_spm) -> dict[str, Path]:
    """The same weights saved twice: as older nmtkit did (no decode settings) and with SAVED."""
    from nmtkit.modeldir import load_model_dir, save_model_dir

    root = tmp_path_factory.mktemp("decode")
    old = train_tiny(reversal_spm, root / "old", steps=60)
    loaded = load_model_dir(old)
    new = save_model_dir(loaded.model, loaded.model_cfg, root / "new", reversal_spm, reversal_spm, {"decode": SAVED})
    text = root / "in.txt"
    text.write_text("".join(src + "\n" for src, _ in reversal_pairs(6, 5, length=6)))
    return {"old": old, "new": new, "input": text}


def run_translate(monkeypatch, capsys, model: Path, text: Path, *flags: str) -> list[str]:
    return cli_stdout(monkeypatch, capsys, "-q", "translate", "-m", str(model), "-i", str(text), *flags).splitlines()


def flags_for(decode: dict) -> list[str]:
    return [part for name, value in decode.items() for part in (f"--{name.replace('_', '-')}", str(value))]


def test_translate_uses_the_saved_settings_unless_a_flag_overrides(models, monkeypatch, capsys):
    saved = run_translate(monkeypatch, capsys, models["new"], models["input"])
    assert saved == run_translate(monkeypatch, capsys, models["new"], models["input"], *flags_for(SAVED))
    defaults = DecodeConfig().__dict__
    explicit = run_translate(monkeypatch, capsys, models["new"], models["input"], *flags_for(defaults))
    assert explicit == run_translate(monkeypatch, capsys, models["old"], models["input"])  # older dirs: defaults
    assert all(len(line.split()) <= 2 for line in saved)  # max_len_a 0, max_len_b 2
    assert saved != explicit
    one_flag = run_translate(monkeypatch, capsys, models["new"], models["input"], "--max-len-b", "50",
                             "--max-len-a", "1")  # the rest stays as saved (beam 2, lenpen 0)
    assert one_flag == run_translate(monkeypatch, capsys, models["old"], models["input"],
                                     *flags_for({**SAVED, "max_len_b": 50, "max_len_a": 1.0}))


def test_info_shows_the_decode_settings(models, monkeypatch, capsys):
    from nmtkit.card import model_card

    assert model_card(models["new"])["decode"] == {**SAVED, "from": "recipe"}
    assert model_card(models["old"])["decode"] == {**DecodeConfig().__dict__, "from": "defaults"}
    monkeypatch.setenv("COLUMNS", "300")  # one table row, one line
    assert "beam 2, lenpen 0.0, length <= 0.0 x source + 2, min 1, EOS at the limit free, 500 tokens a batch (from the recipe)" in \
        cli_stdout(monkeypatch, capsys, "info", str(models["new"]))


def test_bad_saved_settings_are_one_line(models, tmp_path, monkeypatch, capsys):
    from nmtkit.modeldir import load_model_dir, save_model_dir

    loaded = load_model_dir(models["old"])
    spm = models["old"] / loaded.meta["spm"]["src"]
    bad = save_model_dir(loaded.model, loaded.model_cfg, tmp_path / "bad", spm, spm, {"decode": {"beam_size": 0}})
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(bad), "-i", str(models["input"]))
    assert_error(code, err, 2, "bad decode settings (decode.beam_size must be in [1, 1000], got 0)")


def test_training_saves_the_recipe_decode_and_average_follows_average_last(tmp_path, monkeypatch, capsys):
    from nmtkit.runtime.console import get_console
    from nmtkit.training.trainer import train
    from nmtkit.translate_files import saved_decode_settings as decode_settings_of

    write_prepared(tmp_path, reversal_pairs(60, 0, length=5), reversal_pairs(8, 1, length=5))
    decode = {"beam_size": 3, "lenpen": 1.0, "max_len_a": 1.5, "max_len_b": 9, "min_len": 2, "batch_tokens": 800,
              "eos_at_limit": "scored"}
    cfg = from_dict(tiny_recipe(tmp_path, model={"d_model": 16, "ffn_dim": 32, "encoder_layers": 1,
                                                 "decoder_layers": 1},
                                train={"max_steps": 6, "save_every": 2, "validate_every": 3, "max_tokens": 200,
                                       "average_last": 2, "keep_last": 5},
                                decode=decode))
    run_dir = train(cfg, get_console(-1))
    for model_dir in (run_dir / "best", *sorted((run_dir / "checkpoints").iterdir())):
        assert decode_settings_of(model_dir).__dict__ == decode
    code, err = cli(monkeypatch, capsys, "-q", "average", str(run_dir))
    assert code == 0, err
    meta = json.loads((run_dir / "averaged" / "config.json").read_text())
    assert meta["averaged_from"] == ["step_00000004", "step_00000006"] and meta["decode"] == decode
    code, err = cli(monkeypatch, capsys, "-q", "average", str(run_dir), "--last", "3", "-o", str(tmp_path / "three"))
    assert code == 0 and len(json.loads((tmp_path / "three" / "config.json").read_text())["averaged_from"]) == 3


def test_an_export_keeps_the_decode_settings(models, tmp_path):
    pytest.importorskip("ctranslate2")
    from nmtkit.ctranslate2.export import export_ctranslate2
    from nmtkit.translate_files import saved_decode_settings as decode_settings_of

    out = export_ctranslate2(models["new"], tmp_path / "model.ct2", None)
    assert decode_settings_of(out).__dict__ == SAVED


# --- numeric options ---------------------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--sample", "--temperature", "inf"], "--temperature must be a finite number, got inf"),
    (["--max-len-b", str(10**11)], "--max-len-b must be in [0, 10000], got 100000000000"),
    (["--max-len-a", "nan"], "--max-len-a must be a finite number, got nan"),
    (["--lenpen", "nan", "--scores"], "--lenpen must be a finite number, got nan"),
    (["--sample", "--seed", str(2**64)], "--seed must be in [0, 2**63-1], got 18446744073709551616"),
    (["--beam-size", "0"], "--beam-size must be in [1, 1000], got 0"),
    (["--topp", "0", "--sample"], "--topp must be in (0, 1], got 0.0"),
    (["--device", "xla"], "unknown device 'xla' (use auto, cpu, cuda or cuda:N)"),
    (["--device", "meta"], "unknown device 'meta' (use auto, cpu, cuda or cuda:N)"),
])
def test_bad_numbers_are_refused_before_translating(models, monkeypatch, capsys, flags, message):
    code, err = cli(monkeypatch, capsys, "translate", "-m", str(models["new"]), "-i", str(models["input"]), *flags)
    assert_error(code, err, 2, message)


GREEDY_UNUSED = ("changes only the scores under greedy search (beam size 1), which only --scores prints: the "
                 "translations are those without it")
SAMPLED_UNUSED = ("changes only the scores under --sample, which only --scores prints and --nbest ranks by: the "
                  "translations are those without it")


def test_lenpen_and_eos_at_limit_that_would_change_nothing_are_warned_of(models, monkeypatch, capsys):
    """Greedy search and sampling choose the same pieces under any length penalty and EOS rule, so
    without --scores or --nbest (which show and rank by scores) --lenpen and --eos-at-limit change
    nothing: given on the command line there, each is one warning line and the run goes on with
    the translations it gives without the flag (a refusal broke ``for b in 1 4 8`` loops). The
    model's own settings are not flags (SAVED holds both): no warning for them."""
    greedy, sampled = GREEDY_UNUSED, SAMPLED_UNUSED
    for flags, plain, warnings in (
            (("-b", "1", "--lenpen", "2"), ("-b", "1"), ["--lenpen " + greedy]),
            (("-b", "1", "--eos-at-limit", "scored"), ("-b", "1"), ["--eos-at-limit " + greedy]),
            (("-b", "1", "--lenpen", "2", "--eos-at-limit", "scored"), ("-b", "1"),
             ["--lenpen " + greedy, "--eos-at-limit " + greedy]),
            (("--sample", "--seed", "3", "--lenpen", "2"), ("--sample", "--seed", "3"), ["--lenpen " + sampled]),
            (("--sample", "--seed", "3", "--eos-at-limit", "free"), ("--sample", "--seed", "3"),
             ["--eos-at-limit " + sampled])):
        code, out, err = cli_in_process(monkeypatch, capsys, "-q", "translate", "-m", str(models["new"]), "-i",
                                        str(models["input"]), *flags)
        assert code == 0 and err.splitlines() == [f"warning: {line}" for line in warnings], (flags, err)
        assert out.splitlines() == run_translate(monkeypatch, capsys, models["new"], models["input"], *plain), flags
    for flags in (("-b", "2", "--lenpen", "2"), ("--lenpen", "2"), ("-b", "1", "--lenpen", "2", "--scores"),
                  ("--sample", "--nbest", "2", "--eos-at-limit", "scored"), ("-b", "1")):
        code, out, err = cli_in_process(monkeypatch, capsys, "-q", "translate", "-m", str(models["new"]), "-i",
                                        str(models["input"]), *flags)
        assert code == 0 and err == "" and len(out.splitlines()) >= 6, (flags, err)


NUMERIC_FLAGS = ["--beam-size", "--lenpen", "--max-len-a", "--max-len-b", "--min-len", "--nbest", "--batch-tokens",
                 "--topk", "--topp", "--temperature", "--seed"]
TEXTS = (st.integers(min_value=-(2**70), max_value=2**70).map(str) | st.floats().map(str)
         | st.sampled_from(["nan", "inf", "-inf", "1e400", "0", "1", "2", "0.5", "-0", "", "x", "1_0", "0x10"]))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(flag=st.sampled_from(NUMERIC_FLAGS), text=TEXTS, sample=st.booleans())
def test_any_value_of_a_numeric_option_translates_or_is_one_line(models, monkeypatch, capsys, flag, text, sample):
    import sys

    from nmtkit.cli import main

    short = models["input"].with_name("one.txt")
    short.write_text("a b c\n\n")
    monkeypatch.setattr(sys, "argv", ["nmtkit", "-q", "translate", "-m", str(models["new"]), "-i", str(short),
                                      "--max-len-b", "3", *(["--sample"] if sample else []), f"{flag}={text}"])
    with pytest.raises(SystemExit) as stopped:
        main()
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    if stopped.value.code and "Invalid value for" in " ".join(captured.err.split()):
        assert stopped.value.code == 2 and "Usage:" in captured.err  # not a number: Typer's usage error
    elif stopped.value.code:
        assert_error(stopped.value.code, captured.err, 2)
    else:
        lines = len(captured.out.splitlines())  # one input line and one empty line
        nbest = int(float(text)) if flag == "--nbest" else 1  # an integral float such as 1.0 is taken
        warned = f"warning: --lenpen {SAMPLED_UNUSED}\n" if flag == "--lenpen" and sample else ""  # scores only
        assert captured.err == warned and (lines == 2 if flag != "--nbest" else lines in (nbest + 1, 2 * nbest))


AUTO_ON_CPU = "auto on CPU"  # training's auto there: bf16 with bf16 units, else float32


@pytest.mark.parametrize("dtype, decoded, on_cpu", [("auto", "auto", AUTO_ON_CPU), ("float32", "float32", torch.float32),
                                                   ("bf16", "bf16", torch.bfloat16), ("fp16", "auto", AUTO_ON_CPU)])
def test_run_translates_dev_and_test_in_the_training_dtype(dtype, decoded, on_cpu):
    """`run` scores the model in the precision it was trained and validated in: translate's
    ``auto`` is training's (bf16 on CPUs with bf16 units, float32 on others); a model trained
    under fp16 autocast on a CPU decodes there as auto does (fp16 itself is refused on a CPU)."""
    from nmtkit.config import from_dict
    from nmtkit.decoding.torch_engine import inference_dtype
    from nmtkit.pipeline import decode_options
    from nmtkit.runtime.device import cpu_has_fast_bf16

    if on_cpu == AUTO_ON_CPU:
        on_cpu = torch.bfloat16 if cpu_has_fast_bf16() else torch.float32

    options = decode_options(from_dict({"data": {"source": "files"}, "train": {"dtype": dtype, "device": "cpu"},
                                         "decode": {"beam_size": 3}}))
    assert (options.dtype, options.device, options.beam_size, options.nbest) == (decoded, "cpu", 3, 1)
    assert inference_dtype(options.dtype, torch.device("cpu")) == on_cpu


def test_search_settings_take_their_defaults_and_values_from_the_decode_options():
    """A search's settings have no defaults of their own: each is TranslateOptions' (hence
    DecodeConfig's), and ``of`` carries a call's values over, alignments as need_attn."""
    import dataclasses

    from nmtkit.decoding.options import SearchSettings, TranslateOptions

    call = TranslateOptions()
    for field in dataclasses.fields(SearchSettings):
        source = "alignments" if field.name == "need_attn" else field.name
        assert getattr(SearchSettings(), field.name) == getattr(call, source), field.name
    asked = TranslateOptions(beam_size=7, nbest=3, lenpen=0.2, max_len_a=2.0, max_len_b=9, min_len=2, alignments=True,
                             topk=5, topp=0.5, temperature=0.7, seed=11)
    assert SearchSettings.of(asked) == SearchSettings(7, 3, 0.2, 2.0, 9, 2, True, 5, 0.5, 0.7, 11)
    recipe = DecodeConfig(beam_size=2, lenpen=0.0, max_len_a=0.5, max_len_b=4, min_len=3)
    assert SearchSettings.of(recipe, need_attn=True) == SearchSettings(beam_size=2, lenpen=0.0, max_len_a=0.5,
                                                                      max_len_b=4, min_len=3, need_attn=True)
