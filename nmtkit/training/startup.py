"""What happens before a session's first update: the prepared data loaded and checked (against
the model and against what the run started on), the run locked, and the newest good checkpoint
found and restored (weights, optimizer, random state), so a resumed run goes on exactly where it stopped."""
from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Callable, Optional

import torch

from nmtkit.config import Config
from nmtkit.data.identity import (changes, identity, prepared_settings, read_record, settings_changes,
                                  with_defaults, write_record)
from nmtkit.data.ids import ParallelIds, load_split, prepared_file
from nmtkit.data.mapped_vocab import open_vocab
from nmtkit.data.vocab import Vocab, id_map_of, spm_files
from nmtkit.errors import CheckpointError, ConfigError, DataError, NmtkitError
from nmtkit.modeldir import CONFIG, load_weights, model_config_from_meta, model_dir_problem, read_meta
from nmtkit.runlog import RESTART, check_resume_settings, read_run_config
from nmtkit.storage.files import exclusive, read_json_dict, read_lines, refuse_foreign, shown_path
from nmtkit.training import distributed as dist
from nmtkit.training.checkpoint import (LoadedCheckpoint, OtherModel, check_fits, checkpoint_dirs,
                                        latest_checkpoint, read_trainer_state)
from nmtkit.workdir import RunDir, WorkDir


def refuse_beyond_table(data: ParallelIds, positions: str, max_positions: int, where: Path,
                        warn: Optional[Callable[[str], None]] = None) -> None:
    """A position table (learned or sinusoidal) has no row past ``max_positions``: cutting the
    sentences that need one would train on silently changed data (a cut target followed by EOS
    teaches the model to stop early), so training refuses them instead; with ``warn``, says
    that they are cut (a run that began so)."""
    longest = max(int(data.src_lengths().max()), int(data.tgt_lengths().max()) + 1)  # targets start with BOS
    if longest > max_positions and warn is not None:
        warn(f"{where} has a sentence of {longest} positions, past model.max_positions={max_positions}: this run "
             f"began cutting such pairs and goes on doing so (a new run refuses them)")
    elif longest > max_positions:
        raise ConfigError(f"{where} has a sentence of {longest} positions but model.positions={positions} has "
                          f"model.max_positions={max_positions} rows; raise model.max_positions, or lower "
                          f"data.clean.max_len and prepare again")


def check_data(run_dir: Path, spm_models: tuple[Path, Path], train_data: ParallelIds, resuming: bool,
               warn: Callable[[str], None]) -> None:
    """Refuse to resume on other data than the run started on; record it for a new run
    (and for a run of an older nmtkit, which recorded nothing to compare with)."""
    current = identity({path.name: path for path in spm_models}, train_data)
    record = RunDir(run_dir).data_record
    recorded = read_record(record, warn) if resuming else None
    changed = changes(recorded, current) if recorded is not None else []
    if changed:
        raise DataError(f"the prepared data changed since the run in {run_dir} started "
                        f"({'; '.join(changed)}): its checkpoints do not fit it; use --restart to start over "
                        f"({RESTART}: the old run is moved aside, not deleted)")
    if recorded != current:
        write_record(record, current)


def newest_checkpoint(cfg: Config, run_dir: Path, model, optimizer, console) -> Optional[LoadedCheckpoint]:
    """The newest checkpoint that can continue this run (damaged newer ones are skipped with a
    warning); None for a new run. A ConfigError when the recipe now asks for another model
    (before any checkpoint is tried, so it is not mistaken for damage), a CheckpointError when
    none is readable. Rank 0 has tidied the run (``tidy_run_dir``) and checked its data first."""
    if checkpoint_dirs(run_dir):
        check_resume_settings(cfg, run_dir, console)
        check_checkpoint_model(cfg, run_dir)

    def fits(ck: LoadedCheckpoint) -> None:
        try:
            check_fits(ck, model, optimizer)
        except OtherModel as err:
            raise ConfigError(f"{err}: the model or vocabulary settings changed since the run in {run_dir} started; "
                              f"use --restart to train a new model ({RESTART})") from None

    ck = latest_checkpoint(run_dir, warn=console.warn, check=fits)
    if ck is None and checkpoint_dirs(run_dir):
        raise CheckpointError(f"no readable checkpoint in {RunDir(run_dir).checkpoints} (see the warnings); "
                              f"move the damaged ones away, or start over with {RESTART}")
    if ck is not None:
        check_init_from(cfg, ck, run_dir)
    return ck


def check_checkpoint_model(cfg: Config, run_dir: Path) -> None:
    """Refuse a recipe whose model is not the one the newest checkpoint (with a readable
    config.json) was saved as: RUN_DIR/config.yaml, which ``check_resume_settings`` compares,
    may be gone, and a change that keeps every shape (model.ffn relu -> gelu) loads without
    complaint, then trains another model on the old one's weights."""
    import dataclasses

    from nmtkit.config.schema import recipe_key

    for path in reversed(checkpoint_dirs(run_dir)):
        try:
            saved = dataclasses.asdict(model_config_from_meta(read_meta(path), path / CONFIG))
        except CheckpointError:
            continue  # damaged: latest_checkpoint says so
        ours = dataclasses.asdict(cfg.model)
        differ = [f"model.{recipe_key(k)} ({saved[k]!r} there, {ours[k]!r} here)" for k in ours if saved[k] != ours[k]]
        if differ:
            raise ConfigError(f"the recipe's model differs from the one {path} holds ({', '.join(differ)}); "
                              f"use --restart to train a new model ({RESTART})")
        return


def check_init_from(cfg: Config, ck: LoadedCheckpoint, run_dir: Path) -> None:
    """train.init_from chooses a new run's first weights: a resumed run goes on from its own
    checkpoints, so an init_from it did not start from would be accepted and ignored."""
    wanted = cfg.train.init_from
    if not wanted:
        return
    started = ck.meta.get("init_from") if isinstance(ck.meta.get("init_from"), dict) else {}
    try:
        saved = read_run_config(run_dir)
    except DataError:
        saved = None
    recorded = saved.get("train", {}).get("init_from") if saved is not None else None
    if recorded != wanted and started.get("path") != str(Path(wanted).expanduser().resolve()):
        raise ConfigError(f"train.init_from={wanted}: init_from applies only to a new run; this one resumes from "
                          f"its own checkpoints in {run_dir} (started from {started.get('path') or 'scratch'}); "
                          f"use --restart to start a new run from it ({RESTART})")


def restore(ck: LoadedCheckpoint, model, optimizer, device: torch.device) -> None:
    """Weights, optimizer state and random state as they were when ``ck`` was saved. The
    optimizer's settings (betas, eps, weight decay, fused kernels) stay the recipe's: loading a
    state dict would bring back the checkpoint's, silently undoing a changed
    ``train.weight_decay`` that the resume message says applies."""
    load_weights(model, {k: v.to(device) for k, v in ck.weights.items()}, ck.path)
    settings = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    state = dict(ck.optimizer)  # the settings go in before loading: torch places the step counters by them
    state["param_groups"] = [{**saved, **chosen, "params": saved["params"]}  # (fused Adam wants them on the GPU)
                             for saved, chosen in zip(state["param_groups"], settings)]
    optimizer.load_state_dict(state)  # the learning rate is set again at every step anyway
    torch.set_rng_state(ck.rng["torch"])
    if "cuda" in ck.rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(ck.rng["cuda"])


def prepared_vocabs(cfg: Config) -> tuple[Path, Path, Vocab, Vocab]:
    """The prepared SentencePiece models (paths, verified) and their vocabularies."""
    prepared = WorkDir.of(cfg).prepared
    src_name, tgt_name = spm_files(cfg.vocab.joint)
    src_path, tgt_path = prepared / src_name, prepared / tgt_name
    if not src_path.is_file():
        raise DataError(f"{shown_path(src_path, 'workdir', cfg.work_path)} not found: run `nmtkit prepare` on this "
                        f"recipe first")
    src_path, tgt_path = prepared_file(src_path), prepared_file(tgt_path)
    for path in (src_path, tgt_path):  # an imported model's id maps, when vocab.from brought them
        if id_map_of(path).is_file():
            prepared_file(id_map_of(path))
    check_prepared_settings(cfg, prepared)
    if cfg.model.tie_embeddings == "all" and src_path != tgt_path and not all(
            id_map_of(path).is_file() for path in (src_path, tgt_path)):
        # prepare checks this when it copies vocab.from, but tie_embeddings is no prepare setting: a
        # model trained so would be refused by everything that reads it (modeldir.joint_vocab)
        raise ConfigError(f"model.tie_embeddings=all needs one vocabulary, but {prepared} has two SentencePiece "
                          f"models ({src_path.name}, {tgt_path.name}) without id maps; set model.tie_embeddings: "
                          f"decoder or none")
    return src_path, tgt_path, open_vocab(src_path), open_vocab(tgt_path)


def check_prepared_settings(cfg: Config, prepared: Path) -> None:
    """A DataError when the recipe's data or vocab settings are not the ones prepared/ was made
    with (recorded by ``prepare`` in manifest.json; an older manifest records none)."""
    manifest = read_json_dict(prepared_file(prepared / "manifest.json")) if (prepared / "manifest.json").is_file() \
        else None
    recorded = (manifest or {}).get("settings")
    if not isinstance(recorded, dict):
        if isinstance(manifest, dict) and manifest.get("manifest", 1) != 1:  # a manifest that always records them
            raise DataError(f"{prepared / 'manifest.json'}: its settings are missing or not a mapping, so the "
                            f"recipe cannot be checked against the data; run `nmtkit prepare` on this recipe again")
        return  # a manifest of an nmtkit that did not record them
    differ = settings_changes(with_defaults(recorded), prepared_settings(cfg))
    if differ:
        more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
        raise DataError(f"{prepared} was made with other data or vocab settings than the recipe's: "
                        f"{differ[0]}{more}; run `nmtkit prepare` on this recipe first")


def load_training_data(cfg: Config, vocab_sizes: tuple[int, int]
                       ) -> tuple[ParallelIds, ParallelIds, list[str], list[str]]:
    """The prepared training and dev ids (checked against the vocabularies) and the dev source and
    reference text for dev BLEU (empty lists when there is none)."""
    work = WorkDir.of(cfg)
    train = load_split(prepared_file(work.ids("train")), vocab_sizes)
    dev = load_split(prepared_file(work.ids("dev")), vocab_sizes)
    texts = work.text("dev", cfg.data.src_lang), work.text("dev", cfg.data.tgt_lang)
    dev_sources, dev_refs = (read_lines(prepared_file(p)) if p.is_file() else [] for p in texts)
    if len(train) == 0:
        raise DataError(f"{work.ids('train')} holds no sentence pairs")
    return train, dev, dev_sources, dev_refs


def prepared_lock(cfg):
    """A shared hold on the work directory's prepared/ for the whole run: any number of
    trainings (a sweep's variants) read it at once, but ``nmtkit prepare``, which takes it
    exclusively, cannot rewrite the ids or the SentencePiece models that every checkpoint
    copies while a run is using them."""
    prepared = WorkDir.of(cfg).prepared
    if not prepared.is_dir():  # prepared_vocabs says how to make it
        return contextlib.nullcontext()
    return exclusive(prepared, "`nmtkit prepare`", shared=True)


def run_lock(run_dir: Path):
    """The run's lock (rank 0 takes it for all ranks): a second ``nmtkit train`` on the same
    run would delete the first one's temp files and interleave its metrics. The lock is the
    work directory's, beside the run, so ``--restart`` moving the run aside keeps it held."""
    if not dist.is_main():
        return contextlib.nullcontext()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return exclusive(run_dir.parent, "another `nmtkit train`")


# what only a training writes in its run directory (a run of an nmtkit before data.json: checkpoints/)
RUN_MARKS = ("data.json", "checkpoints")
_OUR_HIDDEN = re.compile(r"^\..+\.nmtkit-")  # a temporary or parked name of ours (storage/files.py)


def check_run_dir(run_dir: Path, restart: bool = False) -> None:
    """``train`` writes, rewrites and removes files in RUN_DIR (config.yaml, metrics.jsonl,
    best/, old checkpoints): refuse, before any work, a directory there that it did not make
    (not empty, and neither data.json nor checkpoints/, which a run writes first) and, in one it
    made, a best/ that is not a model directory (it is replaced at the next better validation;
    not with ``restart``, which moves the run aside whole)."""
    if not os.path.lexists(run_dir):
        return
    if not run_dir.is_dir():
        refuse_foreign(run_dir, "the training run")
    names = {entry.name for entry in run_dir.iterdir() if not _OUR_HIDDEN.match(entry.name)}
    if names and not names & set(RUN_MARKS):
        refuse_foreign(run_dir, "the training run")
    best = RunDir(run_dir).best
    problem = model_dir_problem(best) if os.path.lexists(best) and not restart else None
    if problem is not None:
        raise ConfigError(f"{best} {problem}: nmtkit keeps the run's best model there and replaces it at each "
                          f"better validation; move it away")


def recorded_threads(run_dir: Path) -> int:
    """The CPU thread count the newest readable checkpoint trained with (0: none recorded)."""
    for path in reversed(checkpoint_dirs(run_dir)):
        try:
            return read_trainer_state(path).threads
        except NmtkitError:
            continue
    return 0


def training_threads(setting: int, recorded: int, console) -> int:
    """Apply ``train.threads`` to PyTorch's CPU pool; returns the count. The weights depend on
    the count, so a run goes on with the count it ``recorded`` (auto chose it for the load of
    the run's first session) whatever the load is now, unless train.threads or OMP_NUM_THREADS
    fix another, or fewer CPUs are available now (more threads than CPUs would crawl): each is
    warned of, as the run then no longer matches an uninterrupted one."""
    from nmtkit.runtime.threads import choose_threads, configure_threads

    if recorded <= 0:
        return configure_threads(setting, console)
    if setting > 0 or os.environ.get("OMP_NUM_THREADS"):
        threads = configure_threads(setting, console)
        if threads != recorded:
            given = f"train.threads={setting}" if setting > 0 else f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
            console.warn(f"{given}: training with {threads} thread(s) where this run trained with {recorded}; the "
                         f"weights depend on the count, so the run no longer resumes exactly (bit for bit)")
        return threads
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if recorded > cpus:
        console.warn(f"this run trained with {recorded} thread(s) but {cpus} CPU(s) are available now: training with "
                     f"{cpus}; the weights depend on the count, so the run no longer resumes exactly (bit for bit)")
        return configure_threads(cpus, console)
    auto = choose_threads(0)
    if auto.threads != recorded:
        load = (f"other processes keep {auto.busy:.1f} of {auto.cpus} cores busy" if auto.busy is not None
                else f"auto would train with {auto.threads} thread(s) now")
        console.info(f"{load}: this run goes on with the {recorded} thread(s) it started with, so that it resumes "
                     f"exactly (train.threads sets another count, at the cost of that)")
    return configure_threads(recorded, console)
