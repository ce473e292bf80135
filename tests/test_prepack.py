"""Packed Linear weights for CPU translation: the same products as nn.Linear, every Linear of
a loaded model swapped, translations unchanged and independent of the batch."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import reversal_pairs, train_tiny
from nmtkit.decoding.torch_engine import TorchEngine
from nmtkit.decoding.translate import TranslateOptions, translate_lines
from nmtkit.models.prepack import PackedLinear, packing_available, prepack_linears

needs_packing = pytest.mark.skipif(not packing_available(torch.float32), reason="no oneDNN packed matmul here")
DTYPES = [torch.float32] + ([torch.bfloat16] if packing_available(torch.bfloat16) else [])


@pytest.fixture(scope="module")
def model_dir(reversal_spm, tmp_path_factory):
    return train_tiny(reversal_spm, tmp_path_factory.mktemp("prepack") / "model")


@needs_packing
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_equals_linear(dtype, bias):
    torch.manual_seed(3)
    linear = nn.Linear(40, 24, bias=bias).to(dtype)
    packed = PackedLinear(linear)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for shape in [(1, 40), (7, 40), (3, 5, 40), (2, 3, 4, 40)]:
        x = torch.randn(shape).to(dtype)
        with torch.inference_mode():
            got = packed(x)
        want = nn.functional.linear(x.float(), linear.weight.float(), None if linear.bias is None else linear.bias.float())
        assert got.shape == (*shape[:-1], 24) and got.dtype == dtype
        torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)
    assert list(packed.parameters()) == [] and packed.state_dict() == {}  # nothing to train, nothing saved
    assert packed.to(dtype) is packed and packed.eval() is packed
    other = torch.bfloat16 if dtype == torch.float32 else torch.float32
    with pytest.raises(RuntimeError, match="load the model again"):  # a packed layout is one dtype's
        packed.to(other)


@needs_packing
def test_rows_do_not_depend_on_the_rest_of_the_batch():
    torch.manual_seed(4)
    packed = PackedLinear(nn.Linear(64, 96))
    x = torch.randn(300, 64)
    with torch.inference_mode():
        whole = packed(x)
        for rows in [slice(0, 1), slice(0, 3), slice(5, 12), slice(100, 233)]:
            assert torch.equal(packed(x[rows]), whole[rows])


@needs_packing
def test_every_linear_of_a_loaded_model_is_packed(model_dir):
    from nmtkit.modeldir import load_model_dir

    model = load_model_dir(model_dir).model
    linears = sum(type(m) is nn.Linear for m in model.modules())
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 11, 2, 0]])
    mask = src.ne(0)
    tgt = torch.tensor([[1, 7, 6, 5], [1, 11, 10, 9]])
    with torch.inference_mode():
        before = model(src, mask, tgt)
    assert prepack_linears(model.eval(), torch.float32) == linears > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert sum(type(m) is PackedLinear for m in model.modules()) == linears
    with torch.inference_mode():
        after = model(src, mask, tgt)
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
    # the tied output layer still reads the embedding's values
    torch.testing.assert_close(model.output_proj(model.tgt_embed.weight[:3]),
                               model.tgt_embed.weight[:3] @ model.tgt_embed.weight.T, atol=1e-5, rtol=1e-5)


@needs_packing
def test_translations_are_unchanged_and_batch_independent(model_dir, monkeypatch):
    from nmtkit.modeldir import load_model_dir

    lines = [s for s, _ in reversal_pairs(24, 9, length=6)]
    common = dict(beam_size=3, device="cpu", dtype="float32", max_len_b=20)
    packed = translate_lines([load_model_dir(model_dir)], lines, TranslateOptions(**common))
    alone = [translate_lines([load_model_dir(model_dir)], [line], TranslateOptions(**common))[0] for line in lines[:8]]
    monkeypatch.setenv("NMTKIT_PREPACK", "0")
    plain = translate_lines([load_model_dir(model_dir)], lines, TranslateOptions(**common))
    assert packed == plain and alone == packed[:8]
    assert sum(line != "" for line in packed) == len(lines)


def test_engines_pack_only_where_asked(model_dir, monkeypatch):
    from nmtkit.modeldir import load_model_dir


    def kinds(**kw):
        engine = TorchEngine.from_loaded([load_model_dir(model_dir)], TranslateOptions(device="cpu", **kw))
        return {type(m).__name__ for m in engine.model.modules()} & {"Linear", "PackedLinear"}

    expect = {"PackedLinear"} if packing_available(torch.float32) else {"Linear"}
    assert kinds(dtype="float32") == expect
    assert "PackedLinear" not in kinds(dtype="int8")  # quantised layers instead
    monkeypatch.setenv("NMTKIT_PREPACK", "0")
    assert kinds(dtype="float32") == {"Linear"} and not packing_available(torch.float32)
    # a model being trained is searched as it is (dev BLEU): the engine around it packs nothing
    live = load_model_dir(model_dir).model
    monkeypatch.delenv("NMTKIT_PREPACK")
    TorchEngine(live, None, None, TranslateOptions(device="cpu"), torch.device("cpu"))
    assert any(type(m) is nn.Linear for m in live.modules())
