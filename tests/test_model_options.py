"""The Transformer options an imported MarianMT model needs: each against a reference computation,
and the defaults leaving every existing model as it was."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nmtkit.config import ModelConfig
from nmtkit.models.build import build_model
from nmtkit.models.layers import FeedForward
from nmtkit.models.positions import sinusoidal_positions
from nmtkit.specials import BOS, PAD

V = 24


def tiny_cfg(**kw) -> ModelConfig:
    base = dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=64)
    return ModelConfig(**{**base, **kw})


def test_halves_layout_is_all_sines_then_all_cosines():
    length, dim = 50, 16
    table = sinusoidal_positions(length, dim, "halves")
    pos, i = np.arange(length)[:, None], np.arange(dim // 2)[None, :]
    angle = pos / 10000.0 ** (2 * i / dim)  # the same frequencies as the paper's table
    np.testing.assert_allclose(table.numpy(), np.concatenate([np.sin(angle), np.cos(angle)], 1), atol=1e-6)
    interleaved = sinusoidal_positions(length, dim)
    torch.testing.assert_close(interleaved[:, 0::2], table[:, :dim // 2], atol=1e-5, rtol=0)
    torch.testing.assert_close(interleaved[:, 1::2], table[:, dim // 2:], atol=1e-5, rtol=0)


def test_silu_feed_forward_is_x_times_sigmoid_x():
    torch.manual_seed(0)
    ffn = FeedForward(8, 12, "silu")
    x = torch.randn(3, 8)
    h = ffn.fc_in(x)
    torch.testing.assert_close(ffn(x), ffn.fc_out(h * torch.sigmoid(h)))


def test_embed_scale_off_adds_positions_to_raw_embeddings():
    torch.manual_seed(0)
    scaled, raw = (build_model(tiny_cfg(embed_scale=flag), V, V).eval() for flag in (True, False))
    raw.load_state_dict(scaled.state_dict())
    tokens = torch.tensor([[5, 6, 7]])
    table = sinusoidal_positions(64, 16)[:3]
    torch.testing.assert_close(raw._embed(raw.src_embed, tokens, "src"), raw.src_embed(tokens) + table)
    torch.testing.assert_close(scaled._embed(scaled.src_embed, tokens, "src"),
                               scaled.src_embed(tokens) * math.sqrt(16) + table)


def test_output_bias_is_added_to_every_logit():
    torch.manual_seed(0)
    model = build_model(tiny_cfg(output_bias=True, tie_embeddings="all"), V, V).eval()
    assert model.output_proj.bias.shape == (V,)
    src = torch.randint(4, V, (2, 5))
    tgt = torch.tensor([[BOS, 5, 6], [BOS, 7, PAD]])
    with torch.no_grad():
        before = model(src, src.ne(PAD), tgt)
        model.output_proj.bias.copy_(torch.arange(V, dtype=torch.float32))
        after = model(src, src.ne(PAD), tgt)
    torch.testing.assert_close(after - before, torch.arange(V, dtype=torch.float32).expand_as(before))


def test_defaults_keep_the_existing_model():
    """No new tensor, the paper's embedding scale and position table: a model saved before
    these options existed loads and computes as it did."""
    torch.manual_seed(0)
    model = build_model(tiny_cfg(), V, V)
    assert model.output_proj.bias is None
    assert model.embed_scale == math.sqrt(16)
    torch.testing.assert_close(model.positions.table, sinusoidal_positions(64, 16))


@pytest.mark.parametrize("variant", [dict(ffn="silu"), dict(sinusoid_layout="halves", embed_scale=False,
                                                                output_bias=True)])
def test_incremental_decoding_equals_full_forward(variant):
    torch.manual_seed(0)
    model = build_model(tiny_cfg(**variant), V, V).eval()
    src = torch.randint(4, V, (2, 6))
    tgt = torch.cat([torch.full((2, 1), BOS), torch.randint(4, V, (2, 4))], 1)
    with torch.no_grad():
        full = model(src, src.ne(PAD), tgt)
        enc = model.encode(src, src.ne(PAD))
        state, steps = model.init_state(enc), []
        for t in range(tgt.size(1)):
            logits, state = model.decode_step(tgt[:, t], enc, state)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)
