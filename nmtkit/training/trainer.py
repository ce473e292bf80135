"""The training loop: token batches, accumulation, schedules, validation, checkpoints.

``train(cfg)`` resumes from the newest good checkpoint of ``WORKDIR/train`` unless
``restart``; a resumed run replays exactly the batches and random numbers an
uninterrupted run would have used. SIGINT/SIGTERM finish the current step, save and exit.
Under ``torchrun`` each rank takes its own micro-batches of every update (see distributed.py).
What comes before the first update (data, lock, resume) is in startup.py, the weight
average in ema.py, the metrics log in ``nmtkit.runlog``.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from nmtkit.config import Config, save_config
from nmtkit.config.rules import unread_settings
from nmtkit.data.batching import collate, make_batches
from nmtkit.data.mixing import corpus_weights, epoch_pairs
from nmtkit.decoding.options import TranslateOptions
from nmtkit.errors import CheckpointError, ConfigError, NmtkitError
from nmtkit.modeldir import read_meta, save_model_dir
from nmtkit.models.build import build_model
from nmtkit.models.flops import flop_count
from nmtkit.runlog import RESTART, MetricsLog, summary_writer_class
from nmtkit.runtime.compiler import maybe_compile
from nmtkit.runtime.device import autocast, resolve_device, resolve_dtype
from nmtkit.runtime.allocator import resident_mib
from nmtkit.training import distributed as dist
from nmtkit.storage.files import replace_directory
from nmtkit.training.checkpoint import (BEST_STAGED, TrainerState, checkpoint_dirs, prune_checkpoints, save_checkpoint,
                                        tidy_run_dir)
from nmtkit.training.ema import ema_weights, restored_ema, update_ema
from nmtkit.training.failures import TrainingStopped, out_of_memory_names, too_few_batches
from nmtkit.training.init_from import init_source, start_from
from nmtkit.training.loss import TrainingLoss
from nmtkit.training.optim import make_optimizer
from nmtkit.training.precision import LossScaler
from nmtkit.training.routing import RouterWindow, router_penalty
from nmtkit.training.schedule import learning_rate
from nmtkit.training.signals import StopFlag
from nmtkit.training.startup import (check_data, check_run_dir, load_training_data, newest_checkpoint, prepared_lock,
                                     prepared_vocabs, recorded_threads, refuse_beyond_table, restore, run_lock,
                                     training_threads)
from nmtkit.training.summary import print_dry_run, print_summary
from nmtkit.training.validation import dev_bleu, dev_loss
from nmtkit.workdir import RunDir, WorkDir


def train(cfg: Config, console, restart: bool = False, dry_run: bool = False) -> Optional[Path]:
    """Train (or resume) the recipe's model; returns the run directory. Under torchrun
    every process calls this and only rank 0 prints (see distributed.py)."""
    with dist.process_group(resolve_device(cfg.train.device)) as device:
        return _train(cfg, dist.rank_console(console), device, restart, dry_run)


def _train(cfg: Config, console, device: torch.device, restart: bool, dry_run: bool) -> Optional[Path]:
    dtype = resolve_dtype(cfg.train.dtype, device, cpu_fp16=True)
    if cfg.train.tensorboard:
        summary_writer_class()  # a missing package is found now, not at the first log step
    if cfg.train.best_metric == "bleu":  # a tokenizer's missing package (MeCab) is found now, not at validation
        from nmtkit.scoring.metrics import check_tokenizer

        check_tokenizer(cfg.eval.tokenizer(cfg.data.reference_language("dev")))
    for unread in unread_settings(cfg):
        console.warn(unread)
    if dry_run:
        if restart:
            raise ConfigError("--restart moves the previous run aside and --dry-run changes nothing: give one of them")
        print_dry_run(cfg, console, device, dtype)
        return None
    with prepared_lock(cfg):  # a `prepare` must not rewrite the data or vocabularies under the run
        return _train_locked(cfg, console, device, dtype, restart)


def _train_locked(cfg: Config, console, device: torch.device, dtype, restart: bool) -> Optional[Path]:
    src_path, tgt_path, src_vocab, tgt_vocab = prepared_vocabs(cfg)
    run_dir = WorkDir.of(cfg).run.path
    check_run_dir(run_dir, restart)
    with run_lock(run_dir):
        if restart and dist.is_main() and run_dir.exists():
            name = f"train.old-{time.strftime('%Y%m%d-%H%M%S')}"
            backup, n = run_dir.with_name(name), 1
            while os.path.lexists(backup):  # a second --restart within the same second
                n += 1
                backup = run_dir.with_name(f"{name}-{n}")
            os.replace(run_dir, backup)
            console.warn(f"--restart: moved the previous run to {backup}")
        dist.barrier()
        recorded = recorded_threads(run_dir) if device.type == "cpu" else 0
        threads = training_threads(cfg.train.threads, recorded, console) if device.type == "cpu" else 0
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, len(src_vocab), len(tgt_vocab))
        return Trainer(cfg, console, model, device, dtype, src_path, tgt_path, src_vocab, tgt_vocab, run_dir,
                       (threads, recorded)).run()



class Trainer:
    def __init__(self, cfg, console, model, device, dtype, src_path, tgt_path, src_vocab, tgt_vocab, run_dir,
                 threads: tuple[int, int] = (0, 0)):
        self.cfg, self.console, self.device, self.dtype = cfg, console, device, dtype
        # CPU threads this session trains with, and the count they were chosen to continue (training_threads)
        self.threads, self.threads_for = threads
        self.src_path, self.tgt_path, self.run_dir = src_path, tgt_path, run_dir
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.train_data, self.dev, self.dev_sources, self.dev_refs = load_training_data(
            cfg, (len(src_vocab), len(tgt_vocab)))
        # sentence lengths, computed once: every update needs its batches' target tokens
        self.src_lengths, self.tgt_lengths = self.train_data.src_lengths(), self.train_data.tgt_lengths()
        # several corpora: each epoch's pairs chosen by weight (data/mixing.py); None: every pair once
        self.corpus_weights = corpus_weights(self.train_data.corpus, cfg.data.corpora,
                                             WorkDir.of(cfg).ids("train"))
        self.sampler = None  # subword regularisation: the training ids re-segmented every epoch
        if cfg.train.subword_alpha > 0:
            from nmtkit.data.subword_sampling import SubwordSampler

            if hasattr(src_vocab, "original_ids"):  # sampling draws SentencePiece's own ids
                raise ConfigError("train.subword_alpha: an imported vocabulary (numbered by an id map) cannot be "
                                  "sampled; set train.subword_alpha: 0")

            t = cfg.train
            self.sampler = SubwordSampler(self.train_data, (src_vocab, tgt_vocab), cfg.vocab.type, t.subword_alpha,
                                          t.subword_nbest, t.seed, getattr(model, "max_positions", None),
                                          cfg.data.tags)
        self.model = model.to(device)
        # the model and its chunked loss as one module, in DDP under torchrun; the model's features are
        # compiled inside DDP, so gradient hooks and no_sync stay DDP's own. Checkpoints save self.model:
        # no wrapper's prefix in their weight names.
        features = (maybe_compile(self.model.features, device, console, "train.compile") if cfg.train.compile
                    else self.model.features)
        self.objective = dist.wrap(TrainingLoss(self.model, cfg.train.label_smoothing, features), device)
        self.model_dim = cfg.model.width  # the noam schedule's d_model
        self.flops = flop_count(cfg.model, len(src_vocab), len(tgt_vocab))  # training FLOPs per batch from its lengths
        self.max_len = getattr(model, "max_positions", None)
        m = cfg.model
        if self.max_len is not None:  # sinusoidal or learned positions: a table of max_positions
            # a sinusoidal run that began cutting such pairs (before they were refused) goes on as it began
            began = m.positions == "sinusoidal" and bool(checkpoint_dirs(run_dir))
            refuse_beyond_table(self.train_data, m.positions, self.max_len, WorkDir.of(cfg).ids("train"),
                                warn=console.warn if began else None)
        self.optimizer = make_optimizer(self.model, cfg, device)
        self.loss_scaler = LossScaler(dtype, device)  # fp16 only
        self.state = TrainerState(dev_sha256=self.dev.digest())
        self.ema: Optional[dict[str, torch.Tensor]] = None
        # the decode settings travel with every model directory, so `translate -m` decodes as the
        # recipe said; average_last is the default of `nmtkit average --last`
        self.meta = {"src_lang": cfg.data.src_lang, "tgt_lang": cfg.data.tgt_lang, "recipe": cfg.name,
                     "decode": dataclasses.asdict(cfg.decode), "average_last": cfg.train.average_last}
        self.metrics = MetricsLog(run_dir, cfg.train.tensorboard)
        routed = m.arch == "transformer" and m.moe_experts > 0
        self.router_window = RouterWindow(with_z=m.moe_z_weight > 0) if routed else None
        self.window = self._new_window()  # sums of the updates since the last train record
        self.window_seconds = 0.0  # its seconds before this session (a resumed window)

    # -- state ---------------------------------------------------------------------------------
    def _resume(self) -> None:
        """Go on from the newest good checkpoint, or start a new run (from train.init_from's weights
        when set). The data is compared with what the run started on before any checkpoint is
        read, so re-prepared data is named as such, not as damaged checkpoints."""
        if dist.is_main():
            tidy_run_dir(self.run_dir)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            check_data(self.run_dir, (self.src_path, self.tgt_path), self.train_data,
                       bool(checkpoint_dirs(self.run_dir)), self.console.warn)
        dist.barrier()
        ck = newest_checkpoint(self.cfg, self.run_dir, self.model, self.optimizer, self.console)
        self.resumed = ck is not None
        init = init_source(self.cfg) if ck is None else None
        if init is not None:  # a new fine-tuning run: the weights of train.init_from, a fresh optimizer and step
            self.meta["init_from"] = start_from(init, self.model, self.src_path, self.tgt_path, self.device)
            self.console.info(f"fine-tuning: starting from the weights of {init.path} (step {init.meta.get('step')})")
        if ck is not None:
            restore(ck, self.model, self.optimizer, self.device)
            self.state = ck.trainer
            self.loss_scaler.load(self.state.loss_scaler)
            dev = self.dev.digest()
            if self.state.dev_sha256 and self.state.dev_sha256 != dev and self.state.best_score is not None:
                self.console.warn(f"the dev set changed since step {self.state.best_step} scored the best "
                                  f"{self.state.best_score:.2f}: scores on it no longer compare, so the best score "
                                  f"and the early-stopping count start afresh (the next validation writes best/)")
                self.state.best_score, self.state.bad_validations = None, 0
            self.state.dev_sha256 = dev
            if "init_from" in ck.meta:  # a fine-tuning run: its own checkpoints say where it started
                self.meta["init_from"] = ck.meta["init_from"]
            if self.device.type == "cpu" and self.state.threads != self.threads_for:  # resumed from an older one
                self.threads = training_threads(self.cfg.train.threads, self.state.threads, self.console)
            self._restore_window(self.state.log_window)
            changed = dist.update_change(self.cfg.train, self.state.processes)
            if changed:
                self.console.warn(changed)
        self.state.threads = self.threads
        self.state.processes = dist.world_size()
        self.ema = restored_ema(ck.ema if ck is not None else None, self.model, self.cfg.train.ema_decay, self.device)
        if dist.is_main():
            self._settle_best()
        if ck is not None:
            self.console.info(f"resumed from {ck.path.name} (step {self.state.step}, epoch {self.state.epoch + 1})")

    def _begin_session(self) -> None:
        """What a session that trains does first: the metrics log cut back to the checkpoint it
        resumes from, and RUN_DIR/config.yaml holding the recipe it trains with (a session that
        trains nothing, on a finished run, leaves both as they are)."""
        if dist.is_main():
            if not self.resumed:
                self.metrics.start_over()
            else:
                self.metrics.truncate_after(self.state.step)
            save_config(self.cfg, RunDir(self.run_dir).config)

    # -- best/ -----------------------------------------------------------------------------------
    def _settle_best(self) -> None:
        """On resume: a staged best/ (BEST_STAGED, written by a validation) becomes best/ when the
        checkpoint resumed from holds its step as the best, else it belongs to updates that are
        about to be redone and is removed; so is a best/ past that checkpoint (written by an nmtkit
        before staging, or past a damaged newest checkpoint): best/ never tells of an update the
        run has not (yet) made."""
        staged, best = self.run_dir / BEST_STAGED, RunDir(self.run_dir).best
        if os.path.lexists(staged):
            step = _saved_step(staged)
            if step is not None and step == self.state.best_step and step <= self.state.step and step > 0:
                self._replace_best(staged)
            else:
                shutil.rmtree(staged, ignore_errors=True)
        step = _saved_step(best) if os.path.lexists(best) else None
        if step is not None and step > self.state.step:
            shutil.rmtree(best)
            self.console.warn(f"removed {best} (step {step}): it is past the checkpoint the run resumes from (step "
                              f"{self.state.step}); the next better validation writes it again")

    def _promote_best(self) -> None:
        """A checkpoint was saved: the best/ staged at or before its step is now best/."""
        staged = self.run_dir / BEST_STAGED
        if os.path.lexists(staged):
            self._replace_best(staged)

    def _replace_best(self, staged: Path) -> None:
        """``staged`` becomes best/; a failure (a full disk, a read-only run directory) is one
        line, as the failure of the save that wrote it would have been."""
        best = RunDir(self.run_dir).best
        try:
            replace_directory(staged, best)
        except OSError as err:
            raise NmtkitError(f"cannot write {best}: {err.strerror or err}") from err

    def _log(self, record: dict) -> None:
        if dist.is_main():
            self.metrics.append(record)

    def _save(self) -> None:
        """Every rank: its unlogged sums go to rank 0, which writes the checkpoint, promotes a
        staged best/ and prunes old checkpoints."""
        windows = dist.gather(self._window_state())
        if not dist.is_main():
            return
        self.state.loss_scaler = self.loss_scaler.state()
        self.state.log_window = windows
        path = save_checkpoint(self.run_dir, self.model, self.cfg.model, self.optimizer, self.state, self.src_path,
                               self.tgt_path, self.meta, ema=self.ema)
        self._promote_best()
        prune_checkpoints(self.run_dir, self.cfg.train.keep_last, protect=(path,))

    # -- the logging window ----------------------------------------------------------------------
    def _new_window(self) -> dict:
        return {"loss": torch.zeros((), device=self.device), "nll": torch.zeros((), device=self.device),
                "tokens": 0, "start": time.perf_counter(), "steps": 0}

    def _window_state(self) -> dict:
        """This process's unlogged sums as the checkpoint keeps them (float32 values are exact
        as JSON numbers)."""
        w = self.window
        state = {"loss": w["loss"].item(), "nll": w["nll"].item(), "tokens": w["tokens"], "steps": w["steps"],
                 "seconds": time.perf_counter() - w["start"]}
        router = self.router_window
        if router is not None and router.sums is not None:
            state["router"] = {"layers": list(router.layers), "sums": router.sums.tolist()}
        return state

    def _restore_window(self, saved: list) -> None:
        """The sums a checkpoint kept, each process its own (with another number of processes, rank
        0 takes them all); a checkpoint of an older nmtkit kept none."""
        if not saved:
            return
        if len(saved) == dist.world_size():
            mine = saved[dist.rank()]
        else:
            mine = _merged_windows(saved) if dist.is_main() else None
        if mine is None:
            return
        self.window["loss"] = torch.tensor(mine["loss"], dtype=torch.float32, device=self.device)
        self.window["nll"] = torch.tensor(mine["nll"], dtype=torch.float32, device=self.device)
        self.window["tokens"], self.window["steps"] = mine["tokens"], mine["steps"]
        self.window_seconds = mine.get("seconds", 0.0)
        router = mine.get("router")
        if router is not None and self.router_window is not None:
            self.router_window.layers = list(router["layers"])
            self.router_window.sums = torch.tensor(router["sums"], dtype=torch.float32, device=self.device)

    # -- loop -----------------------------------------------------------------------------------
    def _updates(self):
        """Yield (epoch, its batches, index of last batch used, (the epoch's ids, their source and target lengths),
        micro-batches of one update) forever."""
        t = self.cfg.train
        per_update = dist.local_update_freq(t) * dist.world_size()
        epoch, skip = self.state.epoch, self.state.batch_in_epoch
        while True:
            if self.sampler is None:
                data, src_lengths, tgt_lengths = self.train_data, self.src_lengths, self.tgt_lengths
            else:  # this epoch's segmentation, its lengths computed once for the epoch
                data = self.sampler.epoch(epoch)
                src_lengths, tgt_lengths = data.src_lengths(), data.tgt_lengths()
            batches = self._epoch_batches(src_lengths, tgt_lengths, epoch)
            if len(batches) < per_update:
                raise ConfigError(too_few_batches(len(batches), sum(len(b) for b in batches), per_update,
                                                  t.max_tokens, self.corpus_weights is not None))
            for start in range(skip, len(batches) - per_update + 1, per_update):
                yield (epoch, len(batches), start + per_update, (data, src_lengths, tgt_lengths),
                       batches[start:start + per_update])
            epoch, skip = epoch + 1, 0
            if t.max_epochs and epoch >= t.max_epochs:
                return

    def _epoch_batches(self, src_lengths, tgt_lengths, epoch: int) -> list:
        """Index arrays of the epoch's batches, over the pairs its corpus weights choose."""
        t = self.cfg.train
        if self.corpus_weights is None:
            return make_batches(src_lengths, tgt_lengths, t.max_tokens, t.seed, epoch)
        chosen = epoch_pairs(self.train_data.corpus, self.corpus_weights, t.seed, epoch)
        return [chosen[batch] for batch in make_batches(src_lengths[chosen], tgt_lengths[chosen], t.max_tokens,
                                                         t.seed, epoch)]

    def _step(self, epoch_data, group) -> tuple[Optional[torch.Tensor], torch.Tensor, int]:
        """One optimizer update over this rank's micro-batches of ``group``, indices into the
        epoch's (ids, target lengths)."""
        t = self.cfg.train
        update_freq = dist.local_update_freq(t)
        micro = dist.my_share(group, update_freq)
        data, src_lengths, tgt_lengths = epoch_data
        batches = [collate(data, idx, self.max_len) for idx in micro]
        total_tokens = sum(int(tgt_lengths[idx].sum()) + len(idx) for idx in group)
        self.state.train_flops += self._update_flops(src_lengths, tgt_lengths, group)
        scale = dist.world_size() / total_tokens  # DDP averages over ranks: undo it, normalise per token
        self.model.train()
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            dist.seed_micro_batch(t.seed, self.state.step, dist.rank() * update_freq + i, self.device)
            batch = batch.to(self.device)
            last = i == len(batches) - 1
            with out_of_memory_names(batch, self.state.step + 1, t.max_tokens), \
                    dist.no_sync_unless(self.objective, last), \
                    autocast(self.device, self.dtype):
                loss, nll = self._loss(batch, scale)
            loss_sum += loss.detach()
            nll_sum += nll.detach()
        lr = learning_rate(self.state.step + 1, t, self.model_dim)
        for group_ in self.optimizer.param_groups:
            group_["lr"] = lr
        self.loss_scaler.unscale(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        gnorm = torch.nn.utils.clip_grad_norm_(params, t.clip_norm if t.clip_norm > 0 else float("inf"))
        if not torch.isfinite(gnorm):
            self.loss_scaler.skip()
            self.optimizer.zero_grad(set_to_none=True)
            return None, nll_sum, total_tokens
        self.loss_scaler.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            update_ema(self.ema, self.model, t.ema_decay)
        return loss_sum, nll_sum, total_tokens

    def _update_flops(self, src_lengths, tgt_lengths, group) -> int:
        """Training FLOPs of an update's batches (all ranks'): real tokens as collate() feeds them
        (sources cut to the position table, at least one token; targets with EOS)."""
        cap = self.max_len or np.iinfo(np.int64).max
        src = np.concatenate([np.clip(src_lengths[idx], 1, cap) for idx in group])
        tgt = np.concatenate([np.minimum(tgt_lengths[idx], cap - 1) + 1 for idx in group])
        return self.flops.training(src, tgt)

    def _loss(self, batch, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward of one micro-batch; returns its summed smoothed loss and NLL. An
        MoE model's router losses join the gradient as a per-token penalty (not in the loss shown)."""
        stats = None if self.router_window is None else []
        loss, nll = self.objective(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out, stats)
        total = loss
        if stats is not None:
            m = self.cfg.model
            total = loss + router_penalty(stats, m.moe_aux_weight, m.moe_z_weight) * batch.ntokens
            self.router_window.add(stats)
        self.loss_scaler.scaled(total * scale).backward()
        return loss, nll

    def run(self) -> Path:
        self._resume()
        dist.require_same(self.state.step, "the step they resume from (WORKDIR must be on a filesystem all nodes share)")
        done = self._finished_reason()
        if done:
            self.console.info(f"training already finished at step {self.state.step} ({done}); "
                              f"raise the limit to train more, or start over with {RESTART}")
            return self.run_dir
        self._begin_session()
        if dist.is_main():
            print_summary(self.console, self.model, self.cfg, (len(self.src_vocab), len(self.tgt_vocab)),
                          self.device, self.dtype, init=self.meta.get("init_from"))
        with StopFlag() as stop:
            reason = self._loop(stop)
        self._save()
        dist.barrier()
        if reason == "signal":
            self.console.print(f"[yellow]stopped by signal at step {self.state.step}; checkpoint saved. "
                               f"Resume with the same `nmtkit train` command.[/yellow]")
            raise SystemExit(130 if stop.signal == signal.SIGINT else 143)
        self.console.info(f"training finished ({reason}) at step {self.state.step}; run directory {self.run_dir}")
        return self.run_dir

    def _finished_reason(self) -> Optional[str]:
        t = self.cfg.train
        if self.state.step >= t.max_steps:
            return "max_steps"
        if t.max_minutes and self.state.train_seconds >= t.max_minutes * 60:
            return "time budget"
        if t.max_flops and self.state.train_flops >= t.max_flops:
            return "FLOPs budget"
        if t.patience and self.state.bad_validations >= t.patience:
            return "early stopping"
        if t.max_epochs and self.state.epoch >= t.max_epochs:
            return "max_epochs"
        return None

    def _loop(self, stop: StopFlag) -> str:
        from nmtkit.training.progress import TrainProgress

        t = self.cfg.train
        window = self.window
        window["start"] = time.perf_counter() - self.window_seconds  # a resumed window's throughput: all its updates
        session_start = time.perf_counter() - self.state.train_seconds
        reason = ""
        bad_in_a_row = 0
        with TrainProgress(self.console, t.max_steps, self.state.step, enabled=dist.is_main()) as progress:
            for epoch, epoch_batches, next_batch, epoch_data, group in self._updates():
                loss, nll, ntokens = self._step(epoch_data, group)
                self.state.epoch, self.state.epoch_batches, self.state.batch_in_epoch = epoch, epoch_batches, next_batch
                if loss is None:
                    self.state.skipped_steps += 1
                    if self.loss_scaler.searching():  # fp16: the scaler's normal search, not divergence
                        self.console.info(f"fp16 gradient overflow at update {self.state.step + 1}: update "
                                          f"skipped, loss scale lowered to {self.loss_scaler.scale:g}")
                        continue
                    bad_in_a_row += 1
                    self.console.warn(f"non-finite gradient at update {self.state.step + 1}: update skipped "
                                      f"({bad_in_a_row} in a row)")
                    if bad_in_a_row >= t.max_bad_steps:
                        saved = checkpoint_dirs(self.run_dir)
                        raise TrainingStopped(f"{bad_in_a_row} consecutive non-finite updates; " + (
                            f"the last good checkpoint, {saved[-1]}, is intact" if saved else
                            "no checkpoint was written yet") + " (try a lower train.lr or train.clip_norm=1.0)")
                    continue
                bad_in_a_row = 0
                self.state.step += 1
                stopping, self.state.train_seconds = dist.agree_to_stop(
                    stop.signal is not None, time.perf_counter() - session_start, self.device)
                window["loss"] += loss
                window["nll"] += nll
                window["tokens"] += ntokens
                window["steps"] += 1
                step = self.state.step
                if step % t.log_every == 0 or step == t.max_steps:
                    self._log_window(window, progress)
                if step % t.validate_every == 0:
                    self._validate()
                reason = self._finished_reason() or ("signal" if stopping else "")
                if reason:  # the last checkpoint is written after the final validation, below
                    break
                if step % t.save_every == 0:
                    self._save()
            else:  # the last epoch is done: saved as "epoch max_epochs, no batch yet", so that a re-run
                # sees a finished run and a raised train.max_epochs resumes with the next epoch
                reason = "max_epochs"
                self.state.epoch, self.state.batch_in_epoch, self.state.epoch_batches = t.max_epochs, 0, 0
        if reason != "signal" and (self.state.step % t.validate_every):
            self._validate()
        return reason

    def _log_window(self, window: dict, progress) -> None:
        elapsed = time.perf_counter() - window["start"]
        tokens = window["tokens"]  # all ranks' target tokens
        loss, nll = (dist.sum_over_ranks(torch.stack([window["loss"], window["nll"]])) / max(tokens, 1)).tolist()
        lr = self.optimizer.param_groups[0]["lr"]
        tok_s = tokens / max(elapsed, 1e-9)
        record = {"type": "train", "step": self.state.step, "epoch": self.state.epoch + 1, "loss": round(loss, 4),
                  "nll": round(nll, 4), "ppl": round(math.exp(min(nll, 50)), 2), "lr": lr,
                  "tgt_tok_s": round(tok_s, 1), "train_seconds": round(self.state.train_seconds, 1),
                  "train_flops": self.state.train_flops}
        if self.loss_scaler.enabled:
            record["loss_scale"] = self.loss_scaler.scale
        rss = resident_mib()
        if rss is not None:
            record["rss_mib"] = rss
        if self.router_window is not None:
            record.update(self.router_window.record())
        self._log(record)
        progress.update(self.state.step, record)
        window.update(loss=torch.zeros((), device=self.device), nll=torch.zeros((), device=self.device), tokens=0,
                      start=time.perf_counter(), steps=0)

    def _validate(self) -> None:
        """Rank 0 validates; every rank adopts its outcome, so early stopping stops all at once."""
        if dist.is_main():
            self._validate_main()
        s = self.state
        s.best_score, s.best_step, s.bad_validations = dist.from_main((s.best_score, s.best_step, s.bad_validations))

    def _validate_main(self) -> None:
        """Dev loss (+ BLEU); keeps RUN_DIR/best by the configured metric."""
        t, cfg = self.cfg.train, self.cfg
        with ema_weights(self.model, self.ema):  # with an EMA, it is the averaged weights that are validated
            scores = dev_loss(self.model, self.dev, t.max_tokens, self.device, self.dtype, self.max_len)
            if t.best_metric == "bleu" and self.dev_refs and self.dev_sources:
                # the recipe's decode settings at the dev beam, one hypothesis per sentence
                options = TranslateOptions.from_decode(cfg.decode, beam_size=t.dev_bleu_beam, nbest=1)
                scores.update(dev_bleu(self.model, self.dev_sources, self.dev_refs, self.src_vocab, self.tgt_vocab,
                                       self.device, self.dtype, options, t.dev_bleu_max_sentences,
                                       tokenize=cfg.eval.tokenizer(cfg.data.reference_language("dev")),
                                       lowercase=cfg.eval.lowercase))
        metric = scores.get("dev_bleu") if t.best_metric == "bleu" and "dev_bleu" in scores else -scores["dev_loss"]
        improved = self.state.best_score is None or metric > self.state.best_score
        if improved:
            self.state.best_score, self.state.best_step, self.state.bad_validations = metric, self.state.step, 0
            # staged: best/ once the checkpoint of this step (or a later one) is saved (_promote_best)
            save_model_dir(self.model, cfg.model, self.run_dir / BEST_STAGED, self.src_path, self.tgt_path,
                           {**self.meta, "step": self.state.step, **scores}, weights=self.ema)
        else:
            self.state.bad_validations += 1
        record = {"type": "valid", "step": self.state.step, **{k: round(v, 4) for k, v in scores.items()},
                  "best": improved, "train_seconds": round(self.state.train_seconds, 1),
                  "train_flops": self.state.train_flops}
        self._log(record)
        shown = ", ".join(f"{k} {v:.2f}" for k, v in scores.items())
        self.console.info(f"[bold]valid[/bold] step {self.state.step}: {shown}{' (best)' if improved else ''}")



def _saved_step(model_dir: Path) -> Optional[int]:
    """The step a model directory of the run was saved at (None: unreadable, or none recorded)."""
    try:
        step = read_meta(model_dir).get("step")
    except CheckpointError:
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _merged_windows(windows: list) -> dict:
    """Several processes' unlogged sums as one process's (a run resumed on another number of
    processes). Each process sums only its own micro-batches' losses and router statistics, but
    counts the tokens and updates of all (``_step``): those are taken once, not summed."""
    merged = {key: sum(w[key] for w in windows) for key in ("loss", "nll")}
    merged.update(tokens=windows[0]["tokens"], steps=windows[0]["steps"],
                  seconds=max(w.get("seconds", 0.0) for w in windows))
    routers = [w["router"] for w in windows if "router" in w]
    if routers and all(r["layers"] == routers[0]["layers"] for r in routers):
        rows = zip(*(r["sums"] for r in routers))  # each layer's row of every process
        merged["router"] = {"layers": routers[0]["layers"], "sums": [[sum(column) for column in zip(*layer)]
                                                                     for layer in rows]}
    return merged
