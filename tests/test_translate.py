"""The translation front end on a tiny random Transformer: one line out per line in."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import options, save_tiny_model, tiny_sentences
from nmtkit.decoding.batching import token_batches
from nmtkit.decoding.translate import TranslateOptions, translate_lines
from nmtkit.errors import ConfigError, DataError, NmtkitError
from nmtkit.runtime.console import NmtConsole
from nmtkit.translate_files import translate_file
from support.cli import run_cli


def quiet_console() -> NmtConsole:
    return NmtConsole(verbosity=-1)


def test_token_batches_respect_budget_and_cover_everything():
    lengths = [5, 1, 9, 3, 3, 12, 0, 7]
    batches = token_batches(lengths, budget=20, rows_per_sentence=2)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or max(lengths[i] for i in batch) * len(batch) * 2 <= 20
    assert batches[0] == [5]  # longest first; over budget alone


def test_batch_composition_and_order_do_not_change_translations(loaded):
    lines = tiny_sentences(60, seed=5)
    reference = translate_lines(loaded, lines, options(batch_tokens=6000))
    for budget in (1, 37, 200):
        assert translate_lines(loaded, lines, options(batch_tokens=budget)) == reference
    reversed_out = translate_lines(loaded, lines[::-1], options(batch_tokens=50))
    assert reversed_out[::-1] == reference
    assert [translate_lines(loaded, [line], options())[0] for line in lines[:10]] == reference[:10]
    assert len(set(reference)) > 5  # the random model does depend on its input


def test_file_with_empty_long_and_many_lines_keeps_one_line_per_line(tmp_path, model_dir, loaded, capsys):
    long_line = ("the big red dog ran under the small blue house " * 120)[:5000]
    short = tiny_sentences(10_000, seed=1)
    lines = ["", "the cat sat", "   \t ", long_line, "", *short, "  "]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines), encoding="utf-8")  # no final newline
    out = tmp_path / "out.txt"
    console = NmtConsole(verbosity=0, width=100)
    translate_file([str(model_dir)], str(src), str(out), options(batch_tokens=4000), console)
    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and len(got) - 1 == len(lines)
    got = got[:-1]
    for i, line in enumerate(lines):
        if not line.strip():
            assert got[i] == ""
    assert got[1] == translate_lines(loaded, ["the cat sat"], options())[0]
    assert got[5:15] == translate_lines(loaded, short[:10], options())
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "1 input line(s)" in err and "truncated" in err
    assert capsys.readouterr().out == ""


def test_crlf_and_missing_final_newline(tmp_path, model_dir, loaded):
    lines = ["the cat sat", "", "a dog ran on the mat"]
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes("\r\n".join(lines).encode("utf-8"))
    out = tmp_path / "out.txt"
    translate_file([str(model_dir)], str(crlf), str(out), options(), quiet_console())
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == translate_lines(loaded, lines, options())


def test_invalid_utf8_names_the_line_and_leaves_no_file(tmp_path, model_dir):
    src = tmp_path / "bad.txt"
    src.write_bytes(b"the cat\nthe \xff dog\n")
    out = tmp_path / "out" / "hyp.txt"
    with pytest.raises(DataError, match="line 2 is not valid UTF-8"):
        translate_file([str(model_dir)], str(src), str(out), options(), quiet_console())
    assert not out.exists() and not any(out.parent.glob("*")) if out.parent.exists() else True
    translate_file([str(model_dir)], str(src), str(out), options(errors="replace"), quiet_console())
    assert len(out.read_text(encoding="utf-8").split("\n")) == 3


def test_nbest_scores_and_alignment_formats(loaded):
    lines = ["the cat sat on the mat", "", "a dog"]
    nbest = translate_lines(loaded, lines, options(beam_size=3, nbest=3))
    first = nbest[0].split("\n")
    assert len(first) == 3
    fields = [row.split("\t") for row in first]
    assert all(len(f) == 3 and f[0] == "0" for f in fields)
    scores = [float(f[1]) for f in fields]
    assert scores == sorted(scores, reverse=True)
    assert nbest[1] == "1\t0.0000\t\n1\t-inf\t\n1\t-inf\t"  # always nbest lines
    assert all(row.startswith("2\t") for row in nbest[2].split("\n"))
    plain = translate_lines(loaded, lines, options(beam_size=3))
    assert [f[2] for f in fields][0] == plain[0]

    scored = translate_lines(loaded, lines, options(scores=True, alignments=True, alignment_units="pieces"))
    score, text, align = scored[0].split("\t")
    float(score)
    assert text == translate_lines(loaded, lines, options())[0]
    n_src, n_tgt = len(loaded[0].src_vocab.encode(lines[0])), len(loaded[0].tgt_vocab.encode(text))
    pairs = [tuple(map(int, p.split("-"))) for p in align.split()]
    assert all(0 <= i < n_src for i, _ in pairs)
    assert [j for _, j in pairs] == list(range(len(pairs))) and len(pairs) >= n_tgt - 1
    assert scored[1] == "0.0000\t\t"


def test_greedy_sampling_and_bf16(loaded, model_dir):
    from nmtkit.modeldir import load_model_dir

    lines = tiny_sentences(20, seed=9)
    first = translate_lines(loaded, lines, options(sample=True, seed=3, nbest=2, topk=5))
    assert first == translate_lines(loaded, lines, options(sample=True, seed=3, nbest=2, topk=5))
    greedy = translate_lines(loaded, lines, options(beam_size=1))
    assert translate_lines(loaded, lines, options(sample=True, topk=1)) == greedy
    fresh = [load_model_dir(model_dir)]  # translate_lines casts the weights in place
    assert len(translate_lines(fresh, lines, options(dtype="bf16"))) == len(lines)
    assert fresh[0].model.output_proj.weight.dtype == torch.bfloat16


def test_ensemble_of_a_model_with_itself_translates_like_the_model(tmp_path, model_dir, loaded, tiny_spm):
    lines = tiny_sentences(15, seed=2)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    translate_file([str(model_dir), str(model_dir)], str(src), str(out), options(), quiet_console())
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == translate_lines(loaded, lines, options())


def test_ensemble_needs_shared_vocabularies(tmp_path, model_dir):
    from nmtkit.data.vocab import train_spm

    other_spm = tmp_path / "spm.model"
    train_spm(tiny_sentences(300, seed=4), other_spm, vocab_size=40)
    other = save_tiny_model(tmp_path / "other", other_spm, seed=1)
    with pytest.raises(ConfigError, match="SentencePiece models differ"):
        translate_file([str(model_dir), str(other)], None, None, options(), quiet_console())


def test_options_are_checked():
    with pytest.raises(ConfigError, match="--nbest 3 needs --beam-size >= 3"):
        options(beam_size=2, nbest=3).validate()
    with pytest.raises(ConfigError, match="--errors"):
        options(errors="ignore").validate()
    with pytest.raises(ConfigError, match="fp16"):
        translate_file(["x"], None, None, options(dtype="fp16"), quiet_console())
    with pytest.raises(NmtkitError, match="engine ctranslate2 needs an exported model; see nmtkit export"):
        translate_file(["x"], None, None, options(engine="ctranslate2"), quiet_console())


def test_cli_stdin_to_stdout_and_bad_input(tmp_path, model_dir):
    lines = ["the cat sat", "", "  ", "a red dog ran quickly under the big house", "the mat"]
    result = run_cli("translate", "-m", str(model_dir), "--beam-size", "2", "--max-len-b", "4",
                     "--max-len-a", "0", input="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr.decode()
    out = result.stdout.decode("utf-8").split("\n")
    assert len(out) == len(lines) + 1 and out[-1] == ""
    assert out[1] == out[2] == ""

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the cat\n\xc3\x28 dog\n")
    target = tmp_path / "hyp" / "out.txt"
    result = run_cli("translate", "-m", str(model_dir), "-i", str(bad), "-o", str(target))
    assert result.returncode == 2
    err = result.stderr.decode().strip()
    assert err.count("\n") == 0 and "line 2" in err and err.startswith("nmtkit: error:")
    assert not target.exists()
    assert not target.parent.exists() or not any(target.parent.iterdir())
    assert result.stdout == b""


def test_options_match_the_cli_signature():
    import inspect

    from nmtkit.cli import translate

    # files, not settings: the input, the output and the per-line side files
    cli_names = set(inspect.signature(translate).parameters) - {"ctx", "model", "input", "output", "prefix_file",
                                                                 "constraints"}
    assert cli_names == {f.name for f in dataclasses.fields(TranslateOptions)}


def test_translate_and_serve_share_one_declaration_of_each_common_option():
    """The engine, placement, language and decode flags are declared once (cli_options) and
    appear in both commands with the same flags, help and default; translate's option groups
    cover TranslateOptions exactly, so no setting is accepted and dropped."""
    import typer.main

    from nmtkit import cli_options
    from nmtkit.cli import app

    commands = typer.main.get_command(app).commands
    shared = [f.name for group in (cli_options.RunFlags, cli_options.DecodeFlags) for f in dataclasses.fields(group)]
    shown = {name: {p.name: (p.opts, p.help, p.default) for p in commands[name].params} for name in ("translate", "serve")}
    assert shared and all(shown["translate"][name] == shown["serve"][name] for name in ["model", *shared])
    settings = [f.name for group in (cli_options.RunFlags, cli_options.DecodeFlags, cli_options.CallFlags)
                for f in dataclasses.fields(group)]
    assert sorted(settings) == sorted(f.name for f in dataclasses.fields(TranslateOptions))


def test_nbest_fillers_are_empty_even_under_a_prefix(loaded):
    """The lines a search cannot fill have an empty text: under a --prefix-file they once carried
    the prefix, as if something had been translated."""
    from nmtkit.decoding.guides import Guide
    from nmtkit.decoding.torch_engine import TorchEngine
    from nmtkit.decoding.translate import Translator

    settings = options(beam_size=3, nbest=3)
    translator = Translator(TorchEngine.from_loaded(loaded, settings), settings)
    out = translator.translate(["", "the cat"], guides=[Guide.of("la"), Guide.of("la")])
    assert out[0] == "0\t0.0000\tla\n0\t-inf\t\n0\t-inf\t"  # the blank line is its prefix, the fillers nothing
    assert [row.split("\t")[2][:2] for row in out[1].split("\n")] == ["la"] * 3


def test_the_truncation_warning_names_the_limit_that_cut(loaded):
    from support.text_io import recording_console

    long_line = " ".join(["the big red dog"] * 30)
    for settings, why in ((options(max_source_len=5), "longer than 5 pieces were truncated (--max-source-len 5)"),
                          (options(), "longer than 64 pieces were truncated (the model's max_positions;")):
        console, said = recording_console()
        translate_lines(loaded, [long_line, "a dog"], settings, console)
        assert f"1 input line(s) {why}" in " ".join(said.getvalue().split()), said.getvalue()
