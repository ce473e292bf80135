"""``nmtkit run``: a recipe end to end, each step skipped when its outputs are up to date.

prepare -> train -> average -> translate dev and test -> score -> results table
(WORKDIR/results/results.json and results.md).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Optional

from nmtkit.config import Config
from nmtkit.errors import NmtkitError
from nmtkit.storage.files import (atomic_open, atomic_write_text, read_json_dict, read_lines, read_regular,
                                  sha256_file)
from nmtkit.workdir import RunDir, WorkDir


def _stamp(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def choose_model(cfg: Config, run_dir: Path, console) -> tuple[Path, dict]:
    """The model directory to evaluate and its config.json (read once here): the average of the
    last checkpoints (as in the paper) when train.average_last > 1, else the best checkpoint by
    the dev metric."""
    from nmtkit.errors import CheckpointError
    from nmtkit.modeldir import CONFIG, read_meta
    from nmtkit.training.checkpoint import average_checkpoints, checkpoint_dirs

    dirs = checkpoint_dirs(run_dir)
    n = min(cfg.train.average_last, len(dirs))
    if 1 < len(dirs) < cfg.train.average_last:  # keep_last below average_last, or a short run
        console.warn(f"train.average_last={cfg.train.average_last} but {run_dir / 'checkpoints'} holds "
                     f"{len(dirs)} checkpoint(s) (train.keep_last={cfg.train.keep_last}): averaging those {len(dirs)}")
    if n > 1:
        out = RunDir(run_dir).averaged
        sources = [p.name for p in dirs[-n:]]
        with contextlib.suppress(CheckpointError):  # missing or damaged: averaged again
            meta = read_meta(out)
            if meta.get("averaged_from") == sources:
                return out, meta
        console.info(f"averaging {n} checkpoints: {', '.join(sources)}")
        chosen = average_checkpoints(run_dir, n, out)
    else:
        best = RunDir(run_dir).best
        chosen = best if (best / CONFIG).is_file() else dirs[-1]
    return chosen, read_meta(chosen)


def open_translator(model_dir: Path, meta: dict, options):
    """The chosen model as a ``Translator``: loaded on the CPU (its config.json already read), then
    moved once to the options' device and dtype."""
    from nmtkit.decoding.torch_engine import TorchEngine
    from nmtkit.decoding.translate import Translator
    from nmtkit.modeldir import load_model_dir

    return Translator(TorchEngine.from_loaded([load_model_dir(model_dir, meta=meta)], options), options)


def decoding_translator(cfg: Config, model_dir: Path, meta: dict, options, console):
    """``open_translator`` on the threads ``train.threads`` chooses now (auto: measured again, as
    the load may have changed while training ran); called once, and only when a split needs it."""
    from nmtkit.runtime.threads import configure_threads

    configure_threads(cfg.train.threads, console, what="translating", option="train.threads")
    return open_translator(model_dir, meta, options)


def translate_split(cfg: Config, split: str, out_dir: Path, console, options, weights_sha256: Optional[str],
                    translator: Callable[[], Any]) -> tuple[list[str], float]:
    """Translate prepared/{split}.{src} with ``options`` (``decode_options``), cached by a stamp of
    the weights (``weights_sha256``), the settings and the input, which keeps the time the
    translation took (a cached split still reports its decoding speed). ``translator()`` gives the model's
    ``Translator``: called only when a split is not cached, so a finished run loads no model."""
    from nmtkit.data.ids import prepared_file

    source_path = prepared_file(WorkDir.of(cfg).text(split, cfg.data.src_lang))
    sources = read_lines(source_path)
    # target_lang is never set here; workers does not change a translation
    settings = {k: v for k, v in dataclasses.asdict(options).items() if k not in ("target_lang", "workers")}
    # the text itself, not just its length: another test set of as many lines is translated anew
    stamp = _stamp(weights_sha256, settings, len(sources), sha256_file(source_path))
    hyp_path, stamp_path = out_dir / f"{split}.hyp", out_dir / f"{split}.hyp.stamp"
    done = _read_stamp(stamp_path)
    if hyp_path.is_file() and done.get("stamp") == stamp and done.get("sha256") == sha256_file(hyp_path):
        console.info(f"{split}: translations up to date ({hyp_path})")
        seconds = done.get("seconds")
        return read_lines(hyp_path), seconds if isinstance(seconds, (int, float)) and seconds >= 0 else 0.0
    model = translator()
    start = time.perf_counter()
    hyps = model.translate(sources)
    seconds = time.perf_counter() - start
    data = "".join(h + "\n" for h in hyps).encode("utf-8")
    # the stamp first: a kill between the two writes leaves a stamp of run's (so the rerun takes
    # results/ for run's, not the user's) with the sha256 of a translation not written, so a
    # missing or older SPLIT.hyp is made again, as a damaged copy (another sha256) is
    atomic_write_text(stamp_path, json.dumps({"stamp": stamp, "seconds": round(seconds, 3),
                                              "sha256": hashlib.sha256(data).hexdigest()}) + "\n")
    with atomic_open(hyp_path, "wb") as handle:  # the bytes the stamp's sha256 is of
        handle.write(data)
    console.info(f"{split}: translated {len(sources)} sentences in {seconds:.1f}s "
                 f"({len(sources) / max(seconds, 1e-9):.1f} sent/s, beam {options.beam_size})")
    return hyps, seconds


def decode_options(cfg: Config):
    """The recipe's decode settings on its training device and in its training dtype (as dev BLEU
    during training is measured), one hypothesis per line (to score)."""
    from nmtkit.decoding.options import TranslateOptions

    # fp16 trains under autocast (on a CPU too) but decoding casts the weights, which only a GPU
    # does in fp16: such a run decodes with translate's own choice (auto)
    dtype = cfg.train.dtype if cfg.train.dtype in ("float32", "bf16") else "auto"
    options = TranslateOptions.from_decode(cfg.decode, nbest=1, device=cfg.train.device, dtype=dtype)
    options.validate()
    return options


def _read_stamp(path: Path) -> dict:
    """What a translation was made from and how long it took ({} when missing or from an older version)."""
    return read_json_dict(path) or {}


_PLAIN_STAMP = re.compile(rb"[0-9a-f]{16}")  # the whole stamp file of nmtkit before its JSON stamps


def _runs_stamp(path: Path) -> bool:
    """Whether ``path`` is a translation stamp run wrote: JSON with its ``stamp``, or the bare
    digest older versions wrote (their results/ is run's too; the split is translated again)."""
    if isinstance(_read_stamp(path).get("stamp"), str):
        return True
    try:
        return bool(_PLAIN_STAMP.fullmatch(read_regular(path, 64)))
    except NmtkitError:
        return False


def refuse_foreign_results(cfg: Config) -> None:
    """Before any work: WORKDIR/results/ may be a directory of the user's (``workdir: .``), and
    ``run`` replaces only what it wrote there. The directory is run's once it holds a stamp run
    writes before each translation (SPLIT.hyp.stamp, this version's or an older one's) or run's
    results.json (then a damaged file there is run's too, and made again); before that, a file
    there of a name run writes (a translation, its stamp, results.json, results.md) is the
    user's, and refused."""
    from nmtkit.storage.files import refuse_foreign

    out_dir = WorkDir.of(cfg).results
    if not os.path.lexists(out_dir):
        return
    if not out_dir.is_dir():
        refuse_foreign(out_dir, "the run's translations and results")
    splits = ("dev", "test", *(f"test.{c.name}" for c in cfg.data.corpora[1:]))
    results = read_json_dict(out_dir / "results.json") or {}
    if isinstance(results.get("splits"), dict) and isinstance(results.get("model_dir"), str) or \
            any(_runs_stamp(out_dir / f"{split}.hyp.stamp") for split in splits):
        return
    for name in ("results.json", "results.md", *(f"{split}.hyp{end}" for split in splits for end in ("", ".stamp"))):
        if os.path.lexists(out_dir / name):
            refuse_foreign(out_dir / name, "the run's translations and results")


def corpus_tests(cfg: Config) -> list[str]:
    """The test sets of the corpora after the first (each direction of a multilingual model, each
    domain): test.NAME, which `prepare` writes for every corpus with a test split of its own."""
    work = WorkDir.of(cfg)
    return [f"test.{c.name}" for c in cfg.data.corpora[1:] if work.text(f"test.{c.name}", cfg.data.src_lang).is_file()]


def run_recipe(cfg: Config, console) -> dict:
    """Run every step of the recipe and return the results dict."""
    from nmtkit.data.ids import prepared_file
    from nmtkit.data.prepare import prepare
    from nmtkit.runtime.allocator import hand_back_freed_memory
    from nmtkit.scoring.report import score_all
    from nmtkit.training.startup import check_run_dir
    from nmtkit.training.trainer import train

    started = time.perf_counter()
    score_options = eval_options(cfg)  # a tokenizer or COMET that cannot run here: found before any work
    refuse_foreign_results(cfg)
    check_run_dir(WorkDir.of(cfg).run.path)  # a train/ it did not make: refused before prepare's minutes
    console.rule("[bold]1/4 prepare")
    prepare(cfg, console)
    console.rule("[bold]2/4 train")
    train(cfg, console)
    hand_back_freed_memory()  # training's kept blocks, which the search threads do not reuse (runtime/allocator.py)
    work = WorkDir.of(cfg)
    run_dir = work.run.path
    console.rule("[bold]3/4 translate")
    model_dir, meta = choose_model(cfg, run_dir, console)
    options = decode_options(cfg)
    translator = functools.lru_cache(maxsize=None)(lambda: decoding_translator(cfg, model_dir, meta, options, console))
    out_dir = work.results
    results: dict = {"recipe": cfg.name, "model_dir": str(model_dir), "splits": {}}
    for split in ("dev", "test", *corpus_tests(cfg)):
        hyps, seconds = translate_split(cfg, split, out_dir, console, options, meta.get("weights_sha256"),
                                         translator)
        refs = read_lines(prepared_file(work.text(split, cfg.data.tgt_lang)))
        sources = read_lines(prepared_file(work.text(split, cfg.data.src_lang))) if cfg.eval.comet_model else None
        scores, _ = score_all(hyps, [refs], score_options.in_language(cfg.data.reference_language(split)), sources)
        results["splits"][split] = {"sentences": len(hyps), "translate_seconds": round(seconds, 3),
                                    **{m: {"score": round(s["score"], 4 if m == "comet" else 2),
                                           "signature": s["signature"]} for m, s in scores.items()}}
    console.rule("[bold]4/4 results")
    trainer_meta = _training_summary(run_dir)
    results.update(parameters=meta.get("parameters"), **trainer_meta,
                   total_minutes=round((time.perf_counter() - started) / 60, 1))
    atomic_write_text(out_dir / "results.json", json.dumps(results, indent=2) + "\n")
    atomic_write_text(out_dir / "results.md", results_markdown(results))
    _print_results(console, results)
    test = results["splits"]["test"]
    figures = "  ".join(f"{label} {test[m]['score']:.{4 if m == 'comet' else 2}f}"
                        for m, label in _LABELS.items() if m in test and m != "bleu")
    print(f"test BLEU {test['bleu']['score']:.2f}  {figures}  ({cfg.name}; {test['bleu']['signature']})")
    return results


# the column of each metric, in the order the tables show them
_LABELS = {"bleu": "BLEU", "chrf": "chrF", "chrf++": "chrF++", "ter": "TER", "comet": "COMET"}


def eval_options(cfg: Config):
    """The recipe's eval section as `nmtkit score`'s options, checked (tokenizer packages, COMET)."""
    from nmtkit.scoring.metrics import check_tokenizer
    from nmtkit.scoring.report import ScoreOptions, check_options

    evaluation = cfg.eval
    options = ScoreOptions(metrics=tuple(evaluation.metric_names()), tokenize=evaluation.tokenize,
                           target_lang=cfg.data.reference_language(), lowercase=evaluation.lowercase,
                           comet_model=evaluation.comet_model, comet_batch_size=evaluation.comet_batch_size)
    check_options(options, with_sources=True)  # `run` has the source text of every split (checks test's tokenizer)
    others = {options.in_language(language).tokenizer for language in cfg.data.reference_languages()}
    for tokenizer in sorted(others - {options.tokenizer}):  # each direction's test set is scored in its own language
        check_tokenizer(tokenizer)
    return options


def _metric_columns(results: dict) -> list[str]:
    """The metrics every split was scored with, in table order."""
    splits = list(results["splits"].values())
    return [m for m in _LABELS if all(m in split for split in splits)]


def _training_summary(run_dir: Path) -> dict:
    from nmtkit.errors import NmtkitError
    from nmtkit.training.checkpoint import checkpoint_dirs, read_trainer_state

    dirs = checkpoint_dirs(run_dir)
    try:
        trainer = read_trainer_state(dirs[-1]) if dirs else None
    except NmtkitError:  # damaged: the table goes without these two numbers
        trainer = None
    if trainer is None:
        return {}
    return {"train_steps": trainer.step, "train_minutes": round(trainer.train_seconds / 60, 1),
            "train_flops": trainer.train_flops}


def _cells(r: dict, metrics: list[str]) -> list[str]:
    return [f"{r[m]['score']:.{4 if m == 'comet' else 2}f}" for m in metrics]


def results_markdown(results: dict) -> str:
    metrics = _metric_columns(results)
    lines = [f"# Results: {results['recipe']}", "", "| split | sentences | " + " | ".join(_LABELS[m] for m in metrics)
             + " |", "|---|---|" + "---|" * len(metrics)]
    for split, r in results["splits"].items():
        lines.append(f"| {split} | {r['sentences']} | " + " | ".join(_cells(r, metrics)) + " |")
    lines += ["", f"- model: `{results['model_dir']}` ({results.get('parameters') or 0:,} parameters)",
              f"- training: {results.get('train_steps', '?')} steps, {results.get('train_minutes', '?')} min",
              f"- BLEU signature: `{results['splits']['test']['bleu']['signature']}`", ""]
    return "\n".join(lines)


def _print_results(console, results: dict) -> None:
    from rich.table import Table

    metrics = _metric_columns(results)
    table = Table(title=f"{results['recipe']}: results")
    for col in ("split", "sentences", *(_LABELS[m] for m in metrics)):
        table.add_column(col, justify="right" if col != "split" else "left")
    for split, r in results["splits"].items():
        table.add_row(split, str(r["sentences"]), *_cells(r, metrics))
    console.info(table)
    console.info(f"parameters {results.get('parameters') or 0:,}; trained {results.get('train_steps', '?')} steps in "
                 f"{results.get('train_minutes', '?')} min; total {results['total_minutes']} min")
