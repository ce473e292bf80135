"""train.compile: compiled training computes what eager training does, its checkpoints are
ordinary ones (no ``_orig_mod.`` names: they resume, average and translate uncompiled), and
without a C++ compiler training warns once and runs uncompiled.

Inductor compiles C++ kernels on CPU, tens of seconds even for a tiny model, so one test
compiles; the others only check the plumbing around it.
"""
from __future__ import annotations

import shutil

import pytest
import torch

from conftest import reversal_pairs, tiny_recipe, write_prepared
from nmtkit.config import from_dict

MODEL = {"d_model": 16, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 1}  # dropout 0 (tiny_recipe)


def quiet_console():
    """get_console(-1), keeping its warnings in ``.warnings``."""
    from nmtkit.runtime.console import get_console

    console = get_console(-1)
    console.warnings = []
    console.warn = console.warnings.append
    return console


@pytest.fixture(scope="module")
def prepared_task(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("task")
    write_prepared(workdir, reversal_pairs(200, 0, length=6), reversal_pairs(20, 1, length=6))
    return workdir


def _train(prepared_task, workdir, console=None, **train):
    from nmtkit.training.trainer import train as run_train

    if not (workdir / "prepared").exists():
        shutil.copytree(prepared_task / "prepared", workdir / "prepared")
    # eps 1e-4: with Adam's 1e-9, rounding noise in a gradient that is zero in exact arithmetic (the
    # attention keys' bias) becomes lr-sized steps, and any change of summation order would show
    cfg = from_dict(tiny_recipe(workdir, model=MODEL, train={"max_tokens": 200, "save_every": 3, "eps": 1e-4,
                                                             **train}))
    return run_train(cfg, console or quiet_console())


def _weights(run_dir):
    from nmtkit.training.checkpoint import latest_checkpoint

    return latest_checkpoint(run_dir).weights


def test_without_a_cpp_compiler_training_warns_once_and_runs_uncompiled(prepared_task, tmp_path, monkeypatch):
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, str(tmp_path / "no-such-c++")))
    console = quiet_console()
    fallback = _train(prepared_task, tmp_path / "fallback", console, max_steps=4, compile=True)
    assert console.warnings == ["train.compile: inductor needs a C++ compiler on CPU and found none "
                                "(install g++ or set CXX); running uncompiled"]
    eager = _train(prepared_task, tmp_path / "eager", max_steps=4)
    a, b = _weights(fallback), _weights(eager)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_compiled_training_matches_eager_and_leaves_ordinary_checkpoints(prepared_task, tmp_path):
    from torch._dynamo.utils import counters

    from nmtkit.decoding.translate import TranslateOptions, translate_lines
    from nmtkit.modeldir import load_model_dir
    from nmtkit.runtime.compiler import missing_compiler
    from nmtkit.training.checkpoint import average_checkpoints, checkpoint_dirs

    if missing_compiler(torch.device("cpu")):
        pytest.skip("no C++ compiler for inductor")
    eager = _train(prepared_task, tmp_path / "eager", max_steps=6)
    graphs = counters["stats"]["unique_graphs"]
    compiled = _train(prepared_task, tmp_path / "compiled", max_steps=3, compile=True)
    # the batches have several (sentences, length) shapes; dynamic shapes compile them as one graph
    assert counters["stats"]["unique_graphs"] - graphs == 1
    _train(prepared_task, tmp_path / "compiled", max_steps=6, compile=True)  # resumes, compiled again

    a, b = _weights(eager), _weights(compiled)
    assert a.keys() == b.keys()  # no "_orig_mod." prefix
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5, msg=lambda text: f"{name}: {text}")
    # a compiled run's checkpoints are ordinary model directories: averaged and translated uncompiled
    average_checkpoints(compiled, 2)
    source = ["a b c d e f", "f e d"]
    outputs = []
    for model_dir in (checkpoint_dirs(compiled)[-1], compiled / "averaged", checkpoint_dirs(eager)[-1]):
        loaded = load_model_dir(model_dir)
        outputs.append(translate_lines([loaded], source, TranslateOptions(beam_size=2, device="cpu")))
    assert all(len(out) == len(source) for out in outputs)
    assert outputs[0] == outputs[2]


def test_translate_compile_without_a_cpp_compiler_warns_once_and_translates_the_same(tmp_path, reversal_spm,
                                                                                     monkeypatch):
    from conftest import train_tiny
    from support.cli import run_cli
    from nmtkit.decoding.translate import TranslateOptions
    from nmtkit.errors import ConfigError

    model = train_tiny(reversal_spm, tmp_path / "model", steps=30)
    source = "a b c d\n\nf e d c b a\n"
    plain = run_cli("translate", "-m", str(model), "-b", "2", input=source)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))  # the child's inductor finds no compiler
    compiled = run_cli("translate", "-m", str(model), "-b", "2", "--compile", input=source)
    assert plain.returncode == compiled.returncode == 0, compiled.stderr.decode()
    assert compiled.stdout == plain.stdout and len(plain.stdout.decode().splitlines()) == 3
    assert compiled.stderr.decode().strip().splitlines() == [
        "warning: --compile: inductor needs a C++ compiler on CPU and found none (install g++ or set CXX); "
        "translating uncompiled"]
    with pytest.raises(ConfigError, match="--compile applies to the torch engine only"):
        TranslateOptions(compile=True, engine="ctranslate2").validate()


def test_compiled_features_trace_once_when_first_source_and_target_lengths_are_equal():
    """Duck sizing would make equal first lengths one symbol and trace again at the first batch
    whose lengths differ (62 s on an H200 for transformer-base); every size is its own symbol."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    from nmtkit.config import ModelConfig
    from nmtkit.models.build import build_model
    from nmtkit.runtime.compiler import compile_dynamic

    model = build_model(ModelConfig(**MODEL, heads=2, dropout=0.0), 20, 20).eval()
    torch._dynamo.reset()
    counter = CompileCounter()
    features = compile_dynamic(model.features, backend=counter)
    for batch, src_len, tgt_len in ((3, 5, 5), (3, 5, 7), (4, 6, 9), (2, 8, 4)):
        src = torch.randint(4, 20, (batch, src_len))
        tgt = torch.randint(4, 20, (batch, tgt_len))
        mask = torch.ones(batch, src_len, dtype=torch.bool)
        torch.testing.assert_close(features(src, mask, tgt), model.features(src, mask, tgt))
    assert counter.frame_count == 1
    torch._dynamo.reset()
