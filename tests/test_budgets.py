"""Compute budgets: the FLOP count from a model's shapes against torch's own FlopCounterMode (one
Transformer, one LSTM and one GRU shape), counted per real token, and training that stops at
train.max_flops / train.max_minutes, saves, and resumes the same budget."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from conftest import tiny_recipe
from nmtkit.config import ModelConfig
from nmtkit.config.loading import from_dict
from nmtkit.runtime.console import get_console
from nmtkit.models.build import build_model
from nmtkit.models.flops import flop_count

VOCAB = 40
SHAPES = {
    "transformer": ModelConfig(d_model=16, ffn_dim=32, heads=2, encoder_layers=2, decoder_layers=1, dropout=0.0),
    "transformer-swiglu-dk": ModelConfig(d_model=16, ffn_dim=24, heads=2, key_dim=4, encoder_layers=1, decoder_layers=2,
                                         dropout=0.0, ffn="swiglu", pre_norm=True),
    "lstm-bahdanau": ModelConfig(arch="rnn", embed_dim=16, hidden_dim=24, encoder_layers=2, decoder_layers=2,
                                 dropout=0.0, tie_embeddings="none"),
    "gru-luong": ModelConfig(arch="rnn", cell="gru", embed_dim=16, hidden_dim=24, encoder_layers=1, decoder_layers=1,
                             dropout=0.0, attention="luong-general", input_feed=False),
}


def measured(cfg, src_len: int, tgt_len: int, rows: int = 3) -> tuple[int, int]:
    """FlopCounterMode's (forward, forward + backward) FLOPs of ``rows`` unpadded sentences. oneDNN's
    fused RNN and the CPU flash-attention kernel are single ops the counter cannot see into, so
    they are switched off: the same products then run as the matrix multiplications it counts."""
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB, VOCAB).train()
    src, tgt = torch.randint(4, VOCAB, (rows, src_len)), torch.randint(4, VOCAB, (rows, tgt_len))
    mask = torch.ones(rows, src_len, dtype=torch.bool)
    with torch.backends.mkldnn.flags(enabled=False), sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as forward:
            model(src, mask, tgt)
        with FlopCounterMode(display=False) as both:
            model(src, mask, tgt).float().logsumexp(-1).sum().backward()
    return forward.get_total_flops(), both.get_total_flops()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_flop_count_matches_torchs_flop_counter(shape):
    cfg = SHAPES[shape]
    count = flop_count(cfg, VOCAB, VOCAB)
    for src_len, tgt_len in ((7, 5), (3, 9)):
        forward, both = measured(cfg, src_len, tgt_len)
        assert count.forward([src_len] * 3, [tgt_len] * 3) == forward
        # backward = 2 x forward for every product whose input needs a gradient; the RNNs' first
        # states and a few inputs need none, so they measure a little under 3 x
        assert count.training([src_len] * 3, [tgt_len] * 3) == 3 * forward
        assert 0.97 * count.training([src_len] * 3, [tgt_len] * 3) <= both <= count.training([src_len] * 3, [tgt_len] * 3)


def test_a_batch_counts_its_real_tokens_not_its_padding():
    """A padded batch costs what its sentences cost one by one (each measured unpadded)."""
    cfg = SHAPES["transformer"]
    count = flop_count(cfg, VOCAB, VOCAB)
    lengths = [(2, 6), (8, 3), (5, 5)]
    alone = sum(measured(cfg, s, t, rows=1)[0] for s, t in lengths)
    assert count.forward([s for s, _ in lengths], [t for _, t in lengths]) == alone
    assert count.forward([8, 8, 8], [6, 6, 6]) > alone  # what the padded tensors would have cost


def test_moe_layers_count_their_top_k_experts_and_router():
    dense = ModelConfig(d_model=16, ffn_dim=32, heads=2, encoder_layers=2, decoder_layers=2, dropout=0.0)
    moe = ModelConfig(d_model=16, ffn_dim=32, heads=2, encoder_layers=2, decoder_layers=2, dropout=0.0,
                      moe_experts=4, moe_top_k=2, moe_every=2)
    per_token_ffn = 2 * 16 * 32 * 2
    extra = per_token_ffn + 2 * 16 * 4  # one more expert and the router, in one layer of each stack
    d, m = flop_count(dense, VOCAB, VOCAB), flop_count(moe, VOCAB, VOCAB)
    assert (m.per_src - d.per_src, m.per_tgt - d.per_tgt) == (extra, extra)


def _train(workdir, **train):
    from nmtkit.training.trainer import train as run_train

    settings = {"log_every": 1, "validate_every": 100, "save_every": 100, "max_tokens": 200, **train}
    cfg = from_dict(tiny_recipe(workdir, model={"d_model": 16, "ffn_dim": 32, "encoder_layers": 1,
                                                "decoder_layers": 1}, train=settings))
    return run_train(cfg, get_console(-1))


def _train_records(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["type"] == "train"]


def _copy(prepared_task, path):
    shutil.copytree(prepared_task / "prepared", path / "prepared")
    return path


def test_max_flops_stops_at_the_first_update_that_reaches_it_and_resume_keeps_the_count(prepared_task, tmp_path):
    from nmtkit.training.checkpoint import latest_checkpoint

    free = _train(_copy(prepared_task, tmp_path / "free"), max_steps=9)
    spent = {r["step"]: r["train_flops"] for r in _train_records(free)}
    assert all(spent[step] < spent[step + 1] for step in range(1, 9))
    budget = _copy(prepared_task, tmp_path / "budget")
    run = _train(budget, max_flops=spent[5] - 1)  # reached by update 5
    assert latest_checkpoint(run).trainer.step == 5
    assert latest_checkpoint(run).trainer.train_flops == spent[5]
    _train(budget, max_flops=spent[8])  # a raised budget resumes, counting on from the saved FLOPs
    state = latest_checkpoint(run).trainer
    assert (state.step, state.train_flops) == (8, spent[8])
    assert [r["train_flops"] for r in _train_records(run)] == [spent[s] for s in range(1, 9)]


def test_max_minutes_stops_training_and_the_spent_time_is_saved(prepared_task, tmp_path):
    from nmtkit.training.checkpoint import latest_checkpoint

    run = _train(_copy(prepared_task, tmp_path / "timed"), max_minutes=1e-6, max_steps=50)
    state = latest_checkpoint(run).trainer
    assert state.step == 1 and state.train_seconds >= 6e-5
    again = _train(tmp_path / "timed", max_minutes=1e-6, max_steps=50)  # the budget is spent: nothing more
    assert latest_checkpoint(again).trainer.step == 1
