"""The chunked output layer + loss against the unchunked one (the logits of every position at once):
the same loss, NLL and gradients, for tied and untied output layers of both architectures, with
several chunks (a partial one included) and padding that never reaches the output layer."""
from __future__ import annotations

import pytest
import torch

from nmtkit.config import ModelConfig
from nmtkit.models.build import build_model
from nmtkit.specials import BOS, PAD
from nmtkit.training import loss as loss_module
from nmtkit.training.loss import TrainingLoss, label_smoothed_loss, projected_smoothed_loss

V = 23


def padded_targets(seed: int, batch: int = 3, length: int = 7) -> torch.Tensor:
    """[batch, length] targets with padding at the ends of rows 1 and 2 (9 of 21 positions)."""
    target = torch.randint(4, V, (batch, length), generator=torch.Generator().manual_seed(seed))
    target[1, 4:] = PAD
    target[2, 1:] = PAD
    return target


def grads_of(tensors) -> list:
    return [t.grad.clone() for t in tensors]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_chunked_output_layer_and_loss_equal_the_unchunked_ones(monkeypatch, bias, smoothing):
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 5 * V)  # 5 rows a chunk: 12 real rows -> 5 + 5 + 2
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, V, bias=bias)
    hidden = torch.randn(3, 7, 8, requires_grad=True)
    target = padded_targets(1)
    leaves = [hidden, *layer.parameters()]

    loss, nll = projected_smoothed_loss(hidden, layer, target, smoothing)
    (loss * 0.37).backward()  # the trainer scales the loss before backward: the gradients follow
    chunked = grads_of(leaves)
    for leaf in leaves:
        leaf.grad = None
    ref_loss, ref_nll = label_smoothed_loss(layer(hidden), target, smoothing)
    (ref_loss * 0.37).backward()

    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-6, atol=0)
    assert not nll.requires_grad
    for got, expected in zip(chunked, grads_of(leaves)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    assert chunked[0][1, 4:].abs().max() == 0 and chunked[0][2, 1:].abs().max() == 0  # padding gets nothing


def test_chunks_are_bounded_and_padding_never_reaches_the_output_layer(monkeypatch):
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 5 * V)
    shapes = []
    real_linear = torch.nn.functional.linear

    def linear(x, weight, bias=None):
        shapes.append(tuple(x.shape))
        return real_linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", linear)
    layer = torch.nn.Linear(8, V, bias=False)
    projected_smoothed_loss(torch.randn(3, 7, 8, requires_grad=True), layer, padded_targets(1), 0.1)[0].backward()
    assert shapes == [(5, 8), (5, 8), (2, 8)]  # 12 real targets of 21 positions, 5 rows (5 * V logits) a chunk


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_writing_the_log_probabilities_over_the_logits_changes_no_bit(monkeypatch, dtype, bias, smoothing):
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 5 * V)
    rows, weight = torch.randn(12, 8) * 3, torch.randn(V, 8)
    bias_ = torch.randn(V) if bias else None
    target = torch.randint(4, V, (12,), generator=torch.Generator().manual_seed(2))
    in_place = loss_module._chunked_loss(rows, weight, bias_, target, smoothing, dtype, True)
    real = loss_module._log_softmax
    monkeypatch.setattr(loss_module, "_log_softmax", lambda logits, _in_place: real(logits, False))
    apart = loss_module._chunked_loss(rows, weight, bias_, target, smoothing, dtype, True)
    for a, b in zip([*in_place[0], *in_place[1]], [*apart[0], *apart[1]]):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_a_chunk_costs_one_float32_vocabulary_buffer_and_passes_only_where_the_loss_needs_them(monkeypatch, smoothing):
    """On a CPU the log-probabilities overwrite the logits (same numbers), and without smoothing
    the uniform part's mean and subtraction over [rows, V] are not computed at all."""
    from torch.utils._python_dispatch import TorchDispatchMode

    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 5 * V)
    x = torch.randn(6, V) * 4
    out = x.clone()
    assert loss_module._log_softmax(out, True).data_ptr() == out.data_ptr()
    assert torch.equal(out, torch.log_softmax(x, dim=-1))
    assert loss_module._log_softmax(x, False).data_ptr() != x.data_ptr()

    class Wide(TorchDispatchMode):  # the ops that make a new float32 [rows, V] tensor, by name
        def __init__(self):
            super().__init__()
            self.made, self.in_place = [], []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if isinstance(result, torch.Tensor) and result.dim() == 2 and result.size(1) == V:
                self.made.append(name)
            if name == "mean" and args[0].dim() == 2 and args[0].size(1) == V:
                self.made.append("mean over the vocabulary")
            if name == "log_softmax":
                self.in_place.append(result.data_ptr() == args[0].data_ptr())
            return result

    layer = torch.nn.Linear(8, V, bias=False)
    with Wide() as mode:
        projected_smoothed_loss(torch.randn(3, 7, 8, requires_grad=True), layer, padded_targets(1), smoothing)
    assert mode.in_place == [True, True, True]  # 12 real targets, 5 rows a chunk: 3 chunks
    assert mode.made.count("log_softmax") == 3 and "_to_copy" not in mode.made  # no float32 copy: already float32
    assert ("mean over the vocabulary" in mode.made) == bool(smoothing)
    assert ("sub_" in mode.made) == bool(smoothing)


def test_without_gradients_the_loss_is_the_same_and_nothing_is_saved(monkeypatch):
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 4 * V)
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, V)
    hidden, target = torch.randn(3, 7, 8), padded_targets(2)
    with torch.no_grad():
        loss, nll = projected_smoothed_loss(hidden, layer, target, 0.1)
        ref_loss, ref_nll = label_smoothed_loss(layer(hidden), target, 0.1)
    assert not loss.requires_grad
    torch.testing.assert_close((loss, nll), (ref_loss, ref_nll), rtol=1e-6, atol=0)


def tiny_model(seed: int, **model):
    cfg = ModelConfig(**{"d_model": 16, "ffn_dim": 32, "heads": 2, "encoder_layers": 1, "decoder_layers": 2,
                         "dropout": 0.0, "embed_dim": 16, "hidden_dim": 24, **model})
    torch.manual_seed(seed)
    return build_model(cfg, V, V)


MODELS = [dict(arch="transformer", tie_embeddings="all"), dict(arch="transformer", tie_embeddings="none"),
          dict(arch="transformer", pre_norm=True, tie_embeddings="decoder"),
          dict(arch="rnn", tie_embeddings="all", input_feed=True),  # step by step, readout projection, bias
          dict(arch="rnn", tie_embeddings="none", attention="luong-dot", input_feed=False)]  # whole sequence


@pytest.mark.parametrize("model_cfg", MODELS, ids=lambda m: ",".join(f"{k}={v}" for k, v in m.items()))
def test_training_loss_gives_every_parameter_the_gradient_of_the_unchunked_loss(monkeypatch, model_cfg):
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 5 * V)
    model = tiny_model(0, **model_cfg)
    src = torch.randint(4, V, (3, 6), generator=torch.Generator().manual_seed(3))
    src[2, 4:] = PAD
    tgt_out = padded_targets(4)
    tgt_in = torch.cat([torch.full((3, 1), BOS), tgt_out[:, :-1]], 1).masked_fill(tgt_out.eq(PAD), PAD)
    params = [p for p in model.parameters()]

    loss, nll = TrainingLoss(model, 0.1)(src, src.ne(PAD), tgt_in, tgt_out)
    (loss / 11).backward()
    chunked = grads_of(params)
    model.zero_grad(set_to_none=True)
    ref_loss, ref_nll = label_smoothed_loss(model(src, src.ne(PAD), tgt_in), tgt_out, 0.1)
    (ref_loss / 11).backward()

    torch.testing.assert_close((loss, nll), (ref_loss, ref_nll), rtol=1e-6, atol=0)
    for (name, _), got, expected in zip(model.named_parameters(), chunked, grads_of(params)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7, msg=lambda text: f"{name}: {text}")


def test_under_bf16_autocast_the_output_layer_runs_in_bf16_and_gradients_keep_their_dtypes(monkeypatch):
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 4 * V)
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, V)
    hidden = torch.randn(3, 7, 8, requires_grad=True)
    target = padded_targets(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = projected_smoothed_loss(hidden, layer, target, 0.1)
        ref_loss, _ = label_smoothed_loss(layer(hidden), target, 0.1)  # autocast's bf16 logits, float32 loss
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=1e-3, atol=0)  # chunked and whole bf16 matmuls round alike
    loss.backward()
    assert hidden.grad.dtype == layer.weight.grad.dtype == layer.bias.grad.dtype == torch.float32
    assert all(torch.isfinite(g).all() for g in (hidden.grad, layer.weight.grad, layer.bias.grad))
