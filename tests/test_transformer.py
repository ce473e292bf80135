"""The Transformer: masks, incremental decoding, tying, variants, sizes, save/load."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from nmtkit.config import ModelConfig, from_dict
from nmtkit.models.build import build_model, parameter_table
from nmtkit.models.positions import sinusoidal_positions
from nmtkit.specials import BOS, PAD

V = 24


def tiny_cfg(**kw) -> ModelConfig:
    base = dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=64)
    return ModelConfig(**{**base, **kw})


def batch(seed: int = 0, b: int = 3, s: int = 7, t: int = 6):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (b, s), generator=g)
    src[0, 5:] = PAD  # sentence 0 is shorter
    tgt = torch.randint(4, V, (b, t), generator=g)
    tgt[:, 0] = BOS
    return src, src.ne(PAD), tgt


VARIANTS = [dict(), dict(pre_norm=True), dict(norm="rmsnorm"), dict(ffn="swiglu"),
            dict(pre_norm=True, norm="rmsnorm", ffn="swiglu"), dict(tie_embeddings="none")]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "paper")
def test_incremental_decoding_equals_full_forward(variant):
    torch.manual_seed(0)
    model = build_model(tiny_cfg(**variant), V, V).eval()
    src, mask, tgt = batch()
    with torch.no_grad():
        full = model(src, mask, tgt)  # (B, T, V)
        enc = model.encode(src, mask)
        state = model.init_state(enc)
        steps = []
        for t in range(tgt.size(1)):
            logits, state = model.decode_step(tgt[:, t], enc, state)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_beam_rows_share_one_encoder_copy():
    """B*beam decoder rows against B encoder rows == each row against its own copy."""
    torch.manual_seed(0)
    model = build_model(tiny_cfg(), V, V).eval()
    src, mask, tgt = batch()
    beam = 3
    with torch.no_grad():
        enc = model.encode(src, mask)
        state = model.init_state(enc, beam)
        assert state.self_kv[0][0].shape[0] == src.size(0) * beam
        prev = tgt.repeat_interleave(beam, 0)
        for t in range(3):
            grouped, state = model.decode_step(prev[:, t], enc, state, need_attn=True)
        rep = torch.arange(src.size(0)).repeat_interleave(beam)
        enc1 = enc.select(rep)
        state1 = model.init_state(enc1, 1)
        for t in range(3):
            single, state1 = model.decode_step(prev[:, t], enc1, state1, need_attn=True)
    torch.testing.assert_close(grouped, single, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.attn, state1.attn, atol=1e-6, rtol=1e-5)


def eager_state_select(monkeypatch):
    """Make TransformerState.select copy its caches at once, as before the deferred reorder."""
    from nmtkit.models.base import Selectable
    from nmtkit.models.transformer import TransformerState

    monkeypatch.setattr(TransformerState, "deferred", ())
    monkeypatch.setattr(TransformerState, "select", Selectable.select)


def test_deferred_reorders_read_the_rows_an_eager_copy_would(monkeypatch):
    """Two selects with repeated and dropped rows between steps: the next steps' logits equal
    those of a state whose caches were copied at each select, bit for bit."""
    torch.manual_seed(0)
    model = build_model(tiny_cfg(), V, V).eval()
    src, mask, tgt = batch(t=6)
    first, second = torch.tensor([2, 0, 0, 1, 2, 1]), torch.tensor([5, 1, 1, 3])

    def run():
        with torch.no_grad():
            enc = model.encode(src, mask)
            state, prev, out = model.init_state(enc, 2), tgt.repeat_interleave(2, 0), []
            for t in range(3):
                logits, state = model.decode_step(prev[:, t], enc, state)
            state = state.select(first).select(second)
            rows = first[second]
            prev, enc = prev[rows], enc.select(rows // 2)  # each kept row now a sentence of its own (beam 1)
            for t in range(3, 6):
                logits, state = model.decode_step(prev[:, t], enc, state)
                out.append(logits)
                if t == 3:
                    flip = torch.arange(4).flip(0)
                    state, prev, enc = state.select(flip), prev[flip], enc.select(flip)
        return torch.stack(out)

    deferred = run()
    eager_state_select(monkeypatch)
    assert torch.equal(deferred, run())


@pytest.mark.parametrize("mode", ["float32", "bf16-autocast", "bf16-weights"])
def test_beam_search_is_unchanged_by_deferring_the_cache_reorder(monkeypatch, mode):
    """Beam search (dev BLEU runs it under autocast with float32 weights, whose empty caches
    start in float32; translation casts the weights) gives the same hypotheses and scores with
    eager cache copies."""
    from nmtkit.decoding.options import SearchSettings
    from nmtkit.decoding.search import beam_search

    torch.manual_seed(0)
    model = build_model(tiny_cfg(), V, V).eval()
    autocast = mode == "bf16-autocast"
    if mode == "bf16-weights":
        model = model.to(torch.bfloat16)
    src, mask, _ = batch()

    def run():
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            hyps = beam_search(model, src, mask, SearchSettings(beam_size=3, nbest=3, max_len_a=0.0, max_len_b=8))
        return [[(h.tokens, h.score) for h in sentence] for sentence in hyps]

    deferred = run()
    eager_state_select(monkeypatch)
    assert deferred == run() and all(len(sentence) == 3 for sentence in deferred)


def test_no_attention_to_padding_or_future():
    torch.manual_seed(0)
    model = build_model(tiny_cfg(), V, V).eval()
    src, mask, tgt = batch()
    with torch.no_grad():
        base = model(src, mask, tgt)
        # changing a padded source token changes nothing
        src2 = src.clone()
        src2[0, 6] = 9
        torch.testing.assert_close(model(src2, mask, tgt)[0], base[0])
        # changing target token t changes no logits before t
        tgt2 = tgt.clone()
        tgt2[:, 4] = 7
        out = model(src, mask, tgt2)
        torch.testing.assert_close(out[:, :4], base[:, :4])
        assert not torch.allclose(out[:, 4:], base[:, 4:])
        # the attention map puts exactly zero weight on padding and rows sum to 1
        enc = model.encode(src, mask)
        _, state = model.decode_step(tgt[:, 0], enc, model.init_state(enc), need_attn=True)
    assert torch.all(state.attn[0, 5:] == 0)
    torch.testing.assert_close(state.attn.sum(-1), torch.ones(src.size(0)))


def test_tying_shares_storage():
    model = build_model(tiny_cfg(tie_embeddings="all"), V, V)
    assert model.src_embed.weight.data_ptr() == model.tgt_embed.weight.data_ptr() == model.output_proj.weight.data_ptr()
    dec = build_model(tiny_cfg(tie_embeddings="decoder"), V, V + 5)
    assert dec.tgt_embed.weight.data_ptr() == dec.output_proj.weight.data_ptr() != dec.src_embed.weight.data_ptr()
    none = build_model(tiny_cfg(tie_embeddings="none"), V, V)
    assert none.tgt_embed.weight.data_ptr() != none.output_proj.weight.data_ptr()
    assert parameter_table(model)["total"] == sum(p.numel() for p in model.parameters())
    assert parameter_table(none)["embeddings"] - parameter_table(model)["embeddings"] == 2 * V * 16


def test_sinusoidal_positions_match_formula():
    table = sinusoidal_positions(50, 8)
    pos, i = 7, 2  # dims 4 (sin) and 5 (cos) share the frequency 10000^(-4/8)
    freq = 10000 ** (-2 * i / 8)
    assert table[pos, 2 * i].item() == pytest.approx(torch.sin(torch.tensor(pos * freq)).item(), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(torch.cos(torch.tensor(pos * freq)).item(), abs=1e-6)


def test_paper_sizes():
    """Table 3 of the paper: base 65M (63M with a shared 37k vocab), big 213M."""
    def preset(name: str):
        return from_dict({"data": {"source": "hf"}, "model": {"preset": name}}).model

    base = parameter_table(build_model(preset("transformer-base"), 37000, 37000))
    big = parameter_table(build_model(preset("transformer-big"), 37000, 37000))
    assert base["total"] == 63_082_496
    assert big["total"] == 214_245_376


def test_model_dir_round_trip(tmp_path, tiny_spm):
    from nmtkit.modeldir import load_model_dir, save_model_dir

    torch.manual_seed(0)
    cfg = tiny_cfg(ffn="swiglu")
    model = build_model(cfg, 40, 40).eval()
    save_model_dir(model, cfg, tmp_path / "m", tiny_spm, tiny_spm, {"src_lang": "en"})
    loaded = load_model_dir(tmp_path / "m")
    assert loaded.model_cfg == cfg and loaded.meta["src_lang"] == "en"
    src, mask, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(src, mask, tgt), model(src, mask, tgt), atol=0, rtol=0)
    assert loaded.model.output_proj.weight.data_ptr() == loaded.model.src_embed.weight.data_ptr()


def test_corrupt_model_dir_is_a_clean_error(tmp_path, tiny_spm):
    from nmtkit.errors import CheckpointError
    from nmtkit.modeldir import load_model_dir, save_model_dir

    cfg = tiny_cfg()
    save_model_dir(build_model(cfg, 40, 40), cfg, tmp_path / "m", tiny_spm, tiny_spm)
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="checksum"):
        load_model_dir(tmp_path / "m")
    with pytest.raises(CheckpointError, match="not found"):
        load_model_dir(tmp_path / "missing")
    (tmp_path / "m" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model_dir(tmp_path / "m")


def test_dropout_only_in_training():
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(tiny_cfg(), dropout=0.5, attention_dropout=0.3), V, V)
    src, mask, tgt = batch()
    model.train()
    assert not torch.allclose(model(src, mask, tgt), model(src, mask, tgt))
    model.eval()
    torch.testing.assert_close(model(src, mask, tgt), model(src, mask, tgt))


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_bf16_attention_path_matches_sdpa(causal):
    """The explicit bf16 attention used on CPU agrees with PyTorch's SDPA in float32."""
    from torch.nn.functional import scaled_dot_product_attention

    from nmtkit.models.layers import sdpa

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g) for _ in range(3))
    mask = None if causal else torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]
    expected = scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    got = sdpa(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, 0.0, causal)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=3e-2, rtol=3e-2)


# variant -> (model settings, most updates, exact-match bar). ALiBi and RoPE carry no absolute
# position and our sources no end marker, so finding the mirror position takes them longer, and
# when RoPE finds it depends on float rounding: 97% exact after 800 updates on a Zen 3 CPU, 74% on
# a Zen 4 (AVX-512), 99% there after 1,200, 94.5% after 1,200 on another Zen 3 (torch 2.13,
# 2026-11-27), hence its bar of 90%; ALiBi 77.5% after 600, 81.5% after 1,000
# (with a symmetric encoder bias it stays at 4%: positions.py explains why). Those were read on
# the pairs drawn after training; since the check every 100 updates on held-out pairs of their
# own, the bars fell at 200 (paper), 100 (learned), 500 (RoPE), 400 (ALiBi) and 300 (MoE) updates
# on a Zen 3 (2026-11-28): 85 s for the five alone there, where training to the end took ~210 s.
REVERSAL = {"paper": ({}, 600, 0.95), "learned": (dict(positions="learned"), 600, 0.95),
            "rope": (dict(positions="rope"), 1200, 0.9), "alibi": (dict(positions="alibi"), 600, 0.6),
            "moe": (dict(moe_experts=4, moe_top_k=2), 600, 0.95)}


@pytest.mark.parametrize("variant", list(REVERSAL))
def test_learns_to_reverse_ten_symbols(variant):
    """The paper's model and each variant, tiny: reversing 10 symbols reaches the variant's bar of
    exact matches (greedy; 95% but for ALiBi and RoPE, see REVERSAL) within its updates. Held-out
    pairs are checked every 100 updates and training stops at the bar: the batches are the same
    as training to the end would draw, so a model that gets there late still passes."""
    from nmtkit.decoding.options import SearchSettings
    from nmtkit.decoding.search import greedy_search
    from nmtkit.specials import EOS

    torch.manual_seed(0)
    symbols, length = 10, 10
    settings, steps, bar = REVERSAL[variant]
    cfg = tiny_cfg(d_model=64, ffn_dim=128, heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0, **settings)
    model = build_model(cfg, symbols + 4, symbols + 4)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(1)

    def sample(n, generator=g):
        src = torch.randint(4, symbols + 4, (n, length), generator=generator)
        tgt = src.flip(1)
        tgt_in = torch.cat([torch.full((n, 1), BOS), tgt], 1)
        tgt_out = torch.cat([tgt, torch.full((n, 1), EOS)], 1)
        return src, tgt_in, tgt_out

    held_out, _, _ = sample(200, torch.Generator().manual_seed(2))

    def exact_share():
        model.eval()
        with torch.no_grad():
            hyps = greedy_search(model, held_out, held_out.ne(PAD),
                                 SearchSettings(lenpen=0.0, max_len_a=1.0, max_len_b=2, min_len=1))
        model.train()
        return sum(h[0].tokens == s.flip(0).tolist() for h, s in zip(hyps, held_out)) / len(held_out)

    exact = 0.0
    for update in range(1, steps + 1):
        src, tgt_in, tgt_out = sample(64)
        logits = model(src, src.ne(PAD), tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if update % 100 == 0 or update == steps:
            exact = exact_share()
            print(f"{variant}: {exact:.3f} exact after {update} updates")
            if exact > bar:
                break
    assert exact > bar, exact
