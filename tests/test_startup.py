"""What translate's start-up skips must not change what it translates with: a model loaded
from its directory (built without a random initialisation, every weight then loaded) equals
the model that was saved, in every weight, buffer and output; damaged weights are still
refused; the console that rich now joins late prints as before."""
from __future__ import annotations

import dataclasses
import io
import os

import pytest
import torch

from nmtkit.config import ModelConfig
from nmtkit.data.vocab import Vocab
from nmtkit.errors import CheckpointError
from nmtkit.models.build import build_model
from nmtkit.modeldir import load_model_dir, save_model_dir
from tests.support.cli import assert_error, cli_in_process

TINY = ModelConfig(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=2, dropout=0.0,
                   max_positions=32)
VARIANTS = {
    "sinusoidal": TINY,  # a computed, non-persistent position table
    "learned": dataclasses.replace(TINY, positions="learned", tie_embeddings="none"),
    "alibi-rmsnorm": dataclasses.replace(TINY, positions="alibi", norm="rmsnorm", pre_norm=True),
    "rope-moe": dataclasses.replace(TINY, positions="rope", moe_experts=2, tie_embeddings="decoder"),
    "lstm": ModelConfig(arch="rnn", embed_dim=16, hidden_dim=16, encoder_layers=1, decoder_layers=1, dropout=0.0),
    "gru-luong": ModelConfig(arch="rnn", cell="gru", attention="luong-general", embed_dim=16, hidden_dim=24,
                             encoder_layers=1, decoder_layers=1, dropout=0.0),
}


def tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, persistent or not, by name."""
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_loaded_model_equals_the_saved_one(tmp_path, tiny_spm, name):
    cfg = VARIANTS[name]
    size = len(Vocab(tiny_spm))
    torch.manual_seed(3)
    saved = build_model(cfg, size, size).eval()
    directory = save_model_dir(saved, cfg, tmp_path / "model", tiny_spm, tiny_spm)
    torch.manual_seed(4)  # other draws: a loader that kept its random init would differ from the saved weights
    loaded = load_model_dir(directory).model
    want, got = tensors(saved), tensors(loaded)
    assert sorted(got) == sorted(want)
    for key, tensor in want.items():
        assert torch.equal(got[key], tensor), key
    tied = {n for n, p in saved.named_parameters(remove_duplicate=False) if p is saved.output_proj.weight}
    assert {n for n, p in loaded.named_parameters(remove_duplicate=False) if p is loaded.output_proj.weight} == tied
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
    tgt = torch.tensor([[2, 11, 12], [2, 13, 0]])
    with torch.no_grad():
        assert torch.equal(loaded(src, src != 0, tgt), saved(src, src != 0, tgt))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_building_to_load_draws_no_random_numbers(name):
    """Without the random initialisation the global generator is untouched (so the build did
    no fills), whatever the architecture; with it, the build draws."""
    cfg = VARIANTS[name]
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    build_model(cfg, 40, 40, random_init=False)
    assert torch.equal(torch.rand(4), expected)
    torch.manual_seed(0)
    build_model(cfg, 40, 40)
    assert not torch.equal(torch.rand(4), expected)


@pytest.fixture
def saved_dir(tmp_path, tiny_spm):
    size = len(Vocab(tiny_spm))
    return save_model_dir(build_model(TINY, size, size), TINY, tmp_path / "model", tiny_spm, tiny_spm)


def flip_a_weight_byte(weights) -> None:
    """One bit flipped inside the last tensor: still a well-formed safetensors file of the same size."""
    stamp = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01
    with open(weights, "r+b") as handle:  # in place: same inode, same size
        handle.write(bytes(data))
    os.utime(weights, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # even the modification time kept


def test_a_flipped_weight_byte_is_still_refused(saved_dir):
    flip_a_weight_byte(saved_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_model_dir(saved_dir)


def test_translate_refuses_a_flipped_weight_byte_in_one_line(saved_dir, monkeypatch, capsys):
    flip_a_weight_byte(saved_dir / "model.safetensors")
    monkeypatch.setattr("sys.stdin", io.StringIO("the cat\n"))
    code, out, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(saved_dir), "--device", "cpu")
    assert out == ""
    assert_error(code, err, 2, f"{saved_dir / 'model.safetensors'}: checksum mismatch")


def test_the_console_made_before_rich_prints_as_before():
    """The console imports rich at its first output; what it prints is unchanged by that."""
    from nmtkit.runtime.console import NmtConsole

    out = io.StringIO()
    quiet, normal = NmtConsole(-1, file=out, width=60), NmtConsole(0, file=out, width=60)
    quiet.info("hidden when quiet")
    quiet.warn("a warning is one line, " + "long " * 20)
    normal.info("shown")
    normal.detail("only when verbose")
    assert out.getvalue() == "warning: a warning is one line, " + "long " * 20 + "\nshown\n"  # one line, unwrapped
    assert normal.is_terminal is False and normal.width == 60


def test_a_console_set_quiet_prints_nothing_as_other_ranks_need():
    from nmtkit.runtime.console import NmtConsole

    out = io.StringIO()
    console = NmtConsole(0, file=out)
    console.quiet = True  # how training silences every rank but the first
    console.print("stopped by signal")
    console.info("shown")
    assert out.getvalue() == "" and console.rich.quiet is True and console.verbosity == 0


def test_a_joint_vocabulary_is_loaded_once_and_separate_ones_twice(saved_dir, tmp_path, tiny_spm):
    joint = load_model_dir(saved_dir)
    assert joint.src_vocab is joint.tgt_vocab
    assert joint.src_vocab.decode(joint.src_vocab.encode("the cat sat")) == "the cat sat"
    cfg = dataclasses.replace(TINY, tie_embeddings="none")
    size = len(Vocab(tiny_spm))
    other = tmp_path / "tgt.model"
    other.write_bytes(tiny_spm.read_bytes())  # the same model under another name: a second file to load
    separate = load_model_dir(save_model_dir(build_model(cfg, size, size), cfg, tmp_path / "two", tiny_spm, other))
    assert separate.src_vocab is not separate.tgt_vocab
    assert (separate.src_vocab.path.name, separate.tgt_vocab.path.name) == ("spm.model", "tgt.model")


def test_the_nmtkit_program_freezes_the_collector_after_main_whatever_its_exit(monkeypatch, capsys):
    """``program`` (the console script and ``python -m nmtkit``) runs ``main`` and then freezes the
    garbage collector's objects, after ``main`` has put SIGTERM back and also when ``main`` exits
    through SystemExit or an uncaught error, which it passes on; ``main`` itself, which tests and
    scripts call in-process, leaves the collector alone."""
    import gc
    import signal
    import sys

    from nmtkit import cli

    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL))
    monkeypatch.setattr(sys, "argv", ["nmtkit", "--version"])
    with pytest.raises(SystemExit) as done:
        cli.main()
    assert done.value.code in (0, None) and frozen == []
    with pytest.raises(SystemExit) as done:
        cli.program()
    assert done.value.code in (0, None) and frozen == [True]  # after main: its SIGTERM handler is gone
    monkeypatch.setattr(sys, "argv", ["nmtkit", "translate", "-m", "/nonexistent/model"])
    with pytest.raises(SystemExit) as done:
        cli.program()
    assert done.value.code == 2 and frozen == [True, True]
    assert "nmtkit: error:" in capsys.readouterr().err

    def crash():
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "_run_app", crash)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.program()
    assert frozen == [True, True, True]


def test_the_console_script_and_python_m_run_the_program():
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    scripts = (root / "pyproject.toml").read_text(encoding="utf-8").split("[project.scripts]")[1].split("[")[0]
    assert re.findall(r"^(\S+) = \"(\S+)\"$", scripts, re.MULTILINE) == [("nmtkit", "nmtkit.cli:program")]
    done = subprocess.run([sys.executable, "-c", "import gc, runpy, sys; sys.argv = ['nmtkit', '--version']\n"
                           "try:\n    runpy.run_module('nmtkit', run_name='__main__')\n"
                           "finally:\n    print('frozen:', gc.get_freeze_count() > 1000, file=sys.stderr)"],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0 and done.stdout.startswith("nmtkit ")
    assert "frozen: True" in done.stderr.splitlines()


def test_no_nmtkit_class_relies_on_being_finalized():
    """The program freezes the collector at exit (``cli.program``): an object in a reference cycle
    is then never finalized, so no ``__del__`` may flush, write or delete anything."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "nmtkit"
    found = [f"{path.relative_to(package)}:{node.lineno}" for path in sorted(package.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.FunctionDef) and node.name == "__del__"]
    assert found == []
