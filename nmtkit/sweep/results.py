"""A sweep's results: one row per variant from its work directory, with a paired-bootstrap
p-value of its test BLEU against the baseline (the first variant, or the one ``baseline:`` or
``--baseline`` names), as results.json and results.md.
A replicated sweep (seeds, splits) has one row per run, each tested against the baseline's run
of the same seed and split, and above them one row per variant with the spread (spread.py).

Everything is read back from what ``nmtkit run`` left in each variant's directory
(results/results.json, results/test.hyp, train/metrics.jsonl) and the sweep's own record
(peak RSS), so the table can be rebuilt at any time, also from a sweep that was stopped.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from nmtkit.errors import DataError, NmtkitError
from nmtkit.scoring.significance import DEFAULT_SEED
from nmtkit.storage.files import atomic_write_text, read_lines
from nmtkit.sweep.record import read_record, read_results, variant_status
from nmtkit.sweep.spec import Sweep, Variant
from nmtkit.workdir import WorkDir

RESAMPLES = 1000
# (row key, markdown header, format)
COLUMNS = (("test_bleu", "test BLEU", ".2f"), ("p_value", "p", ".3f"), ("test_chrf", "chrF", ".2f"),
           ("test_ter", "TER", ".2f"), ("dev_bleu", "dev BLEU", ".2f"), ("dev_loss", "dev loss", ".3f"),
           ("parameters", "params", ","), ("active_parameters", "active", ","), ("train_tok_s", "train tok/s", ",.0f"),
           ("train_minutes", "train min", ".1f"), ("train_pflops", "train PFLOPs", ".3g"),
           ("bleu_per_pflop", "BLEU/PFLOP", ".3g"), ("bleu_per_minute", "BLEU/min", ".3g"),
           ("decode_sent_s", "decode sent/s", ".1f"), ("peak_rss_mib", "peak RSS MiB", ",.0f"))
# columns only a recipe's eval.metrics adds: shown when some variant has them
OPTIONAL_COLUMNS = (("test_chrf++", "chrF++", ".2f"), ("test_comet", "COMET", ".4f"))
OPTIONAL_METRICS = ("chrf", "chrf++", "ter", "comet")  # results.json holds those eval.metrics named


def write_results(sweep: Sweep, counts: dict[str, dict]) -> dict:
    """Collect every variant, write SWEEP_DIR/results.json and results.md atomically, return the dict."""
    from nmtkit.sweep.spread import group_rows

    rows = [variant_row(sweep, variant, counts[variant.name]) for variant in sweep.variants]
    _add_p_values(sweep, rows)
    baseline = sweep.baseline.group_name
    results = {"sweep": sweep.name, "sweep_file": str(sweep.path), "recipe": str(sweep.recipe),
               "overrides": list(sweep.shared_overrides), "baseline": baseline,
               "significance": {"test": "paired bootstrap", "metric": "test BLEU", "against": baseline,
                                "resamples": RESAMPLES, "seed": DEFAULT_SEED},
               "bleu_signature": next((row["bleu_signature"] for row in rows if row.get("bleu_signature")), None),
               "variants": rows}
    if sweep.replicated:
        results.update(seeds=list(sweep.seeds), splits=sweep.splits, groups=group_rows(sweep, rows, RESAMPLES))
        results["significance"].update(runs="pooled over paired runs (same seed, same split), sentences of each "
                                            "split resampled with all their seeds' outputs", run_test="sign test")
    atomic_write_text(sweep.workdir / "results.json", json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    atomic_write_text(sweep.workdir / "results.md", results_markdown(results))
    return results


def variant_row(sweep: Sweep, variant: Variant, counts: dict) -> dict:
    """One variant's figures (None where it has not got that far)."""
    directory = sweep.variant_dir(variant.name)
    status = variant_status(sweep, variant)
    record = read_record(directory)
    row: dict[str, Any] = {"name": variant.name, "settings": variant.settings(sweep.recipe), "status": status,
                           "parameters": counts["total"], "active_parameters": counts["active"]}
    if variant.group:
        row.update(group=variant.group, seed=variant.seed, split=variant.split)
    row.update(dict.fromkeys(key for key, _, _ in COLUMNS if key not in row))
    if status == "failed":
        row["error"] = record.get("error")
    if status != "done":
        return row
    results = read_results(directory)  # sound: the status is done
    test, dev = results["splits"]["test"], results["splits"]["dev"]
    row.update({f"test_{metric}": test[metric]["score"] for metric in OPTIONAL_METRICS if metric in test})
    row.update(test_bleu=test["bleu"]["score"], dev_bleu=dev["bleu"]["score"], train_minutes=results.get("train_minutes"),
               decode_sent_s=round(test["sentences"] / test["translate_seconds"], 1) if test["translate_seconds"] else None,
               peak_rss_mib=record.get("peak_rss_mib"), bleu_signature=test["bleu"]["signature"])
    row.update(_training_figures(WorkDir(directory).run.path))
    row.update(_cost_figures(results.get("train_flops"), row["train_minutes"], row["test_bleu"]))
    return row


def _cost_figures(flops: Any, minutes: Any, bleu: float) -> dict:
    """Training PFLOPs (10^15 FLOPs), and test BLEU per PFLOP and per training minute."""
    pflops = flops / 1e15 if isinstance(flops, (int, float)) and flops > 0 else None
    return {"train_pflops": pflops, "bleu_per_pflop": bleu / pflops if pflops else None,
            "bleu_per_minute": bleu / minutes if isinstance(minutes, (int, float)) and minutes > 0 else None}


def _training_figures(run_dir: Path) -> dict:
    """Final dev loss and median training speed (target tokens/s over the logged windows)."""
    from nmtkit.runlog import read_metrics

    try:
        records = read_metrics(run_dir)
    except DataError:
        return {}
    def numbers(kind: str, field: str) -> list[float]:
        return [r[field] for r in records if r["type"] == kind and isinstance(r.get(field), (int, float))]

    valid, speeds = numbers("valid", "dev_loss"), numbers("train", "tgt_tok_s")
    return {"dev_loss": valid[-1] if valid else None,
            "train_tok_s": round(statistics.median(speeds), 1) if speeds else None}


def _add_p_values(sweep: Sweep, rows: list[dict]) -> None:
    """Each finished variant's test BLEU against the baseline's, on the same test references
    (replicated: against the baseline's run of the same seed and split)."""
    status = {row["name"]: row["status"] for row in rows}
    baselines = {(v.seed, v.split): v for v in sweep.variants if v.group_name == sweep.baseline.group_name}
    for row, variant in zip(rows, sweep.variants):
        base = baselines.get((variant.seed, variant.split))
        if base is not None and base is not variant and row["status"] == "done" and status[base.name] == "done":
            _add_p_value(sweep, row, variant, base)


def _add_p_value(sweep: Sweep, row: dict, variant: Variant, base: Variant) -> None:
    """The p-value, or a note saying why there is none: a file it reads that went missing or
    bad since its run finished costs this one cell, not the sweep (the row's run, or the
    baseline's, is pending again and run anew by the next sweep)."""
    from nmtkit.scoring.significance import paired_test

    base_dir = sweep.variant_dir(base.name)
    tgt, evaluation = base.config.data.tgt_lang, base.config.eval  # scored as `run` scored it
    directory = sweep.variant_dir(variant.name)
    try:
        refs = read_lines(WorkDir(base_dir).text("test", tgt))
        base_hyps = read_lines(WorkDir(base_dir).results / "test.hyp")
        if read_lines(WorkDir(directory).text("test", variant.config.data.tgt_lang)) != refs:
            row["p_value_note"] = "other test references than the baseline's: no p-value"
            return
        hyps = read_lines(WorkDir(directory).results / "test.hyp")
    except NmtkitError as err:
        row["p_value_note"] = f"no p-value: {err}"
        return
    if not len(hyps) == len(base_hyps) == len(refs):
        row["p_value_note"] = (f"no p-value: {len(hyps)} and {len(base_hyps)} (baseline) translations of "
                               f"{len(refs)} test sentences")
        return
    result = paired_test(hyps, base_hyps, [refs], metrics=("bleu",), test="bootstrap", resamples=RESAMPLES,
                         seed=DEFAULT_SEED, lowercase=evaluation.lowercase,
                         tokenize=evaluation.tokenizer(base.config.data.reference_language()))
    row["p_value"] = round(result["bleu"].p_value, 4)


def _cell(value: Any, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _columns(rows: list[dict]) -> tuple:
    """COLUMNS, with chrF++ and COMET after TER when some variant was scored with them."""
    extra = tuple(column for column in OPTIONAL_COLUMNS if any(row.get(column[0]) is not None for row in rows))
    return COLUMNS[:4] + extra + COLUMNS[4:]


def results_markdown(results: dict) -> str:
    columns = _columns(results["variants"])
    headers = ["variant", *(header for _, header, _ in columns), "settings"]
    lines = [f"# Sweep {results['sweep']}", "",
             f"Base recipe `{results['recipe']}`" + (f" with `{' '.join(results['overrides'])}`"
                                                    if results["overrides"] else "") +
             f"; sweep file `{results['sweep_file']}`.", ""]
    if results.get("groups"):
        from nmtkit.sweep.spread import groups_markdown

        lines += ["## Variants over seeds and splits", "", *groups_markdown(results), "", "## Runs", ""]
    lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in results["variants"]:
        name = row["name"] if row["status"] == "done" else f"{row['name']} ({row['status']})"
        cells = [_cell(row.get(key), fmt) for key, _, fmt in columns]
        settings = " ".join(f"`{item}`" for item in row["settings"]) or "(the recipe)"
        lines.append("| " + " | ".join([name, *cells, settings]) + " |")
    done = [row for row in results["variants"] if row["status"] == "done" and row.get("dev_bleu") is not None]
    significance = results["significance"]
    lines += ["", f"- p: {significance['test']} ({significance['resamples']} resamples, seed {significance['seed']}) "
                  f"of each variant's test BLEU against `{results['baseline']}`, the baseline"
                  + (" (its run of the same seed and split)." if results.get("groups") else "."),
              "- train tok/s: median of the logged windows (target tokens); decode sent/s: the test set with the "
              "recipe's beam; peak RSS: the largest single process (`nmtkit run` or one of its workers) over the "
              "variant's sessions; the first variant of each prepare also ran that prepare."]
    if done and not results.get("groups"):  # replicated: the best mean is under the variants' table
        best = max(done, key=lambda row: row["dev_bleu"])
        lines.append(f"- best dev BLEU: `{best['name']}` ({best['dev_bleu']:.2f}); choose on dev, report test once.")
    if results.get("bleu_signature"):
        lines.append(f"- BLEU signature: `{results['bleu_signature']}`")
    failed = [row for row in results["variants"] if row.get("error")]
    lines += [f"- `{row['name']}` failed: {row['error']}" for row in failed]
    return "\n".join(lines) + "\n"


def print_results(console, results: dict) -> None:
    """The main columns as a table on the console (results.md has them all)."""
    from rich.table import Table

    shown = ("test_bleu", "p_value", "dev_bleu", "dev_loss", "parameters", "train_minutes")
    table = Table(title=f"sweep {results['sweep']}: results ({results['sweep_file']})", title_justify="left")
    table.add_column("variant")
    for key, header, _ in COLUMNS:
        if key in shown:
            table.add_column(header, justify="right")
    for row in results["variants"]:
        name = row["name"] if row["status"] == "done" else f"{row['name']} ({row['status']})"
        table.add_row(name, *(_cell(row.get(key), fmt) for key, _, fmt in COLUMNS if key in shown))
    console.print(table)
    if results.get("groups"):
        from nmtkit.sweep.spread import print_groups

        print_groups(console, results)
