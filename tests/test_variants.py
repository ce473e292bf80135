"""Transformer variants: positions (sinusoidal, learned, ALiBi, RoPE), FFN (ReLU, GELU, SwiGLU)
and Mixture-of-Experts layers, each under the same contract invariants as the paper's model."""
from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest
import torch

from nmtkit.config import ModelConfig
from nmtkit.specials import PAD
from nmtkit.models.build import build_model
from nmtkit.models.moe import MoEFeedForward
from nmtkit.models.positions import alibi_slopes, rotary_tables, rotate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import invariants  # noqa: E402  (shared with the GPU check)
from invariants import incremental, pad  # noqa: E402

V = 24
POSITIONS = ("sinusoidal", "learned", "alibi", "rope")
FFNS = ("relu", "gelu", "swiglu")
MOES = {"dense": {}, "moe-top2": dict(moe_experts=4, moe_top_k=2),
        "moe-top1-every2-capacity": dict(moe_experts=3, moe_top_k=1, moe_every=2, moe_capacity_factor=1.0)}
COMBOS = [pytest.param(dict(positions=p, ffn=f, **MOES[m]), id=f"{p}-{f}-{m}")
          for p, f, m in itertools.product(POSITIONS, FFNS, MOES)]
# queries and keys narrower or wider than the values (d_model / heads = 8 in tiny_cfg)
COMBOS += [pytest.param(dict(positions=p, key_dim=k), id=f"{p}-key_dim{k}") for p, k in itertools.product(POSITIONS, (4, 12))]


def tiny_cfg(**kw) -> ModelConfig:
    base = dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=64)
    return ModelConfig(**{**base, **kw})


def tiny_model(**kw):
    torch.manual_seed(0)
    model = build_model(tiny_cfg(**kw), V, V).eval()
    with torch.no_grad():  # a trained model's routers are not uniform: random ones that decide
        for module in model.modules():
            if isinstance(module, MoEFeedForward):
                module.router.weight.normal_(0.0, 1.0)
    return model


def sentences(seed: int, lengths: list[int]) -> list[torch.Tensor]:
    return invariants.sentences(seed, lengths, V)


def targets(seed: int, lengths: list[int]) -> list[torch.Tensor]:
    return invariants.targets(seed, lengths, V)


@pytest.mark.parametrize("variant", COMBOS)
def test_incremental_equals_teacher_forced(variant):
    model = tiny_model(**variant)
    src, tgt = pad(sentences(1, [7, 4, 6])), pad(targets(2, [6, 6, 6]))
    with torch.no_grad():
        full = model(src, src.ne(PAD), tgt)
    torch.testing.assert_close(incremental(model, src, tgt), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", COMBOS)
def test_batched_equals_one_by_one_and_padding_changes_nothing(variant):
    model = tiny_model(**variant)
    srcs, tgts = sentences(3, [7, 3, 5]), targets(4, [5, 2, 6])
    src, tgt = pad(srcs), pad(tgts)
    with torch.no_grad():
        batched = model(src, src.ne(PAD), tgt)
        padded = model(pad(srcs, 11), pad(srcs, 11).ne(PAD), pad(tgts, 9))
    stepped = incremental(model, src, tgt)
    for i, (s, t) in enumerate(zip(srcs, tgts)):
        with torch.no_grad():
            alone = model(s[None], s[None].ne(PAD), t[None])[0]
        n = len(t)
        torch.testing.assert_close(batched[i, :n], alone, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(padded[i, :n], alone, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(stepped[i, :n], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", POSITIONS)
def test_beam_rows_share_one_encoder_copy(positions):
    model = tiny_model(positions=positions, moe_experts=2, moe_top_k=1)
    src, beam = pad(sentences(5, [6, 4])), 3
    prev = pad(targets(6, [4, 4])).repeat_interleave(beam, 0)
    with torch.no_grad():
        enc = model.encode(src, src.ne(PAD))
        copies = enc.select(torch.arange(2).repeat_interleave(beam))
        state, state1 = model.init_state(enc, beam), model.init_state(copies, 1)
        for t in range(prev.size(1)):
            grouped, state = model.decode_step(prev[:, t], enc, state)
            single, state1 = model.decode_step(prev[:, t], copies, state1)
            torch.testing.assert_close(grouped, single, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", POSITIONS)
def test_cpu_bf16_autocast_follows_float32(positions):
    """The explicit bf16 attention path on CPU carries ALiBi's bias and RoPE's rotation too."""
    model = tiny_model(positions=positions)
    src, tgt = pad(sentences(7, [7, 4])), pad(targets(8, [6, 6]))
    with torch.no_grad():
        reference = model(src, src.ne(PAD), tgt)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(src, src.ne(PAD), tgt)
            stepped = incremental(model, src, tgt)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), reference, atol=0.1, rtol=0.05)
    torch.testing.assert_close(stepped.float(), reference, atol=0.1, rtol=0.05)


def test_bf16_attention_path_adds_a_float_bias_like_sdpa():
    from torch.nn.functional import scaled_dot_product_attention

    from nmtkit.models.layers import sdpa

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g) for _ in range(3))
    positions = torch.arange(5)
    from nmtkit.models.positions import alibi_bias

    bias = alibi_bias(alibi_slopes(4), positions, positions, causal=True)
    expected = scaled_dot_product_attention(q, k, v, attn_mask=bias)
    got = sdpa(q.bfloat16(), k.bfloat16(), v.bfloat16(), bias, 0.0)
    torch.testing.assert_close(got.float(), expected, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(sdpa(q, k, v, bias, 0.0), expected)


# -- positions ---------------------------------------------------------------------------------

def test_alibi_slopes_follow_the_paper():
    """Press et al. 2022: 2^(-8i/n) for n a power of two; for 6 heads the 4 slopes of n=4,
    then every other slope of n=8 (2^-1, 2^-3)."""
    assert alibi_slopes(4).tolist() == [2 ** (-8 * i / 4) for i in range(1, 5)]
    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]
    assert alibi_slopes(6).tolist() == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]


def test_alibi_bias_is_distance_times_slope():
    from nmtkit.models.positions import alibi_bias

    slopes = alibi_slopes(4)
    both = alibi_bias(slopes, torch.arange(5), torch.arange(5), causal=False)
    assert both[1, 4, 1].item() == -3 * slopes[1].item() == both[1, 1, 4].item()
    causal = alibi_bias(slopes, torch.arange(3, 5), torch.arange(5), causal=True)  # queries at 3, 4
    assert causal[2, 0, 0].item() == -3 * slopes[2].item() and causal[2, 0, 4].item() == float("-inf")


def test_alibi_encoder_heads_look_one_way_each_and_see_a_sentence_unlike_its_mirror():
    from nmtkit.models.positions import alibi_encoder_bias

    bias = alibi_encoder_bias(4, 5)  # heads 0-1 look left, 2-3 right, each pair with the slopes of 2 heads
    slopes = alibi_slopes(2)
    assert bias[1, 4, 1].item() == -3 * slopes[1].item() and bias[1, 1, 4].item() == float("-inf")
    assert bias[3, 1, 4].item() == -3 * slopes[1].item() and bias[3, 4, 1].item() == float("-inf")
    torch.testing.assert_close(bias[2:], bias[:2].transpose(1, 2))
    model = tiny_model(positions="alibi")
    src = sentences(11, [6])[0][None]
    with torch.no_grad():
        memory = model.encode(src, src.ne(PAD)).memory[0]
        mirrored = model.encode(src.flip(1), src.ne(PAD)).memory[0].flip(0)
    assert (memory - mirrored).abs().max() > 1e-2  # a symmetric bias would make these equal


def test_rope_preserves_norms_and_depends_on_relative_position_only():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)

    def at(x, position):
        return rotate(x, rotary_tables(torch.tensor([position]), 16))

    for position in (0, 3, 17, 500):
        torch.testing.assert_close(at(q, position).norm(), q.norm())
    dot = lambda m, n: (at(q, m) * at(k, n)).sum().item()  # noqa: E731
    for m, n in ((5, 2), (2, 5), (0, 9)):
        for shift in (1, 7, 300):
            assert dot(m + shift, n + shift) == pytest.approx(dot(m, n), abs=1e-4)
    assert abs(dot(5, 2) - dot(5, 3)) > 1e-2  # and it does depend on the distance


@pytest.mark.parametrize("positions", ["alibi", "rope"])
def test_alibi_and_rope_work_past_max_positions(positions):
    model = tiny_model(positions=positions, max_positions=8)
    assert model.max_positions is None
    src, tgt = pad(sentences(9, [20, 13])), pad(targets(10, [18, 18]))
    with torch.no_grad():
        full = model(src, src.ne(PAD), tgt)
    torch.testing.assert_close(incremental(model, src, tgt), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["alibi", "rope", "learned", "sinusoidal"])
def test_translating_a_source_longer_than_max_positions(positions, tiny_spm, tmp_path):
    """Every model cuts sources at max_positions pieces (alibi and rope have no table but one
    runaway line must not cost hours or all memory); a huge line is cut as text before encoding."""
    from conftest import tiny_sentences
    from nmtkit.data.vocab import Vocab
    from nmtkit.decoding.torch_engine import TorchEngine
    from nmtkit.decoding.translate import TranslateOptions, Translator
    from nmtkit.modeldir import load_model_dir, save_model_dir

    cfg = tiny_cfg(positions=positions, max_positions=8)
    size = len(Vocab(tiny_spm))
    torch.manual_seed(0)
    save_model_dir(build_model(cfg, size, size), cfg, tmp_path / "m", tiny_spm, tiny_spm)
    long_line = " ".join(tiny_sentences(4, seed=1))
    assert len(Vocab(tiny_spm).encode(long_line)) > 12
    options = TranslateOptions(beam_size=2, max_len_a=0.0, max_len_b=12, device="cpu", dtype="float32")
    translator = Translator(TorchEngine.from_loaded([load_model_dir(tmp_path / "m")], options), options)
    out = translator.translate([long_line, "the cat"])
    assert len(out) == 2 and translator.truncated == 1 and translator.input_limit == 8
    huge = " ".join(tiny_sentences(3000, seed=2))
    assert len(huge) > 8 * 64
    assert translator.encode([huge, "the cat"]) == [Vocab(tiny_spm).encode(huge)[:8], Vocab(tiny_spm).encode("the cat")]
    assert translator.truncated == 2
    import dataclasses

    longer = dataclasses.replace(options, max_source_len=12)  # --max-source-len: up to a table's length
    translator = Translator(TorchEngine.from_loaded([load_model_dir(tmp_path / "m")], longer), longer)
    assert translator.input_limit == (12 if positions in ("alibi", "rope") else 8)
    assert len(translator.encode([long_line])[0]) == translator.input_limit


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_position_tables_refuse_long_training_sentences(tmp_path, positions):
    import yaml

    from conftest import reversal_pairs, tiny_recipe, write_prepared
    from support.cli import run_cli

    write_prepared(tmp_path, reversal_pairs(60, 0, length=6), reversal_pairs(5, 1, length=6))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(tmp_path, model={"positions": positions, "max_positions": 5})))
    done = run_cli("train", str(recipe))
    err = done.stderr.decode()
    assert done.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert "model.max_positions=5" in err and f"model.positions={positions}" in err
    assert not (tmp_path / "train" / "checkpoints").exists()


# -- Mixture of Experts ------------------------------------------------------------------------

def moe_layer(experts: int = 4, top_k: int = 2, capacity: float = 0.0, kind: str = "relu") -> MoEFeedForward:
    torch.manual_seed(0)
    return MoEFeedForward(8, 16, kind, 0.0, experts, top_k, capacity, "encoder.0")


def test_all_experts_with_a_uniform_router_are_the_mean_of_the_experts():
    layer = moe_layer(experts=3, top_k=3).eval()
    with torch.no_grad():
        layer.router.weight.zero_()
        x = torch.randn(2, 5, 8)
        expected = torch.stack([expert(x) for expert in layer.experts]).mean(0)
        torch.testing.assert_close(layer(x), expected)


def test_top1_scales_by_the_router_probability_and_topk_renormalises():
    layer = moe_layer(experts=4, top_k=1).eval()
    x = torch.randn(6, 8)
    with torch.no_grad():
        probs = layer.router(x).softmax(-1)
        best = probs.argmax(-1)
        expected = torch.stack([layer.experts[e](x[i]) * probs[i, e] for i, e in enumerate(best.tolist())])
        torch.testing.assert_close(layer(x[None])[0], expected)
        layer.top_k = 2
        top_p, top_e = probs.topk(2, -1)
        expected = torch.stack([sum(layer.experts[e](x[i]) * p / top_p[i].sum()
                                    for p, e in zip(top_p[i], top_e[i].tolist())) for i in range(6)])
        torch.testing.assert_close(layer(x[None])[0], expected)


def test_aux_loss_is_one_when_uniform_and_rises_as_routing_collapses():
    layer = moe_layer(experts=4, top_k=1)
    x = torch.randn(1, 50, 8)
    x[..., 0] = x[..., 0].abs() + 1  # a feature every token has
    values = []
    for pull in (0.0, 0.3, 1.0, 3.0, 100.0):  # the router leans ever harder on expert 0
        with torch.no_grad():
            layer.router.weight.zero_()
            layer.router.weight[0, 0] = pull
        stats: list = []
        layer(x, stats=stats)
        values.append(stats[0].aux_loss.item())
    assert values[0] == pytest.approx(1.0)
    assert values == sorted(values) and values[-1] == pytest.approx(4.0, abs=0.05)


def test_capacity_drops_and_counts_only_in_training():
    layer = moe_layer(experts=2, top_k=1, capacity=1.0)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0, 0] = 10.0
    x = torch.randn(1, 10, 8)
    x[..., 0] = x[..., 0].abs() + 1  # every token prefers expert 0
    keep = torch.ones(1, 10, dtype=torch.bool)
    keep[0, 8:] = False  # padding is not routed: 8 real tokens, capacity ceil(1.0 * 8 / 2) = 4
    stats: list = []
    out = layer.train()(x, keep, stats)
    assert stats[0].dropped.item() == 4 and stats[0].load.tolist() == [8, 0]
    assert (out[0, :4] != 0).all() and (out[0, 4:] == 0).all()  # first come, first served
    stats = []
    layer.eval()(x, keep, stats)
    assert stats[0].dropped.item() == 0


def test_active_parameters_count_the_routed_experts_only():
    dense = build_model(tiny_cfg(), V, V)
    moe = build_model(tiny_cfg(moe_experts=4, moe_top_k=2, moe_every=2), V, V)  # layer 1 of each stack
    ffn = sum(p.numel() for p in dense.encoder[0].ffn.parameters())
    router = 16 * 4
    assert moe.num_parameters() == dense.num_parameters() + 2 * (router + 3 * ffn)
    assert moe.active_parameters() == dense.num_parameters() + 2 * (router + 1 * ffn)
    assert dense.active_parameters() == dense.num_parameters()


def test_key_dim_attention_matches_the_formula_and_only_q_k_shrink():
    """softmax(q k^T / sqrt(d_k)) v per head, with q and k of d_k and v of d_model / heads."""
    from nmtkit.models.layers import Attention

    torch.manual_seed(0)
    dim, heads, key_dim = 16, 2, 3
    attn = Attention(dim, heads, key_dim=key_dim).eval()
    x = torch.randn(2, 5, dim)
    q, k, v = attn.project_qkv(x)
    assert q.shape == k.shape == (2, heads, 5, key_dim) and v.shape == (2, heads, 5, dim // heads)
    out = attn.attend(q, k, v)
    w = attn.qkv_proj.weight
    wq, wk, wv = w[:heads * key_dim], w[heads * key_dim:2 * heads * key_dim], w[2 * heads * key_dim:]
    bq, bk, bv = attn.qkv_proj.bias.split([heads * key_dim, heads * key_dim, dim])
    expected = []
    for h in range(heads):
        qh = (x @ wq.T + bq)[..., h * key_dim:(h + 1) * key_dim]
        kh = (x @ wk.T + bk)[..., h * key_dim:(h + 1) * key_dim]
        vh = (x @ wv.T + bv)[..., h * 8:(h + 1) * 8]
        expected.append(torch.softmax(qh @ kh.transpose(1, 2) / math.sqrt(key_dim), -1) @ vh)
    expected = attn.out_proj(torch.cat(expected, -1))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_key_dim_changes_only_the_query_and_key_projections():
    """The paper's Table 3 row (B): d_k 16 or 32 at 8 heads takes 65M to 58M / 60M; here the
    same 2 x (d + 1) x (d - heads x d_k) fewer weights in each of the 18 attentions."""
    from nmtkit.config import from_dict

    def size(**kw):
        cfg = from_dict({"data": {"source": "hf"}, "model": {"preset": "transformer-base", **kw}}).model
        return build_model(cfg, 37000, 37000).num_parameters()

    base = size()
    assert base == 63_082_496
    assert size(key_dim=64) == base
    for key_dim in (16, 32):
        assert size(key_dim=key_dim) == base - 18 * 2 * 513 * (512 - 8 * key_dim)
    assert size(key_dim=16) == 55_990_784  # ~58M with the paper's larger vocabulary


@pytest.mark.parametrize("overrides, fragment", [
    ({"moe_experts": 2, "moe_top_k": 3}, "model.moe_top_k"),
    ({"moe_experts": 2, "moe_every": 0}, "model.moe_every"),
    ({"positions": "rope", "d_model": 18, "heads": 2, "ffn_dim": 8}, "must be even"),
    ({"positions": "rope", "key_dim": 5}, r"model.key_dim \(5\) must be even"),
    ({"key_dim": -1}, "model.key_dim"),
    ({"positions": "absolute"}, "model.positions"),
])
def test_bad_variant_settings_are_config_errors(overrides, fragment):
    from nmtkit.config import from_dict
    from nmtkit.errors import ConfigError

    with pytest.raises(ConfigError, match=fragment):
        from_dict({"data": {"source": "files"}, "model": overrides})


def test_moe_training_logs_router_statistics_and_plots_them(tmp_path):
    import json

    from conftest import reversal_pairs, tiny_recipe, write_prepared
    from nmtkit.config import from_dict
    from nmtkit.runtime.console import get_console
    from nmtkit.training.trainer import train
    from nmtkit.viz.curves import layer_series, plot_curves

    write_prepared(tmp_path, reversal_pairs(200, 0, length=5), reversal_pairs(10, 1, length=5))
    recipe = tiny_recipe(tmp_path, model={"moe_experts": 3, "moe_top_k": 1, "moe_every": 2, "moe_z_weight": 1e-3,
                                          "moe_capacity_factor": 1.0, "positions": "alibi", "ffn": "gelu"},
                         train={"max_steps": 10, "log_every": 5, "validate_every": 10, "save_every": 10})
    run_dir = train(from_dict(recipe), get_console(-1))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if r["type"] == "train"]
    assert len(logged) == 2
    for record in logged:
        assert set(record["moe_load"]) == {"encoder.1", "decoder.1"} == set(record["moe_aux_layers"])
        for shares in record["moe_load"].values():
            assert len(shares) == 3 and sum(shares) == pytest.approx(1.0, abs=1e-3)
        assert 0 < record["moe_aux"] <= 3  # E * sum_e f_e P_e lies in (0, E]
        assert record["moe_dropped"] >= 0 and record["moe_z"] > 0
    assert set(layer_series(records, "moe_load", max, "step")) == {"encoder.1", "decoder.1"}
    plot_curves([run_dir], tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0
    meta = json.loads((run_dir / "best" / "config.json").read_text())
    assert meta["active_parameters"] < meta["parameters"]


def test_a_variant_runs_end_to_end_through_the_cli(tmp_path):
    """`nmtkit run` (prepare, train, average, translate, score), then `info`, `translate`, `--dry-run`."""
    import json

    from conftest import reversal_pairs, tiny_recipe, write_pairs
    from support.cli import run_cli

    files = {split: write_pairs(tmp_path, split, reversal_pairs(count, seed, length=5))
             for split, count, seed in (("train", 200, 0), ("dev", 8, 1), ("test", 8, 2))}
    recipe = tiny_recipe(tmp_path / "work", data={"files": files},
                         model={"positions": "rope", "ffn": "gelu", "moe_experts": 3, "moe_top_k": 1},
                         train={"max_steps": 10, "average_last": 2, "validate_every": 5, "save_every": 5})
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(recipe))
    done = run_cli("run", str(path))
    assert done.returncode == 0, done.stderr.decode()
    assert "test BLEU" in done.stdout.decode()
    model_dir = tmp_path / "work" / "train" / "averaged"
    card = json.loads(run_cli("info", str(model_dir), "--json").stdout)
    assert card["architecture"]["positions"] == "rope" and card["architecture"]["moe_experts"] == 3
    assert card["active_parameters"] < card["parameters"]
    out = run_cli("translate", "-m", str(model_dir), input="a b c\n\nd e f g h i j a b c d e f g\n")
    assert out.returncode == 0 and len(out.stdout.decode().split("\n")) == 4  # 3 lines, each ending in \n
    dry = run_cli("train", str(path), "--dry-run").stderr.decode()
    assert "active per token" in dry and f"{card['active_parameters']:,}" in dry
