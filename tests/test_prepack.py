"""Packed Linear weights for CPU translation: the same products as nn.Linear, every Linear of
a loaded model swapped, translations unchanged and independent of the batch."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import reversal_pairs, train_tiny
from nmtkit.config import ModelConfig
from nmtkit.decoding.torch_engine import TorchEngine
from nmtkit.decoding.translate import TranslateOptions, translate_lines
from nmtkit.modeldir import state_dict_for_save
from nmtkit.models.build import build_model
from nmtkit.models.prepack import PackedLinear, packing_available, prepack_linears, unpack_linears

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
    assert list(packed.parameters()) == []  # nothing to train
    state = packed.state_dict()  # but saved as the Linear it was
    assert state.keys() == linear.state_dict().keys()
    assert all(torch.equal(state[name], t.detach()) for name, t in linear.state_dict().items())


@needs_packing
def test_rows_do_not_depend_on_the_rest_of_the_batch():
    torch.manual_seed(4)
    packed = PackedLinear(nn.Linear(64, 96))
    x = torch.randn(300, 64)
    with torch.inference_mode():
        whole = packed(x)
        for rows in [slice(0, 1), slice(0, 3), slice(5, 12), slice(100, 233)]:
            assert torch.equal(packed(x[rows]), whole[rows])


TRANSFORMER = dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=64)
ARCHS = {
    "transformer-tied": TRANSFORMER,
    "swiglu-untied-bias-keydim": {**TRANSFORMER, "ffn": "swiglu", "tie_embeddings": "none", "output_bias": True,
                                  "key_dim": 4},
    "moe": {**TRANSFORMER, "moe_experts": 3, "moe_top_k": 2},
    "lstm-bahdanau": dict(arch="rnn", embed_dim=16, hidden_dim=24, encoder_layers=2, decoder_layers=2, dropout=0.0),
    "gru-luong-general": dict(arch="rnn", cell="gru", attention="luong-general", embed_dim=16, hidden_dim=16,
                              encoder_layers=1, decoder_layers=1, dropout=0.0),
}


@needs_packing
@pytest.mark.parametrize("arch", ARCHS)
def test_every_linear_is_packed_and_the_model_computes_the_same(arch):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**ARCHS[arch]), 20, 20).eval()
    linears = sum(type(m) is nn.Linear for m in model.modules())
    saved = {name: t.clone() for name, t in state_dict_for_save(model).items()}
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 11, 2, 0]])
    mask = src.ne(0)
    tgt = torch.tensor([[1, 7, 6, 5], [1, 11, 10, 9]])
    with torch.inference_mode():
        before = model(src, mask, tgt)
    assert prepack_linears(model, torch.float32) == linears > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    with torch.inference_mode():
        after = model(src, mask, tgt)
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
    # still reads and saves as the plain model: the same tensors, names and ties
    packed_state = state_dict_for_save(model)
    assert packed_state.keys() == saved.keys()
    assert all(torch.equal(packed_state[name], saved[name]) for name in saved)
    assert unpack_linears(model) == linears and not any(type(m) is PackedLinear for m in model.modules())
    assert all(torch.equal(t, saved[name]) for name, t in state_dict_for_save(model).items())
    if ARCHS[arch].get("tie_embeddings", "all") != "none" and hasattr(model, "tgt_embed"):
        assert model.output_proj.weight is model.tgt_embed.weight


@needs_packing
def test_a_model_translated_once_can_be_cast_quantised_and_translated_again(model_dir):
    from nmtkit.modeldir import load_model_dir

    lines = [s for s, _ in reversal_pairs(12, 5, length=6)]
    common = dict(beam_size=2, device="cpu", max_len_b=20)
    reference = translate_lines([load_model_dir(model_dir)], lines, TranslateOptions(dtype="float32", **common))
    loaded = [load_model_dir(model_dir)]
    assert translate_lines(loaded, lines, TranslateOptions(dtype="float32", **common)) == reference
    assert type(loaded[0].model.output_proj) is PackedLinear
    assert loaded[0].model.output_proj.weight is loaded[0].model.tgt_embed.weight  # the tie survives packing
    assert len(translate_lines(loaded, lines, TranslateOptions(dtype="int8", **common))) == len(lines)
    assert translate_lines(loaded, lines, TranslateOptions(dtype="float32", **common)) == reference
    if packing_available(torch.bfloat16):  # a cast in place, as without packing (so it comes last)
        bf16 = translate_lines(loaded, lines, TranslateOptions(dtype="bf16", **common))
        assert loaded[0].model.output_proj.weight.dtype == torch.bfloat16
        assert bf16 == translate_lines([load_model_dir(model_dir)], lines, TranslateOptions(dtype="bf16", **common))


@needs_packing
def test_to_repacks_or_keeps_the_plain_matrix():
    torch.manual_seed(5)
    linear = nn.Linear(16, 8)
    packed = PackedLinear(linear)
    x = torch.randn(3, 16)
    assert torch.equal(packed.weight, linear.weight.detach())  # unpacked exactly
    packed.to(torch.float16)  # oneDNN packs no fp16 here: the plain matrix is kept
    assert packed.packed is None and packed.weight.dtype == torch.float16
    packed.to(torch.float32)
    linear.half().float()  # the same round trip
    assert packed.packed is not None and torch.equal(packed.weight, linear.weight.detach())
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)


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
    assert kinds(dtype="float32", compile=True) == {"Linear"}  # compiled code takes plain weights
    for off in ("0", "off", "False"):
        monkeypatch.setenv("NMTKIT_PREPACK", off)
        assert kinds(dtype="float32") == {"Linear"} and not packing_available(torch.float32)
    # a model being trained is searched as it is (dev BLEU): the engine around it packs nothing
    live = load_model_dir(model_dir).model
    monkeypatch.delenv("NMTKIT_PREPACK")
    TorchEngine(live, None, None, TranslateOptions(device="cpu"), torch.device("cpu"))
    assert any(type(m) is nn.Linear for m in live.modules())
