"""The RNN encoder-decoder: masks, packing, incremental decoding, beam layout, and learning."""
from __future__ import annotations

import dataclasses
import itertools
import time

import pytest
import torch
import torch.nn.functional as F

from nmtkit.config import ModelConfig
from nmtkit.models.build import build_model
from nmtkit.models.rnn import RNNSeq2Seq, RNNState
from nmtkit.specials import BOS, EOS, PAD

V = 20
ATTENTIONS = ["bahdanau", "luong-dot", "luong-general", "none"]
CELLS = ["lstm", "gru", "rnn"]




def tiny_cfg(**kw) -> ModelConfig:
    base = dict(arch="rnn", embed_dim=16, hidden_dim=24, encoder_layers=2, decoder_layers=2, dropout=0.0)
    return ModelConfig(**{**base, **kw})


def tiny_model(seed: int = 0, **kw) -> RNNSeq2Seq:
    torch.manual_seed(seed)
    return build_model(tiny_cfg(**kw), V, V).eval()


def batch(seed: int = 0, b: int = 3, s: int = 7, t: int = 6):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (b, s), generator=g)
    src[0, 5:] = PAD  # sentence 0 is shorter
    src[2, 3:] = PAD  # and sentence 2 shorter still
    tgt = torch.randint(4, V, (b, t), generator=g)
    tgt[:, 0] = BOS
    return src, src.ne(PAD), tgt


def step_all(model, enc, state, tokens, need_attn=False):
    """Feed tokens [rows, T] one step at a time; returns logits [rows, T, V], last state."""
    steps = []
    for t in range(tokens.size(1)):
        logits, state = model.decode_step(tokens[:, t], enc, state, need_attn=need_attn)
        steps.append(logits)
    return torch.stack(steps, 1), state


EVERY = [dict(cell=c, attention=a, input_feed=f) for c, a, f in itertools.product(CELLS, ATTENTIONS, [True, False])]
SHAPES = [dict(bidirectional=False), dict(merge="sum"), dict(tie_embeddings="none"), dict(tie_embeddings="decoder"),
          dict(encoder_layers=1, decoder_layers=3), dict(embed_dim=24, attention="luong-dot", input_feed=False)]


def name(variant: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in variant.items())


@pytest.mark.parametrize("variant", EVERY + SHAPES, ids=name)
def test_incremental_decoding_equals_full_forward(variant):
    model = tiny_model(**variant)
    src, mask, tgt = batch()
    with torch.no_grad():
        full = model(src, mask, tgt)  # (B, T, V)
        enc = model.encode(src, mask)
        steps, _ = step_all(model, enc, model.init_state(enc), tgt)
    assert full.shape == (3, 6, V)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_attention_sums_to_one_and_ignores_padding(attention):
    model = tiny_model(attention=attention)
    src, mask, tgt = batch()
    with torch.no_grad():
        enc = model.encode(src, mask)
        state = model.init_state(enc, beam=2)
        for t in range(3):
            _, state = model.decode_step(tgt.repeat_interleave(2, 0)[:, t], enc, state, need_attn=True)
            attn = state.attn  # (B*beam, S)
            assert attn.shape == (6, src.size(1))
            torch.testing.assert_close(attn.sum(-1), torch.ones(6))
            assert attn.masked_select(~mask.repeat_interleave(2, 0)).eq(0).all()
        _, state = model.decode_step(tgt[:, 0].repeat_interleave(2, 0), enc, state)
        assert state.attn is None  # only computed when asked for
    if attention == "none":  # one-hot on the last real token
        assert attn.argmax(-1).tolist() == (mask.sum(1) - 1).repeat_interleave(2).tolist()


@pytest.mark.parametrize("variant", [dict(cell=c, attention=a) for c in CELLS for a in ATTENTIONS], ids=name)
def test_padded_batch_equals_one_by_one(variant):
    """Packed sequences: a sentence's results do not depend on its batch mates or extra padding."""
    model = tiny_model(**variant)
    src, mask, tgt = batch()
    wider = F.pad(src, (0, 4), value=PAD)  # four extra padding columns for everyone
    with torch.no_grad():
        together = model(src, mask, tgt)
        torch.testing.assert_close(model(wider, wider.ne(PAD), tgt), together, atol=1e-5, rtol=1e-5)
        enc_wide = model.encode(wider, wider.ne(PAD))
        for b in range(src.size(0)):
            alone = src[b:b + 1, :int(mask[b].sum())]
            torch.testing.assert_close(model(alone, alone.ne(PAD), tgt[b:b + 1]), together[b:b + 1],
                                       atol=1e-5, rtol=1e-5)
            enc = model.encode(alone, alone.ne(PAD))
            torch.testing.assert_close(enc_wide.memory[b, :alone.size(1)], enc.memory[0], atol=1e-5, rtol=1e-5)
        assert enc_wide.memory[~wider.ne(PAD)].eq(0).all()  # no state leaks into padding


@pytest.mark.parametrize("variant", [dict(attention=a, input_feed=f) for a in ATTENTIONS for f in (True, False)],
                         ids=name)
def test_beam_rows_share_one_encoder_copy(variant):
    """B*beam decoder rows against B encoder rows == each row against its own encoder copy."""
    model = tiny_model(**variant)
    src, mask, tgt = batch()
    beam = 3
    # different hypotheses within a beam: perturb the target tokens per row
    prev = tgt.repeat_interleave(beam, 0)
    prev[:, 1:] = (prev[:, 1:] + torch.arange(prev.size(0))[:, None]) % (V - 4) + 4
    with torch.no_grad():
        enc = model.encode(src, mask)
        state = model.init_state(enc, beam)
        assert state.h.shape[0] == src.size(0) * beam
        grouped, state = step_all(model, enc, state, prev, need_attn=True)
        enc1 = enc.select(torch.arange(src.size(0)).repeat_interleave(beam))
        single, state1 = step_all(model, enc1, model.init_state(enc1, 1), prev, need_attn=True)
    torch.testing.assert_close(grouped, single, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.attn, state1.attn, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cell", CELLS)
def test_state_select_reorders_every_field(cell):
    model = tiny_model(cell=cell, input_feed=True)
    src, mask, tgt = batch()
    beam = 2
    order = torch.tensor([1, 1, 3, 2, 5, 4])  # within each sentence's beam; rows may repeat, as in beam search
    with torch.no_grad():
        enc = model.encode(src, mask)
        prev = tgt.repeat_interleave(beam, 0)
        prev[1::2, 1:] = (prev[1::2, 1:] + 1) % (V - 4) + 4
        _, state = step_all(model, enc, model.init_state(enc, beam), prev[:, :3], need_attn=True)
        moved = state.select(order)
        for field in dataclasses.fields(RNNState):
            value = getattr(state, field.name)
            if value is None:
                assert cell != "lstm" or field.name != "c"
                continue
            torch.testing.assert_close(getattr(moved, field.name), value[order])
        # the next step from the reordered state == the reordered next step
        after, _ = model.decode_step(prev[:, 3], enc, state)
        after_moved, _ = model.decode_step(prev[order, 3], enc, moved)
    torch.testing.assert_close(after_moved, after[order], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("input_feed", [True, False])
def test_none_uses_only_the_final_encoder_state(input_feed):
    """The bottleneck model: the memory is never read, but the source still matters."""
    model = tiny_model(attention="none", input_feed=input_feed)
    src, mask, tgt = batch()
    with torch.no_grad():
        enc = model.encode(src, mask)
        base, _ = step_all(model, enc, model.init_state(enc), tgt)
        scrambled = dataclasses.replace(enc, memory=torch.randn_like(enc.memory) * 10)
        again, _ = step_all(model, scrambled, model.init_state(scrambled), tgt)
        torch.testing.assert_close(again, base, atol=0, rtol=0)
        other = src.clone()
        other[1, 0] = (other[1, 0] + 1 - 4) % (V - 4) + 4  # the first token enters the final states
        changed = model(other, mask, tgt)
    assert not torch.allclose(changed[1], base[1])
    torch.testing.assert_close(changed[0], base[0], atol=1e-6, rtol=1e-5)


def test_embedding_tying():
    model = tiny_model(tie_embeddings="all", embed_dim=16, hidden_dim=24)
    assert model.tgt_embed is model.src_embed and model.output_proj.weight is model.src_embed.weight
    assert model.readout_proj.weight.shape == (16, 24)  # h~ projected to embed_dim before the tied layer
    decoder = tiny_model(tie_embeddings="decoder")
    assert decoder.tgt_embed is not decoder.src_embed and decoder.output_proj.weight is decoder.tgt_embed.weight
    untied = tiny_model(tie_embeddings="none")
    assert untied.output_proj.weight is not untied.tgt_embed.weight
    assert decoder.num_parameters() == untied.num_parameters() - (V * 24 - 16 * 24)
    assert model.max_positions is None
    with pytest.raises(ValueError, match="joint"):
        build_model(tiny_cfg(tie_embeddings="all"), V, V + 1)


def test_lstm_state_shapes_and_gru_has_no_cell():
    src, mask, _ = batch()
    lstm = tiny_model(cell="lstm", decoder_layers=3)
    state = lstm.init_state(lstm.encode(src, mask), beam=4)
    assert state.h.shape == state.c.shape == (12, 3, 24) and state.input_feed.shape == (12, 24)
    gru = tiny_model(cell="gru", input_feed=False)
    state = gru.init_state(gru.encode(src, mask))
    assert state.c is None and state.input_feed is None


@pytest.mark.parametrize("variant", [dict(cell=c, attention=a, input_feed=f) for c, a, f in
                                     [("lstm", "bahdanau", True), ("gru", "luong-dot", False),
                                      ("rnn", "luong-general", True), ("lstm", "none", False)]], ids=name)
def test_training_step_reaches_every_parameter(variant):
    """With dropout on, every parameter gets a gradient (DDP rejects unused ones)."""
    model = tiny_model(dropout=0.3, **variant).train()
    src, mask, tgt = batch()
    logits = model(src, mask, tgt)
    F.cross_entropy(logits.flatten(0, 1), tgt.roll(-1, 1).flatten(), ignore_index=PAD).backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not unused


@pytest.mark.parametrize("tie", ["all", "decoder"])
def test_model_dir_round_trip(tmp_path, tiny_spm, tie):
    from nmtkit.modeldir import load_model_dir, save_model_dir

    cfg = tiny_cfg(tie_embeddings=tie, attention="bahdanau")
    torch.manual_seed(0)
    model = build_model(cfg, 40, 40).eval()
    save_model_dir(model, cfg, tmp_path / "m", tiny_spm, tiny_spm)
    loaded = load_model_dir(tmp_path / "m")
    assert loaded.model_cfg == cfg
    src, mask, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(src, mask, tgt), model(src, mask, tgt), atol=0, rtol=0)
    assert loaded.model.output_proj.weight is loaded.model.tgt_embed.weight


# ---- learning: the synthetic reversal task ---------------------------------------------------

SYMBOLS = 10  # ids 4 .. 13


def reversal_batch(size: int, gen: torch.Generator):
    """Sequences of 6-8 symbols and their reversals: src, tgt_in (BOS y), tgt_out (y EOS)."""
    lengths = torch.randint(6, 9, (size,), generator=gen)
    src = torch.full((size, 8), PAD)
    tgt_in = torch.full((size, 9), PAD)
    tgt_out = torch.full((size, 9), PAD)
    tgt_in[:, 0] = BOS
    for i, n in enumerate(lengths.tolist()):
        seq = torch.randint(4, 4 + SYMBOLS, (n,), generator=gen)
        src[i, :n] = seq
        tgt_in[i, 1:n + 1] = seq.flip(0)
        tgt_out[i, :n] = seq.flip(0)
        tgt_out[i, n] = EOS
    return src, tgt_in, tgt_out


def greedy(model, src: torch.Tensor, max_len: int) -> torch.Tensor:
    enc = model.encode(src, src.ne(PAD))
    state = model.init_state(enc)
    prev = torch.full((src.size(0),), BOS)
    out = []
    for _ in range(max_len):
        logits, state = model.decode_step(prev, enc, state)
        prev = logits.argmax(-1)
        out.append(prev)
    return torch.stack(out, 1)


def exact_match(pred: torch.Tensor, tgt_out: torch.Tensor) -> float:
    """Share of sentences whose greedy output up to and including EOS equals the reference."""
    length = tgt_out.ne(PAD).sum(1)
    hits = [pred[i, :n].equal(tgt_out[i, :n]) for i, n in enumerate(length.tolist())]
    return sum(hits) / len(hits)


@pytest.mark.parametrize("attention", ["bahdanau", "luong-dot", "luong-general"])
def test_learns_reversal(attention):
    """A tiny LSTM with attention learns to reverse 6-8 symbols (>90% exact match, greedy, on 300
    held-out lines checked every 100 updates: training stops at the first check that clears the bar)."""
    torch.manual_seed(0)
    cfg = tiny_cfg(cell="lstm", attention=attention, embed_dim=32, hidden_dim=64, encoder_layers=1,
                   decoder_layers=1, input_feed=True)
    model = build_model(cfg, 4 + SYMBOLS, 4 + SYMBOLS)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    test_src, _, test_out = reversal_batch(300, torch.Generator().manual_seed(99))
    start, accuracy = time.monotonic(), 0.0
    for step in range(1, 1201):
        model.train()
        src, tgt_in, tgt_out = reversal_batch(64, gen)
        logits = model(src, src.ne(PAD), tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0:
            model.eval()
            with torch.no_grad():
                accuracy = exact_match(greedy(model, test_src, 9), test_out)
            if accuracy > 0.9:
                break
    print(f"{attention}: {accuracy:.3f} exact match after {step} steps, {time.monotonic() - start:.1f}s")
    assert accuracy > 0.9


@pytest.mark.parametrize("fallback", [False, True], ids=["as-probed", "float32-cells"])
@pytest.mark.parametrize("cell", CELLS)
def test_trains_and_decodes_under_cpu_bf16_autocast(cell, fallback, monkeypatch):
    """train.dtype bf16 on a CPU: every cell runs forward, backward and decoder steps under
    autocast, close to float32, also where the cells must run in float32 (an LSTM on a CPU
    without oneDNN's bf16 kernels; forced here with ``fallback`` on any CPU)."""
    from nmtkit.models import rnn

    if fallback:
        monkeypatch.setattr(rnn, "autocast_runs", lambda module_class, dtype, training: False)
    model = tiny_model(cell=cell).train()
    src, src_mask, tgt_in = batch()
    want = model(src, src_mask, tgt_in).detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, src_mask, tgt_in).float()
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_in.roll(-1, 1).flatten(), ignore_index=PAD)
    torch.testing.assert_close(logits.detach(), want, atol=0.1, rtol=0.05)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None and torch.isfinite(p.grad).all()
                                        for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        enc = model.encode(src, src_mask)
        want = step_all(model, enc, model.init_state(enc), tgt_in)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            enc = model.encode(src, src_mask)
            got = step_all(model, enc, model.init_state(enc), tgt_in)[0]
    torch.testing.assert_close(got.float(), want, atol=0.1, rtol=0.05)


def test_an_rnn_autocast_cannot_run_runs_in_float32(monkeypatch):
    """Where the probe says the cell cannot run under CPU autocast, ``_call_rnn`` gives exactly what the
    float32 cell gives outside autocast, for packed inputs and (h, c) states."""
    from torch.nn.utils.rnn import pack_padded_sequence

    from nmtkit.models import rnn

    monkeypatch.setattr(rnn, "autocast_runs", lambda module_class, dtype, training: False)
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 8, num_layers=2, batch_first=True)
    x, h, c = torch.randn(3, 5, 8), torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    packed = pack_padded_sequence(x, torch.tensor([5, 2, 4]), batch_first=True, enforce_sorted=False)
    want_packed, (want_h, _) = lstm(packed)
    want_out, (_, want_c) = lstm(x, (h, c))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got_packed, (got_h, _) = rnn._call_rnn(lstm, packed)
        got_out, (_, got_c) = rnn._call_rnn(lstm, x.bfloat16(), (h.bfloat16(), c))
    assert got_packed.data.dtype == torch.float32 and torch.equal(got_packed.data, want_packed.data)
    assert torch.equal(got_h, want_h)
    # bf16 inputs, run in float32: exactly the float32 cell on the bf16-rounded values
    want_out, (_, want_c) = lstm(x.bfloat16().float(), (h.bfloat16().float(), c))
    assert got_out.dtype == got_c.dtype == torch.float32
    assert torch.equal(got_out, want_out) and torch.equal(got_c, want_c)


def test_the_autocast_probe_leaves_the_random_stream_alone():
    """The probe builds a cell with random weights; a training run's next random numbers (dropout,
    sampling) must not depend on whether the probe ran first (exact resume)."""
    from nmtkit.runtime.device import autocast_runs

    autocast_runs.cache_clear()
    torch.manual_seed(5)
    autocast_runs(torch.nn.LSTM, torch.bfloat16, True)
    after_probe = torch.rand(4)
    torch.manual_seed(5)
    assert torch.equal(after_probe, torch.rand(4))
