"""A replicated sweep's groups: each variant's runs over seeds and data splits summarised as
mean, standard deviation, min and max per metric, and its test BLEU against the baseline's
over all its paired runs (the same seed on the same split).

Significance: a paired bootstrap of the pooled test BLEU over every pair of runs, drawing
the sentences of each split's test set, a drawn sentence bringing its outputs of every seed
(``scoring.significance.paired_runs_test``). It uses all the sentence-level evidence, which a
test across 4-6 runs cannot (its smallest p is large), yet never counts one test sentence as
k independent ones because k seeds translated it. Beside it, the exact sign test of the runs
each variant won and lost against the baseline's paired run says whether the difference
holds run by run (across seeds and splits), which the sentence bootstrap does not see.
"""
from __future__ import annotations

import statistics
from typing import Any, Optional

from nmtkit.errors import NmtkitError
from nmtkit.storage.files import read_lines
from nmtkit.scoring.significance import DEFAULT_SEED, paired_runs_test, sign_test
from nmtkit.sweep.spec import Sweep, Variant
from nmtkit.workdir import WorkDir

# the per-run figures summarised per group
SPREAD_KEYS = ("test_bleu", "test_chrf", "test_ter", "dev_bleu", "dev_loss", "train_minutes", "train_pflops",
               "bleu_per_pflop", "bleu_per_minute", "train_tok_s", "decode_sent_s", "peak_rss_mib")


def spread(values: list[float]) -> Optional[dict]:
    """mean, sample standard deviation (n - 1; None for one run), min, max and n of ``values``."""
    if not values:
        return None
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values), "n": len(values)}


def group_rows(sweep: Sweep, rows: list[dict], resamples: int) -> list[dict]:
    """One row per variant of the sweep file from its runs' rows (``rows``, in ``sweep.variants``
    order), with the spread of every figure and the tests against the baseline (the first
    variant unless the sweep names another)."""
    by_name = {row["name"]: row for row in rows}
    groups = []
    for group in sweep.groups:
        runs = [by_name[run.name] for run in sweep.runs_of(group.name)]
        done = [row for row in runs if row["status"] == "done"]
        out: dict[str, Any] = {"name": group.name, "settings": group.settings(sweep.recipe), "runs": len(runs),
                               "done": len(done), "parameters": runs[0]["parameters"],
                               "active_parameters": runs[0]["active_parameters"]}
        for key in SPREAD_KEYS:
            out[key] = spread([row[key] for row in done if isinstance(row.get(key), (int, float))])
        groups.append(out)
    baseline = sweep.baseline_group
    for group, row in zip(sweep.groups, groups):
        if group.name != baseline.name:
            row.update(_against_baseline(sweep, baseline, group, by_name, resamples))
    return groups


def _pairs(sweep: Sweep, baseline: Variant, group: Variant, by_name: dict) -> list[tuple[Variant, Variant]]:
    """(baseline run, this variant's run) of every (seed, split) both finished."""
    base_runs = {(run.seed, run.split): run for run in sweep.runs_of(baseline.name)}
    pairs = []
    for run in sweep.runs_of(group.name):
        base = base_runs.get((run.seed, run.split))
        if base is not None and by_name[run.name]["status"] == "done" and by_name[base.name]["status"] == "done":
            pairs.append((base, run))
    return pairs


def _against_baseline(sweep: Sweep, baseline: Variant, group: Variant, by_name: dict, resamples: int) -> dict:
    pairs = _pairs(sweep, baseline, group, by_name)
    if not pairs:
        return {"paired_runs": 0}
    deltas = [by_name[run.name]["test_bleu"] - by_name[base.name]["test_bleu"] for base, run in pairs]
    wins, losses = sum(d > 0 for d in deltas), sum(d < 0 for d in deltas)
    runs, note = [], None
    for base, run in pairs:
        try:  # a file gone missing or bad since its run finished costs the p-value, not the sweep
            refs = read_lines(WorkDir(sweep.variant_dir(base.name)).text("test", base.config.data.tgt_lang))
            if read_lines(WorkDir(sweep.variant_dir(run.name)).text("test", run.config.data.tgt_lang)) != refs:
                note = "other test references than the baseline's on the same split: no p-value"
                break
            hyps = read_lines(WorkDir(sweep.variant_dir(run.name)).results / "test.hyp")
            base_hyps = read_lines(WorkDir(sweep.variant_dir(base.name)).results / "test.hyp")
        except NmtkitError as err:
            note = f"no p-value: {err}"
            break
        if not len(hyps) == len(base_hyps) == len(refs):
            note = f"no p-value: {run.name} or {base.name} has not one translation per test sentence"
            break
        runs.append((hyps, base_hyps, refs, run.split))
    out: dict[str, Any] = {"paired_runs": len(pairs), "mean_delta_bleu": statistics.fmean(deltas), "wins": wins,
                           "losses": losses, "sign_p": round(sign_test(wins, losses), 4)}
    if note:
        out["p_value_note"] = note
        return out
    evaluation = baseline.config.eval  # scored as `run` scored it
    result = paired_runs_test(runs, "bleu", resamples, DEFAULT_SEED, lowercase=evaluation.lowercase,
                              tokenize=evaluation.tokenizer(baseline.config.data.reference_language()))
    out.update(pooled_bleu=round(result.system, 2), baseline_pooled_bleu=round(result.baseline, 2),
               p_value=round(result.p_value, 4))
    return out


def spread_cell(stats: Optional[dict], fmt: str) -> str:
    """"mean ± std" of a ``spread`` (the mean alone for one value, "—" for none)."""
    if stats is None:
        return "—"
    if stats["std"] is None:
        return format(stats["mean"], fmt)
    return f"{format(stats['mean'], fmt)} ± {format(stats['std'], fmt)}"


def _range(stats: Optional[dict], fmt: str) -> str:
    return "—" if stats is None else f"{format(stats['min'], fmt)}–{format(stats['max'], fmt)}"


GROUP_COLUMNS = (("test_bleu", "test BLEU", ".2f"), ("test_chrf", "chrF", ".2f"), ("test_ter", "TER", ".2f"),
                 ("dev_bleu", "dev BLEU", ".2f"), ("train_minutes", "train min", ".1f"),
                 ("train_pflops", "train PFLOPs", ".3g"), ("bleu_per_pflop", "BLEU/PFLOP", ".3g"),
                 ("bleu_per_minute", "BLEU/min", ".3g"))


def groups_markdown(results: dict) -> list[str]:
    """The group table (mean ± std, test BLEU's min–max, the tests) and its notes."""
    headers = ["variant", "runs", GROUP_COLUMNS[0][1], "min–max", "p", "won/lost (sign p)",
               *(header for _, header, _ in GROUP_COLUMNS[1:]), "params", "settings"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in results["groups"]:
        wins = f"{row['wins']}/{row['losses']} ({row['sign_p']:.3f})" if "wins" in row else "—"
        p = "—" if row.get("p_value") is None else format(row["p_value"], ".3f")
        cells = [row["name"], f"{row['done']}/{row['runs']}", spread_cell(row["test_bleu"], ".2f"),
                 _range(row["test_bleu"], ".2f"), p, wins,
                 *(spread_cell(row[key], fmt) for key, _, fmt in GROUP_COLUMNS[1:]), format(row["parameters"], ","),
                 " ".join(f"`{item}`" for item in row["settings"]) or "(the recipe)"]
        lines.append("| " + " | ".join(cells) + " |")
    seeds = ", ".join(map(str, results["seeds"])) or "each recipe's train.seed"
    lines += ["", f"- {len(results['groups'])} variants x seeds ({seeds}) x {results['splits']} data split(s) "
                  f"(`data.split_seed` 0..{results['splits'] - 1}; 0 is the recipe's own split); mean ± sample "
                  f"standard deviation over each variant's finished runs.",
              f"- p: paired bootstrap ({results['significance']['resamples']} resamples, seed "
              f"{results['significance']['seed']}) of the pooled test BLEU of all paired runs (same seed, same split) "
              f"against `{results['baseline']}`, resampling the sentences of each split's test set with all their "
              f"seeds' outputs; won/lost: paired runs with higher/lower test BLEU than the baseline's, with the "
              f"two-sided exact sign test.",
              "- train PFLOPs: training FLOPs counted from the model's shapes, forward + backward = 3 x forward, "
              "real tokens only (docs/training.md, 'Compute budgets'); BLEU/PFLOP and BLEU/min: test BLEU per unit of training cost."]
    scored = [row for row in results["groups"] if row["dev_bleu"] is not None]
    if scored:
        best = max(scored, key=lambda row: row["dev_bleu"]["mean"])
        lines.append(f"- best mean dev BLEU: `{best['name']}` ({best['dev_bleu']['mean']:.2f}); choose on dev, "
                     f"report test once.")
    return lines


def print_groups(console, results: dict) -> None:
    """The group table's main columns on the console."""
    from rich.table import Table

    table = Table(title=f"sweep {results['sweep']}: variants over seeds and splits", title_justify="left")
    for header in ("variant", "runs", "test BLEU", "min–max", "p", "won/lost", "dev BLEU", "train PFLOPs"):
        table.add_column(header, justify="left" if header == "variant" else "right")
    for row in results["groups"]:
        table.add_row(row["name"], f"{row['done']}/{row['runs']}", spread_cell(row["test_bleu"], ".2f"),
                      _range(row["test_bleu"], ".2f"), "—" if row.get("p_value") is None else f"{row['p_value']:.3f}",
                      f"{row['wins']}/{row['losses']}" if "wins" in row else "—", spread_cell(row["dev_bleu"], ".2f"),
                      spread_cell(row["train_pflops"], ".3g"))
    console.print(table)
