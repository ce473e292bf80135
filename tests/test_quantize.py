"""translate --dtype int8: int8 Linear layers on CPU, each input row quantised on its own."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import reversal_pairs, train_tiny
from nmtkit.decoding.translate import TranslateOptions, translate_lines
from nmtkit.errors import ConfigError
from nmtkit.models import quantize
from nmtkit.models.quantize import Int8Linear, int8_available, quantize_int8
from support.cli import run_cli

needs_int8 = pytest.mark.skipif(not int8_available(), reason="this torch or CPU has no fbgemm int8 kernels")


def layer(bias: bool = True, d_in: int = 32, d_out: int = 48) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(d_in, d_out, bias=bias)


@needs_int8
@pytest.mark.parametrize("bias", [True, False])
@torch.no_grad()
def test_each_row_is_within_its_own_quantisation_error_of_float32(bias):
    linear = layer(bias)
    x = torch.randn(2, 5, 32)
    x[0, 1] *= 1000.0  # one loud row must not coarsen the others (it would with one scale per batch)
    x[1, 2] = 0.0
    got, want = Int8Linear(linear)(x), linear(x)
    assert got.shape == want.shape == (2, 5, 48) and got.dtype == torch.float32
    # an input step is peak/63 and a weight step |w|max/127 per output; each product's error is
    # at most half a step of each, summed over 32 inputs
    peak = x.abs().amax(-1, keepdim=True)
    w = linear.weight
    bound = (peak / 126 * w.abs().sum(1) + x.abs().sum(-1, keepdim=True) * w.abs().amax(1) / 254) * 1.01 + 1e-5
    assert ((got - want).abs() <= bound).all()
    assert (got - want).abs().max() > 0  # it does quantise
    assert torch.equal(got[1, 2], torch.zeros(48) if not bias else linear.bias.detach())


@needs_int8
@torch.no_grad()
def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    int8 = Int8Linear(layer())
    x = torch.randn(7, 32)
    x[3] *= 50.0
    together = int8(x)
    for i in range(7):
        assert torch.equal(int8(x[i:i + 1])[0], together[i])
    assert torch.equal(int8(x.flip(0)), together.flip(0))
    assert int8(x[:0]).shape == (0, 48)
    threads = torch.get_num_threads()
    try:  # fbgemm splits a product among threads: a row's values must not depend on how
        torch.set_num_threads(4)
        many = torch.randn(64, 32)
        assert torch.equal(int8(many)[::9], int8(many[::9]))
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ValueError, match="width 31"):
        int8(x[:, :31])


@needs_int8
def test_quantize_int8_replaces_every_linear_in_a_copy(reversal_spm, tmp_path):
    from nmtkit.modeldir import load_model_dir

    model = load_model_dir(train_tiny(reversal_spm, tmp_path / "model")).model.eval()
    linears = sum(type(m) is nn.Linear for m in model.modules())
    int8 = quantize_int8(model)
    assert linears > 0 and sum(type(m) is Int8Linear for m in int8.modules()) == linears
    assert not any(type(m) is nn.Linear for m in int8.modules())
    assert sum(type(m) is nn.Linear for m in model.modules()) == linears  # the original is untouched


@needs_int8
def test_int8_keeps_lines_agrees_with_float32_and_ignores_batching(reversal_spm, tmp_path):
    from nmtkit.data.vocab import Vocab
    from nmtkit.modeldir import load_model_dir

    model_dir = train_tiny(reversal_spm, tmp_path / "model")
    lines = [s for s, _ in reversal_pairs(60, 7, length=6)]
    lines[4] = ""
    common = dict(beam_size=2, device="cpu", max_len_b=20)
    ours = translate_lines([load_model_dir(model_dir)], lines, TranslateOptions(dtype="float32", **common))
    int8 = translate_lines([load_model_dir(model_dir)], lines, TranslateOptions(dtype="int8", **common))
    assert len(int8) == len(lines) and int8[4] == ""
    assert sum(a == b for a, b in zip(ours, int8)) >= 0.8 * len(lines)
    # lines of one length, so that no padding differs between batched and alone: float32
    # attention over differently padded sources can differ in its last bits, which int8's
    # rounding may carry into a token; a scale per batch changes lines of any length
    lengths = [len(Vocab(reversal_spm).encode(line)) for line in lines]
    same = [line for line, n in zip(lines, lengths) if n == max(set(lengths), key=lengths.count)]
    assert len(same) >= 10
    engine = [load_model_dir(model_dir)]
    batched = translate_lines(engine, same, TranslateOptions(dtype="int8", **common))
    alone = [translate_lines(engine, [line], TranslateOptions(dtype="int8", **common))[0] for line in same]
    assert alone == batched


def test_int8_is_cpu_only_and_named_in_errors(reversal_spm, tmp_path):
    with pytest.raises(ConfigError, match="int8"):
        TranslateOptions(dtype="int4").validate()
    done = run_cli("translate", "-m", str(tmp_path / "none"), "--dtype", "int8", "--device", "cuda", input="a\n")
    assert done.returncode == 2 and done.stderr.decode().count("\n") == 1


def test_without_fbgemm_kernels_int8_is_pytorchs_dynamic_one_and_says_so(monkeypatch, reversal_spm, tmp_path):
    import sys

    from nmtkit.decoding.torch_engine import TorchEngine

    monkeypatch.setattr(quantize, "int8_available", lambda: False)
    model = nn.Sequential(layer(), nn.ReLU(), layer(d_in=48, d_out=8))
    dynamic = quantize_int8(model)
    kinds = [type(m).__name__ for m in dynamic.modules()]
    assert kinds.count("Linear") == 2 and "Int8Linear" not in kinds  # torch's dynamic layer keeps the name
    assert not any(type(m) is nn.Linear for m in dynamic.modules())
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert (dynamic(x) - model(x)).abs().max() < 0.1
    engine = TorchEngine.open([str(train_tiny(reversal_spm, tmp_path / "model"))],
                              TranslateOptions(dtype="int8", device="cpu"))
    assert "a scale per batch" in engine.description
    monkeypatch.setitem(sys.modules, "torch.ao.quantization", None)  # a torch without it
    with pytest.raises(ConfigError, match="--engine ctranslate2 --dtype int8"):
        quantize_int8(model)
