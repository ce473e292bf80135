"""``nmtkit score``: read the files, check they line up, score, print a table or one JSON object.

Results go to stdout (a rich table, or JSON when asked); messages go to the stderr console.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from nmtkit.errors import ConfigError
from nmtkit.scoring.metrics import METRICS, check_line_counts, corpus_scores
from nmtkit.storage.files import decode_line, read_lines

STDIN_NAME = "<stdin>"


def read_hypotheses(path: Optional[Path]) -> tuple[str, list[str]]:
    """Lines of ``path``, or of stdin when it is None or "-"; with the name used in messages."""
    if path is not None and str(path) != "-":
        return str(path), read_lines(path)
    if sys.stdin is None or sys.stdin.isatty():
        raise ConfigError("no hypotheses: pass -i FILE or pipe them on stdin")
    return STDIN_NAME, [decode_line(raw, STDIN_NAME, i) for i, raw in enumerate(sys.stdin.buffer, 1)]


def _check_options(metrics: Sequence[str], tokenized_bleu: bool, baseline: Optional[Path], test: str,
                   resamples: int, alpha: float) -> None:
    """Fail on bad options before reading any file."""
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ConfigError(f"unknown metric {unknown[0]!r} in --metrics (choose from {', '.join(METRICS)})")
    if not metrics and not tokenized_bleu:
        raise ConfigError("nothing to compute: --metrics is empty")
    if baseline is not None:
        from nmtkit.scoring.significance import check_test_options

        if not metrics:
            raise ConfigError("--baseline needs at least one sacreBLEU metric in --metrics")
        check_test_options(test, resamples, alpha)


def build_report(refs: Sequence[Path], hyp: Optional[Path], baseline: Optional[Path], metrics: Sequence[str],
                 tokenized_bleu: bool, test: str, resamples: int, lowercase: bool,
                 alpha: float = 0.05) -> dict[str, Any]:
    """Everything ``nmtkit score`` prints, as one JSON-ready dict."""
    metrics = list(dict.fromkeys(metrics))
    _check_options(metrics, tokenized_bleu, baseline, test, resamples, alpha)
    named_refs = [(str(path), read_lines(path)) for path in refs]
    hyp_name, hyps = read_hypotheses(hyp)
    check_line_counts(hyp_name, hyps, named_refs)
    if baseline is not None:
        baseline_hyps = read_lines(baseline)
        check_line_counts(str(baseline), baseline_hyps, named_refs)
    ref_lines = [lines for _, lines in named_refs]

    report: dict[str, Any] = {"hypotheses": hyp_name, "references": [name for name, _ in named_refs],
                              "sentences": len(hyps), "scores": corpus_scores(hyps, ref_lines, metrics, lowercase)}
    if tokenized_bleu:
        from nmtkit.scoring.tokenized import tokenized_bleu as paper_bleu

        report["tokenized_bleu"] = paper_bleu(hyps, ref_lines, lowercase=lowercase)
    if baseline is not None:
        from nmtkit.scoring.significance import DEFAULT_SEED, paired_test

        results = paired_test(hyps, baseline_hyps, ref_lines, metrics, test, resamples, DEFAULT_SEED, lowercase,
                              alpha)
        report["significance"] = {"baseline": str(baseline), "test": test, "resamples": resamples,
                                  "seed": DEFAULT_SEED, "alpha": alpha, "confidence": 1 - alpha,
                                  "metrics": {name: result.as_dict() for name, result in results.items()}}
    return report


SIGNIFICANCE_DEFAULTS = {"test": "bootstrap", "resamples": 1000, "alpha": 0.05}


def score_command(refs: Sequence[Path], hyp: Optional[Path], baseline: Optional[Path], metrics: Sequence[str],
                  as_json: bool, tokenized_bleu: bool, test: Optional[str], resamples: Optional[int],
                  lowercase: bool, console, alpha: Optional[float] = None) -> None:
    """The ``nmtkit score`` command: JSON or tables on stdout. ``test``, ``resamples`` and
    ``alpha`` (None: SIGNIFICANCE_DEFAULTS) set the significance test, so they need ``baseline``."""
    given = {"--test": test, "--resamples": resamples, "--alpha": alpha}
    if baseline is None and any(value is not None for value in given.values()):
        flag = next(name for name, value in given.items() if value is not None)
        raise ConfigError(f"{flag} sets the significance test against --baseline; give --baseline FILE or leave it out")
    test = SIGNIFICANCE_DEFAULTS["test"] if test is None else test
    resamples = SIGNIFICANCE_DEFAULTS["resamples"] if resamples is None else resamples
    alpha = SIGNIFICANCE_DEFAULTS["alpha"] if alpha is None else alpha
    if baseline is not None:
        console.detail(f"significance: {test}, {resamples} resamples, alpha {alpha}")
    report = build_report(refs, hyp, baseline, metrics, tokenized_bleu, test, resamples, lowercase, alpha)
    if as_json:
        print(json.dumps(report, ensure_ascii=False, indent=1))
    else:
        print_tables(report)


def _bleu_verbose(entry: dict[str, Any]) -> str:
    """sacreBLEU's familiar detail string: precisions, BP, ratio, lengths."""
    precisions = "/".join(f"{p:.1f}" for p in entry["precisions"])
    return (f"{precisions} (BP = {entry['bp']:.3f} ratio = {entry['ratio']:.3f} "
            f"hyp_len = {entry['sys_len']} ref_len = {entry['ref_len']})")


def print_tables(report: dict[str, Any]) -> None:
    """The scores table and, with a baseline, the significance table, on stdout."""
    from rich.console import Console
    from rich.table import Table

    out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    if not out.is_terminal:
        out.width = 200  # piped output: keep each row on one line
    table = Table(title=f"{report['hypotheses']}: {report['sentences']} sentences, "
                        f"{len(report['references'])} reference(s)", title_justify="left")
    table.add_column("metric")
    table.add_column("score", justify="right")
    table.add_column("signature", overflow="fold")
    entries = list(report["scores"].values())
    if "tokenized_bleu" in report:
        entries.append(report["tokenized_bleu"])
    for entry in entries:
        table.add_row(entry["name"] + (" [red]†[/red]" if "note" in entry else ""), f"{entry['score']:.2f}",
                      entry["signature"])
    captions = [f"{entry['name']}: {_bleu_verbose(entry)}" for entry in entries if "precisions" in entry]
    if "tokenized_bleu" in report:
        captions.append(f"† {report['tokenized_bleu']['note']}")
    table.caption, table.caption_justify = "\n".join(captions), "left"
    out.print(table)
    if "significance" in report:
        out.print(_significance_table(report["significance"]))


def _significance_table(significance: dict[str, Any]):
    from rich.table import Table

    test = "paired bootstrap" if significance["test"] == "bootstrap" else "approximate randomisation"
    alpha, ci = significance["alpha"], f"{100 * significance['confidence']:g}% CI"
    table = Table(title=f"system vs baseline {significance['baseline']}: {test}, {significance['resamples']} "
                        f"resamples, seed {significance['seed']}", title_justify="left",
                  caption=f"[{ci}] bootstrap percentiles; * p < {alpha:g}: a system is named better only then",
                  caption_justify="left")
    for column in ("metric", f"system [{ci}]", f"baseline [{ci}]", "delta", "p-value", "verdict"):
        table.add_column(column, justify="left" if column in ("metric", "verdict") else "right")
    for result in significance["metrics"].values():
        sys_low, sys_high = result["system_ci"]
        base_low, base_high = result["baseline_ci"]
        verdict = f"{result['better']} better" if result["significant"] else "no significant difference"
        table.add_row(result["name"], f"{result['system']:.2f} [{sys_low:.2f}, {sys_high:.2f}]",
                      f"{result['baseline']:.2f} [{base_low:.2f}, {base_high:.2f}]", f"{result['delta']:+.2f}",
                      f"{result['p_value']:.4f}{'*' if result['significant'] else ''}", verdict)
    return table
