"""fp16 training with dynamic loss scaling, run on CPU (PyTorch autocasts to float16 there too).

A huge initial scale forces overflows: each is skipped, counted and halves the scale; the
scale is part of the checkpoint, so a run stopped mid-search resumes to the same weights.
"""
from __future__ import annotations

import shutil

import pytest
import torch

from conftest import tiny_recipe
from nmtkit.config import from_dict
from nmtkit.runtime.console import get_console

HUGE_SCALE = 2.0 ** 40  # the tiny model's gradients overflow fp16 at any scale above ~2^26


def _train(workdir, **train):
    from nmtkit.training.trainer import train as run_train

    cfg = from_dict(tiny_recipe(workdir, model={"d_model": 16, "ffn_dim": 32, "encoder_layers": 1,
                                                "decoder_layers": 1},
                                train={"dtype": "fp16", "max_tokens": 200, **train}))
    return run_train(cfg, get_console(-1))


def _copy_task(prepared_task, workdir):
    shutil.copytree(prepared_task / "prepared", workdir / "prepared")
    return workdir


def test_loss_scaler_is_a_pass_through_except_for_fp16():
    from nmtkit.training.precision import LossScaler

    for dtype in (torch.float32, torch.bfloat16):
        scaler = LossScaler(dtype, torch.device("cpu"))
        loss = torch.tensor(3.0)
        assert not scaler.enabled and scaler.scaled(loss) is loss and scaler.state() == {}
    fp16 = LossScaler(torch.float16, torch.device("cpu"))
    assert fp16.enabled and fp16.scaled(torch.tensor(3.0)).item() == 3.0 * 2 ** 16


def test_fp16_overflows_are_skipped_counted_and_halve_the_scale(prepared_task, tmp_path, monkeypatch):
    from nmtkit.training import precision
    from nmtkit.training.checkpoint import latest_checkpoint

    monkeypatch.setattr(precision, "INITIAL_SCALE", HUGE_SCALE)
    run_dir = _train(_copy_task(prepared_task, tmp_path), max_steps=6, save_every=3)
    ck = latest_checkpoint(run_dir)
    skipped = ck.trainer.skipped_steps
    assert ck.trainer.step == 6 and skipped >= 10  # at least 2^40 -> 2^30 before the gradients fit
    # no growth within GROWTH_INTERVAL good steps: the scale is the initial one halved once per skip
    assert ck.trainer.loss_scaler == {"scale": HUGE_SCALE * 0.5 ** skipped, "growth_tracker": 6}
    assert all(torch.isfinite(w).all() for w in ck.weights.values())


def test_fp16_resume_mid_search_gives_identical_weights(prepared_task, tmp_path, monkeypatch):
    from nmtkit.training import precision
    from nmtkit.training.checkpoint import latest_checkpoint

    monkeypatch.setattr(precision, "INITIAL_SCALE", HUGE_SCALE)
    whole = _train(_copy_task(prepared_task, tmp_path / "whole"), max_steps=8)
    split = _copy_task(prepared_task, tmp_path / "split")
    _train(split, max_steps=3)  # stops after the overflow search, with a lowered scale in the checkpoint
    _train(split, max_steps=8)
    a, b = latest_checkpoint(whole), latest_checkpoint(split / "train")
    assert a.trainer.skipped_steps == b.trainer.skipped_steps > 0
    assert a.trainer.loss_scaler == b.trainer.loss_scaler
    for name in a.weights:
        assert torch.equal(a.weights[name], b.weights[name]), name


def test_fp16_gradients_non_finite_at_scale_one_stop_training(prepared_task, tmp_path, monkeypatch):
    import nmtkit.training.loss as loss_module
    import nmtkit.training.trainer as trainer_module
    from nmtkit.training import precision

    real = loss_module.projected_smoothed_loss
    monkeypatch.setattr(loss_module, "projected_smoothed_loss",
                        lambda *args: (real(*args)[0] * float("nan"), real(*args)[1]))
    monkeypatch.setattr(precision, "INITIAL_SCALE", 2.0 ** 3)
    with pytest.raises(trainer_module.TrainingStopped, match="3 consecutive non-finite updates"):
        _train(_copy_task(prepared_task, tmp_path), max_steps=20, max_bad_steps=3)


def test_a_damaged_loss_scaler_state_is_a_checkpoint_error():
    from nmtkit.errors import CheckpointError
    from nmtkit.training.precision import LossScaler

    scaler = LossScaler(torch.float16, torch.device("cpu"))
    scaler.load({"scale": 1024.0, "growth_tracker": 7})
    assert scaler.scale == 1024.0 and scaler.state() == {"scale": 1024.0, "growth_tracker": 7}
    for bad in ({"scale": float("inf"), "growth_tracker": 0}, {"scale": "x", "growth_tracker": 0}, {"scale": 2.0}):
        with pytest.raises(CheckpointError, match="loss scaler"):
            scaler.load(bad)
