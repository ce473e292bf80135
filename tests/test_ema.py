"""The exponential moving average of the weights (training/ema.py) against a hand computation:
ema <- decay * ema + (1 - decay) * weights, kept in float32, tied weights once, integer
buffers left out, and the raw weights back after validation ran on the average."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from nmtkit.training.ema import ema_weights, fresh_ema, restored_ema, update_ema


class Tied(nn.Module):
    """Two layers sharing one weight (as tied embeddings do) and an integer buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(2, 3, bias=True)
        self.second = nn.Linear(2, 3, bias=False)
        self.second.weight = self.first.weight
        self.register_buffer("steps", torch.tensor(7))

    def fill(self, value: float) -> "Tied":
        with torch.no_grad():
            self.first.weight.fill_(value)
            self.first.bias.fill_(-value)
        return self


def test_the_average_starts_as_a_float32_copy_with_tied_weights_once_and_no_integer_buffers():
    model = Tied().fill(1.0).to(torch.bfloat16)
    ema = fresh_ema(model)
    assert sorted(ema) == ["first.bias", "first.weight"]
    assert all(tensor.dtype == torch.float32 for tensor in ema.values())
    assert torch.equal(ema["first.weight"], torch.ones(3, 2)) and torch.equal(ema["first.bias"], -torch.ones(3))
    model.fill(5.0)
    assert torch.equal(ema["first.weight"], torch.ones(3, 2))  # a copy, not a view of the weights


@pytest.mark.parametrize("decay, expected", [
    (0.5, [1.5, 2.75, 2.875]),  # 0.5 * 1 + 0.5 * 2; 0.5 * 1.5 + 0.5 * 4; 0.5 * 2.75 + 0.5 * 3
    (0.9, [1.1, 1.39, 1.551]),  # 0.9 * 1 + 0.1 * 2; 0.9 * 1.1 + 0.1 * 4; 0.9 * 1.39 + 0.1 * 3
    (0.0, [2.0, 4.0, 3.0]),  # no memory: the weights themselves
])
def test_each_update_moves_the_average_by_one_minus_decay_toward_the_weights(decay, expected):
    model = Tied().fill(1.0)
    ema = fresh_ema(model)
    for weight, average in zip([2.0, 4.0, 3.0], expected):
        update_ema(ema, model.fill(weight), decay)
        torch.testing.assert_close(ema["first.weight"], torch.full((3, 2), average), rtol=0, atol=1e-6)
        torch.testing.assert_close(ema["first.bias"], torch.full((3,), -average), rtol=0, atol=1e-6)


def test_a_bf16_model_is_averaged_in_float32():
    """bf16 cannot hold 1 + 2**-10: a bf16 average of tiny steps would never move, a float32 one does."""
    model = Tied().fill(1.0).to(torch.bfloat16)
    ema = fresh_ema(model)
    update_ema(ema, model.fill(1.0078125), 0.999)  # the next bf16 value above 1
    assert ema["first.weight"].dtype == torch.float32
    torch.testing.assert_close(ema["first.weight"], torch.full((3, 2), 1.0 + 0.001 * 0.0078125), rtol=0, atol=1e-7)


def test_validation_sees_the_average_and_training_gets_its_raw_weights_back():
    model = Tied().fill(2.0)
    ema = fresh_ema(Tied().fill(0.5))
    with ema_weights(model, ema):
        assert torch.equal(model.first.weight, torch.full((3, 2), 0.5))
        assert torch.equal(model.second.weight, torch.full((3, 2), 0.5))  # still tied
        assert int(model.steps) == 7
    assert torch.equal(model.first.weight, torch.full((3, 2), 2.0)) and model.second.weight is model.first.weight
    with pytest.raises(RuntimeError, match="validation failed"):
        with ema_weights(model, ema):
            raise RuntimeError("validation failed")
    assert torch.equal(model.first.bias, torch.full((3,), -2.0))
    with ema_weights(model, None):  # no average: the raw weights
        assert torch.equal(model.first.weight, torch.full((3, 2), 2.0))


def test_a_resumed_run_keeps_its_saved_average_or_starts_one_only_when_asked():
    model = Tied().fill(3.0)
    saved = {"first.weight": torch.full((3, 2), 1.25, dtype=torch.bfloat16), "first.bias": torch.zeros(3)}
    restored = restored_ema(saved, model, 0.999, torch.device("cpu"))
    assert restored["first.weight"].dtype == torch.float32 and torch.equal(restored["first.weight"],
                                                                           torch.full((3, 2), 1.25))
    assert torch.equal(restored_ema(None, model, 0.999, torch.device("cpu"))["first.weight"], torch.full((3, 2), 3.0))
    assert restored_ema(None, model, 0.0, torch.device("cpu")) is None
