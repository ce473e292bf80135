"""Training: schedules, loss, batching, exact resume, checkpoints, averaging, dry run."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import reversal_pairs, tiny_recipe, write_prepared
from nmtkit.config import TrainConfig, from_dict
from nmtkit.data.batching import collate, make_batches
from nmtkit.data.ids import load_split
from nmtkit.runtime.console import get_console
from nmtkit.specials import BOS, EOS, PAD
from nmtkit.training.loss import label_smoothed_loss
from nmtkit.training.schedule import learning_rate
from support.cli import run_cli


def test_noam_schedule_values():
    cfg = TrainConfig(schedule="noam", lr=1.0, warmup=4000)
    # lrate = d^-0.5 * min(step^-0.5, step * warmup^-1.5)
    assert learning_rate(1, cfg, 512) == pytest.approx(512 ** -0.5 * 4000 ** -1.5)
    assert learning_rate(4000, cfg, 512) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)  # the peak, ~7.0e-4
    assert learning_rate(16000, cfg, 512) == pytest.approx(512 ** -0.5 * 16000 ** -0.5)
    assert learning_rate(4000, cfg, 512) > learning_rate(3999, cfg, 512)
    assert learning_rate(4000, cfg, 512) > learning_rate(4001, cfg, 512)


def test_inverse_sqrt_schedule_values():
    cfg = TrainConfig(schedule="inverse_sqrt", lr=1e-3, warmup=100)
    assert learning_rate(50, cfg, 512) == pytest.approx(5e-4)
    assert learning_rate(100, cfg, 512) == pytest.approx(1e-3)
    assert learning_rate(400, cfg, 512) == pytest.approx(5e-4)


@pytest.mark.parametrize("schedule, halfway", [("cosine", 0.5e-3), ("linear", 0.5e-3)])
def test_decaying_schedules_warm_up_then_reach_zero_at_max_steps(schedule, halfway):
    cfg = TrainConfig(schedule=schedule, lr=1e-3, warmup=100, max_steps=1100)
    assert learning_rate(50, cfg, 512) == pytest.approx(5e-4)  # the same linear warm-up
    assert learning_rate(100, cfg, 512) == pytest.approx(1e-3)  # the peak
    assert learning_rate(600, cfg, 512) == pytest.approx(halfway)  # half way through the decay
    assert learning_rate(1100, cfg, 512) == pytest.approx(0.0, abs=1e-12)
    assert learning_rate(5000, cfg, 512) == pytest.approx(0.0, abs=1e-12)  # past max_steps: stays at 0
    quarter = learning_rate(350, cfg, 512) / 1e-3
    assert quarter == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)) if schedule == "cosine" else 0.75)


def test_label_smoothed_loss_matches_hand_computation():
    logits = torch.tensor([[[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4]]])  # (1, 2, V=4)
    target = torch.tensor([[2, PAD]])  # the second position is padding and must not count
    eps = 0.1
    logp = torch.log_softmax(logits[0, 0], -1)
    expected_nll = -logp[2]
    expected = (1 - eps) * expected_nll + eps * (-logp.mean())  # eps spread over all V classes
    loss, nll = label_smoothed_loss(logits, target, eps)
    assert nll.item() == pytest.approx(expected_nll.item(), rel=1e-6)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothed_loss_and_gradient_equal_cross_entropy(eps):
    """The hand-written backward against autograd through F.cross_entropy, padding included."""
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64).float().requires_grad_()
    target = torch.randint(4, 11, (3, 5))
    target[1, 3:] = PAD
    target[2, 0] = PAD
    loss, nll = label_smoothed_loss(logits, target, eps)
    (loss * 0.37).backward()
    reference = logits.detach().clone().requires_grad_()
    flat = reference.reshape(-1, 11)
    expected = F.cross_entropy(flat, target.reshape(-1), ignore_index=PAD, label_smoothing=eps, reduction="sum")
    (expected * 0.37).backward()
    expected_nll = F.cross_entropy(flat.detach(), target.reshape(-1), ignore_index=PAD, reduction="sum")
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert nll.item() == pytest.approx(expected_nll.item(), rel=1e-6) and not nll.requires_grad
    torch.testing.assert_close(logits.grad, reference.grad, rtol=1e-5, atol=1e-7)
    assert logits.grad[1, 3:].abs().max() == 0 and logits.grad[2, 0].abs().max() == 0  # padding gets nothing


def test_label_smoothed_loss_gradient_keeps_the_logits_dtype():
    logits = torch.randn(2, 3, 7).bfloat16().requires_grad_()
    loss, _ = label_smoothed_loss(logits, torch.tensor([[4, 5, 6], [4, PAD, PAD]]), 0.1)
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16 and torch.isfinite(logits.grad.float()).all()


def test_batches_respect_budget_and_cover_each_sentence_once():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 60, 1000), rng.integers(1, 60, 1000)
    batches = make_batches(src, tgt, max_tokens=500, seed=1, epoch=0)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(1000))
    for b in batches:
        assert len(b) * max(np.maximum(src[b], tgt[b] + 1)) <= 500
    # bucketing keeps padding low: real tokens fill most of each padded batch
    padded = sum(len(b) * max(np.maximum(src[b], tgt[b] + 1)) for b in batches)
    assert np.maximum(src, tgt + 1).sum() / padded > 0.9
    again = make_batches(src, tgt, max_tokens=500, seed=1, epoch=0)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    other = make_batches(src, tgt, max_tokens=500, seed=1, epoch=1)
    assert not all(np.array_equal(a, b) for a, b in zip(batches, other))


def test_collate_adds_bos_eos_and_pads(tmp_path):
    from nmtkit.data.ids import save_split

    save_split(tmp_path / "x.npz", [[5, 6, 7], [8]], [[9], [10, 11]])
    batch = collate(load_split(tmp_path / "x.npz"), np.array([0, 1]))
    assert batch.src.tolist() == [[5, 6, 7], [8, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 9, PAD], [BOS, 10, 11]]
    assert batch.tgt_out.tolist() == [[9, EOS, PAD], [10, 11, EOS]]
    assert batch.ntokens == 5


def test_collate_cuts_long_sources_keeping_a_final_eos(tmp_path):
    """An imported MarianMT model's sources end in EOS (as MarianTokenizer writes them): cut to
    the limit, they keep it last; sources without one keep their first pieces."""
    from nmtkit.data.ids import save_split

    save_split(tmp_path / "x.npz", [[5, 6, 7, 8, EOS], [5, 6, 7, 8, 9], [5, EOS]], [[9], [10], [11]])
    batch = collate(load_split(tmp_path / "x.npz"), np.array([0, 1, 2]), max_len=3)
    assert batch.src.tolist() == [[5, 6, EOS], [5, 6, 7], [5, EOS, PAD]]
    assert batch.tgt_out.tolist() == [[9, EOS], [10, EOS], [11, EOS]]


@pytest.fixture(scope="module")
def prepared_task(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("task")
    write_prepared(workdir, reversal_pairs(600, 0, length=6), reversal_pairs(40, 1, length=6))
    return workdir


def _train(workdir, restart=False, **train):
    from nmtkit.training.trainer import train as run_train

    cfg = from_dict(tiny_recipe(workdir, train=train))
    return run_train(cfg, get_console(-1), restart=restart)


def _weights(run_dir):
    from nmtkit.training.checkpoint import latest_checkpoint

    return latest_checkpoint(run_dir).weights


def test_resume_gives_identical_weights(prepared_task, tmp_path):
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        shutil.copytree(prepared_task / "prepared", d / "prepared")
    _train(a, max_steps=24)
    _train(b, max_steps=11)  # stops mid-epoch, between checkpoints
    _train(b, max_steps=24)  # resumes from step 11
    wa, wb = _weights(a / "train"), _weights(b / "train")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    steps = [json.loads(line)["step"] for line in (b / "train" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["type"] == "train"]
    assert steps == sorted(steps) and len(steps) == len(set(steps))


def test_damaged_newest_checkpoint_falls_back(prepared_task, tmp_path):
    import shutil

    from nmtkit.training.checkpoint import checkpoint_dirs, latest_checkpoint

    shutil.copytree(prepared_task / "prepared", tmp_path / "prepared")
    _train(tmp_path, max_steps=20, save_every=10)
    newest = checkpoint_dirs(tmp_path / "train")[-1]
    (newest / "trainer.safetensors").write_bytes(b"garbage")
    warnings = []
    ck = latest_checkpoint(tmp_path / "train", warn=warnings.append)
    assert ck.trainer.step == 10 and "step_00000020" in warnings[0]


def test_average_of_checkpoints(prepared_task, tmp_path):
    import shutil

    from nmtkit.modeldir import load_model_dir
    from nmtkit.training.checkpoint import average_checkpoints, checkpoint_dirs

    shutil.copytree(prepared_task / "prepared", tmp_path / "prepared")
    _train(tmp_path, max_steps=30, save_every=10)
    dirs = checkpoint_dirs(tmp_path / "train")[-2:]
    out = average_checkpoints(tmp_path / "train", 2)
    avg = load_model_dir(out).model.state_dict()
    one, two = (load_model_dir(d).model.state_dict() for d in dirs)
    name = "encoder.0.ffn.fc_in.weight"
    torch.testing.assert_close(avg[name], (one[name] + two[name]) / 2)
    warnings = []
    early = load_model_dir(average_checkpoints(tmp_path / "train", 3, tmp_path / "upto", warn=warnings.append,
                                               upto=20)).model.state_dict()
    first, second = (load_model_dir(d).model.state_dict() for d in checkpoint_dirs(tmp_path / "train")[:2])
    torch.testing.assert_close(early[name], (first[name] + second[name]) / 2)  # steps 10 and 20
    assert warnings == [f"--last 3: {tmp_path / 'train' / 'checkpoints'} holds only 2 checkpoint(s) up to step 20 "
                        f"(step_00000010 to step_00000020); averaging those 2"]
    from nmtkit.errors import CheckpointError

    for upto in (5, 25):  # not a saved step: refused, not the average up to the step before it
        with pytest.raises(CheckpointError) as refused:
            average_checkpoints(tmp_path / "train", 2, tmp_path / "none", upto=upto)
        assert str(refused.value) == (
            f"--upto {upto}: no checkpoint of step {upto}; {tmp_path / 'train' / 'checkpoints'} holds 3 checkpoint(s) "
            f"(step_00000010 to step_00000030): give one of their steps (a run keeps its last train.keep_last "
            f"checkpoints)")
    assert not (tmp_path / "none").exists()


def test_dry_run_and_unknown_key_via_cli(prepared_task, tmp_path):
    import yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(prepared_task)))
    out = run_cli("train", str(recipe), "--dry-run")
    assert out.returncode == 0, out.stderr.decode()
    assert "43,264" in out.stderr.decode()  # parameters: total of the tiny model
    bad = run_cli("train", str(recipe), "train.learning_rate=1")
    err = bad.stderr.decode()
    assert bad.returncode == 2 and "Traceback" not in err and "train.learning_rate" in err
    assert len(err.strip().splitlines()) == 1
    bad = run_cli("train", str(recipe), "model.heads=3")
    assert bad.returncode == 2 and "divisible" in bad.stderr.decode()
    bad = run_cli("train", str(recipe), "train.lr=-1")
    assert bad.returncode == 2 and "train.lr must be in (0, 100], got" in bad.stderr.decode()


def test_settings_left_unread_are_warned_of_and_restart_with_dry_run_is_refused(prepared_task, tmp_path):
    """A key that another setting leaves unread changes nothing: train says so, once per key,
    and still runs (a sweep switching train.schedule keeps its recipe's warm-up); keys at their
    defaults are not named."""
    import yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(prepared_task)))
    out = run_cli("train", str(recipe), "--dry-run", "train.schedule=constant", "train.dev_bleu_beam=4",
                  "model.moe_top_k=1")
    err = out.stderr.decode()
    assert out.returncode == 0, err
    assert "train.warmup (50) is not read: train.schedule is constant (no warm-up)" in err
    assert "train.dev_bleu_beam (4) is not read: train.best_metric is not bleu (no dev BLEU)" in err
    assert "model.moe_top_k (1) is not read: model.moe_experts is 0 (no MoE layers)" in err
    assert "is not read" not in run_cli("train", str(recipe), "--dry-run").stderr.decode()
    both = run_cli("train", str(recipe), "--dry-run", "--restart")
    assert (both.returncode, both.stderr.decode()) == (
        2, "nmtkit: error: --restart moves the previous run aside and --dry-run changes nothing: give one of them\n")


def test_dev_loss_falls(prepared_task, tmp_path):
    import shutil

    shutil.copytree(prepared_task / "prepared", tmp_path / "prepared")
    _train(tmp_path, max_steps=60, validate_every=20)
    valid = [json.loads(line) for line in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["dev_loss"] for r in valid if r["type"] == "valid"]
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.3
    assert all(math.isfinite(x) for x in losses)
    # each progress record carries the process's resident memory then: torch alone is > 100 MiB
    resident = [r["rss_mib"] for r in valid if r["type"] == "train"]
    assert resident and all(100 < mib < 64 * 1024 for mib in resident)


def test_patience_stops_training_after_that_many_validations_without_improvement(prepared_task, tmp_path,
                                                                                 monkeypatch):
    """Scripted dev losses: best, best, worse, best (the count starts again), worse, worse: with
    patience 2 training stops at the sixth validation, long before max_steps, and a second
    `train` of the same run does not go on."""
    import shutil

    from nmtkit.training import trainer
    from nmtkit.training.checkpoint import latest_checkpoint

    shutil.copytree(prepared_task / "prepared", tmp_path / "prepared")
    losses = iter([3.0, 2.9, 3.1, 2.8, 3.0, 3.2, 1.0, 0.5])
    monkeypatch.setattr(trainer, "dev_loss", lambda *a, **k: {"dev_loss": next(losses), "dev_ppl": 1.0})
    _train(tmp_path, max_steps=40, validate_every=2, save_every=2, log_every=2, patience=2)
    records = [json.loads(line) for line in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["type"] == "valid"]
    assert [r["step"] for r in valid] == [2, 4, 6, 8, 10, 12]
    assert [r["best"] for r in valid] == [True, True, False, True, False, False]
    assert max(r["step"] for r in records) == 12
    state = latest_checkpoint(tmp_path / "train").trainer
    assert (state.step, state.best_step, state.bad_validations) == (12, 8, 2)
    _train(tmp_path, max_steps=40, validate_every=2, save_every=2, log_every=2, patience=2)
    assert latest_checkpoint(tmp_path / "train").trainer.step == 12  # still stopped: no step taken
    monkeypatch.setattr(trainer, "dev_loss", lambda *a, **k: {"dev_loss": 3.0, "dev_ppl": 1.0})
    shutil.copytree(prepared_task / "prepared", tmp_path / "never" / "prepared")
    _train(tmp_path / "never", max_steps=8, validate_every=2, save_every=2, log_every=2, patience=0)
    assert latest_checkpoint(tmp_path / "never" / "train").trainer.step == 8  # patience 0: never stops early


def fake_run(root, model_dir, steps):
    """A run directory whose checkpoints are copies of ``model_dir`` (averaging reads model dirs only)."""
    import shutil

    for step in steps:
        shutil.copytree(model_dir, root / "checkpoints" / f"step_{step:08d}")
    return root


def test_average_refuses_checkpoints_over_another_vocabulary(tmp_path, model_dir):
    """Same architecture and shapes, another SentencePiece model: id 7 means another piece in
    each, so their average is no model."""
    from conftest import tiny_sentences
    from nmtkit.data.vocab import train_spm
    from nmtkit.errors import CheckpointError
    from nmtkit.storage.checksums import write_manifest
    from nmtkit.training.checkpoint import average_checkpoints

    run = fake_run(tmp_path / "run", model_dir, (10, 20))
    other = run / "checkpoints" / "step_00000010"
    train_spm([s.upper() for s in tiny_sentences(600, seed=5)], other / "spm.model", vocab_size=40)
    write_manifest(other, [p.name for p in other.iterdir() if p.name != "checksums.json"])
    with pytest.raises(CheckpointError) as refused:
        average_checkpoints(run, 2)
    assert str(refused.value) == (f"{other} has another vocabulary than step_00000020 (other SentencePiece models or "
                                  f"id maps); average checkpoints of one run")
    assert not (run / "averaged").exists()


def test_a_checkpoint_pruned_while_average_reads_it_is_said_to_have_vanished(tmp_path, model_dir, monkeypatch):
    import shutil

    import nmtkit.training.checkpoint as checkpoint
    from nmtkit.errors import CheckpointError

    run = fake_run(tmp_path / "run", model_dir, (10, 20))
    real = checkpoint.read_model_weights

    def pruned_meanwhile(path, meta):  # a training's prune_checkpoints got there first
        if path.name == "step_00000010":
            shutil.rmtree(path)
        return real(path, meta)

    monkeypatch.setattr(checkpoint, "read_model_weights", pruned_meanwhile)
    with pytest.raises(CheckpointError) as refused:
        checkpoint.average_checkpoints(run, 2)
    assert str(refused.value) == (f"{run / 'checkpoints' / 'step_00000010'} vanished while being read: a training of "
                                  f"this run is pruning its old checkpoints (train.keep_last); average again, or once "
                                  f"it has finished")
