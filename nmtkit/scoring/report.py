"""``nmtkit score``: read the files, check they line up, score, print a table or one JSON object.

Results go to stdout (a rich table, or JSON when asked); messages go to the stderr console.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from nmtkit.config.schema import SCORE_METRICS
from nmtkit.errors import ConfigError
from nmtkit.storage.files import decode_line, read_lines
from nmtkit.limits import check_range
from nmtkit.storage.outputs import check_output_file, open_output
from nmtkit.scoring.metrics import (DEFAULT_METRICS, check_line_counts, check_tokenizer, corpus_scores,
                                    resolve_tokenizer, segment_scores)

STDIN_NAME = "<stdin>"


def read_hypotheses(path: Optional[Path]) -> tuple[str, list[str]]:
    """Lines of ``path``, or of stdin when it is None or "-"; with the name used in messages."""
    if path is not None and str(path) != "-":
        return str(path), read_lines(path)
    if sys.stdin is None or sys.stdin.isatty():
        raise ConfigError("no hypotheses: pass -i FILE or pipe them on stdin")
    return STDIN_NAME, [decode_line(raw, STDIN_NAME, i) for i, raw in enumerate(sys.stdin.buffer, 1)]


@dataclass(frozen=True)
class ScoreOptions:
    """What to compute and how: ``nmtkit score``'s flags, and a recipe's eval section in ``run``."""

    metrics: tuple[str, ...] = DEFAULT_METRICS
    tokenize: str = ""  # BLEU's tokenizer; "": chosen from target_lang
    target_lang: str = ""
    lowercase: bool = False
    comet_model: str = ""
    comet_batch_size: int = 16

    @property
    def tokenizer(self) -> str:
        return resolve_tokenizer(self.tokenize, self.target_lang)

    def in_language(self, target_lang: str) -> "ScoreOptions":
        """These options for references in ``target_lang`` (a given tokenizer still wins)."""
        return dataclasses.replace(self, target_lang=target_lang)

    @property
    def sacrebleu_metrics(self) -> list[str]:
        return [name for name in self.metrics if name != "comet"]

    @property
    def reads_tokenizer(self) -> bool:
        """Whether a metric reads ``tokenize`` and ``target_lang``: BLEU tokenizes with them, TER
        reads them only to choose its CJK split; chrF, chrF++ and COMET never."""
        return "bleu" in self.metrics or "ter" in self.metrics


def check_options(options: ScoreOptions, tokenized_bleu: bool = False, baseline: Optional[Path] = None,
                  test: str = "bootstrap", resamples: int = 1000, alpha: float = 0.05,
                  with_sources: bool = False) -> None:
    """Fail on bad options (and a tokenizer or COMET that cannot run here) before reading any file."""
    unknown = [m for m in options.metrics if m not in SCORE_METRICS]
    if unknown:
        raise ConfigError(f"unknown metric {unknown[0]!r} in --metrics (choose from {', '.join(SCORE_METRICS)})")
    if not options.metrics and not tokenized_bleu:
        raise ConfigError("nothing to compute: --metrics is empty")
    check_range("eval.comet_batch_size", options.comet_batch_size, "--comet-batch-size")
    if "comet" in options.metrics:
        if not options.comet_model:
            raise ConfigError("--metrics comet needs --comet-model DIR, a local COMET model (docs/languages.md)")
        if not with_sources:
            raise ConfigError("--metrics comet needs the source sentences: give --source FILE")
        from nmtkit.scoring.comet import checkpoint_path, require_comet

        checkpoint_path(options.comet_model)
        require_comet()
    elif options.comet_model:
        raise ConfigError("--comet-model is for --metrics comet: add comet to --metrics or leave it out")
    if "bleu" in options.metrics:
        check_tokenizer(options.tokenizer)
    else:
        resolve_tokenizer(options.tokenize)
    if baseline is not None:
        from nmtkit.scoring.significance import check_test_options

        if not options.metrics:
            raise ConfigError("--baseline needs at least one metric in --metrics")
        check_test_options(test, resamples, alpha)


def score_all(hyps: Sequence[str], refs: Sequence[Sequence[str]], options: ScoreOptions,
              sources: Optional[Sequence[str]] = None, progress: bool = False) -> tuple[dict, Optional[Any]]:
    """Corpus scores of every metric asked for (sacreBLEU's, then COMET's against the first
    reference), and COMET's result with its segment scores (None without comet)."""
    scores = corpus_scores(hyps, refs, options.sacrebleu_metrics, options.lowercase, options.tokenizer)
    comet = None
    if "comet" in options.metrics:
        from nmtkit.scoring.comet import comet_scores

        comet = comet_scores(sources or [], hyps, refs[0], options.comet_model, options.comet_batch_size, progress)
        scores["comet"] = comet.as_dict()
    return scores, comet


def build_report(refs: Sequence[Path], hyp: Optional[Path], baseline: Optional[Path], options: ScoreOptions,
                 tokenized_bleu: bool = False, test: str = "bootstrap", resamples: int = 1000, alpha: float = 0.05,
                 sources: Optional[Path] = None, segments: Optional[Path] = None) -> dict[str, Any]:
    """Everything ``nmtkit score`` prints, as one JSON-ready dict; with ``segments``, also each
    line's scores written there as JSON lines."""
    options = dataclasses.replace(options, metrics=tuple(dict.fromkeys(options.metrics)))
    check_options(options, tokenized_bleu, baseline, test, resamples, alpha, with_sources=sources is not None)
    segments_path = check_output_file(segments, "--segments")
    named_refs = [(str(path), read_lines(path)) for path in refs]
    hyp_name, hyps = read_hypotheses(hyp)
    check_line_counts(hyp_name, hyps, named_refs)
    source_lines = read_lines(sources) if sources is not None else None
    if source_lines is not None:
        check_line_counts(hyp_name, hyps, [(str(sources), source_lines)])
    if baseline is not None:
        baseline_hyps = read_lines(baseline)
        check_line_counts(str(baseline), baseline_hyps, named_refs)
    ref_lines = [lines for _, lines in named_refs]

    scores, comet = score_all(hyps, ref_lines, options, source_lines, progress=True)
    # "tokenize" is BLEU's tokenizer, so only with BLEU (TER's CJK split shows in its own signature)
    tokenizer = {"tokenize": options.tokenizer} if "bleu" in options.metrics else {}
    report: dict[str, Any] = {"hypotheses": hyp_name, "references": [name for name, _ in named_refs],
                              "sentences": len(hyps), **tokenizer, "scores": scores}
    if tokenized_bleu:
        from nmtkit.scoring.tokenized import tokenized_bleu as paper_bleu

        report["tokenized_bleu"] = paper_bleu(hyps, ref_lines, lowercase=options.lowercase)
    if segments_path is not None:
        write_segments(segments_path, hyps, ref_lines, options, comet)
        report["segments"] = str(segments)
    if baseline is not None:
        report["significance"] = {"baseline": str(baseline), **_significance(
            hyps, baseline_hyps, ref_lines, source_lines, comet, options, test, resamples, alpha)}
    return report


def _significance(hyps, baseline_hyps, refs, sources, comet, options: ScoreOptions, test: str, resamples: int,
                  alpha: float) -> dict[str, Any]:
    """Every metric of the system against the baseline; COMET on its segment scores."""
    from nmtkit.scoring.significance import DEFAULT_SEED, paired_segment_test, paired_test

    results = paired_test(hyps, baseline_hyps, refs, options.sacrebleu_metrics, test, resamples, DEFAULT_SEED,
                          options.lowercase, alpha, options.tokenizer)
    if comet is not None:
        from nmtkit.scoring.comet import comet_scores

        base = comet_scores(sources, baseline_hyps, refs[0], options.comet_model, options.comet_batch_size)
        results["comet"] = paired_segment_test(comet.name, comet.segments, base.segments, test, resamples,
                                               DEFAULT_SEED, alpha)
    return {"test": test, "resamples": resamples, "seed": DEFAULT_SEED, "alpha": alpha, "confidence": 1 - alpha,
            "metrics": {name: result.as_dict() for name, result in results.items()}}


def write_segments(path: Path, hyps: Sequence[str], refs: Sequence[Sequence[str]], options: ScoreOptions,
                   comet: Optional[Any] = None) -> None:
    """One JSON object a line: {"line": n (from 1), metric: score, ...} (atomically for a file)."""
    rows = segment_scores(hyps, refs, options.sacrebleu_metrics, options.lowercase, options.tokenizer)
    if comet is not None:
        for row, score in zip(rows, comet.segments):
            row["comet"] = score
    text = "".join(json.dumps({"line": number, **row}, ensure_ascii=False) + "\n" for number, row in enumerate(rows, 1))
    with open_output(path, "w") as handle:
        handle.write(text)


SIGNIFICANCE_DEFAULTS = {"test": "bootstrap", "resamples": 1000, "alpha": 0.05}


def score_command(refs: Sequence[Path], hyp: Optional[Path], baseline: Optional[Path], options: ScoreOptions,
                  as_json: bool, tokenized_bleu: bool, test: Optional[str], resamples: Optional[int],
                  console, alpha: Optional[float] = None, sources: Optional[Path] = None,
                  segments: Optional[Path] = None) -> None:
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
    report = build_report(refs, hyp, baseline, options, tokenized_bleu, test, resamples, alpha, sources, segments)
    if as_json:
        print(json.dumps(report, ensure_ascii=False, indent=1))
    else:
        print_tables(report)


def _number(name: str, value: float, sign: str = "") -> str:
    """A score as shown: sacreBLEU's (0-100) to 2 decimals, COMET's (about 0-1) to 4."""
    return f"{value:{sign}.{4 if name == 'COMET' else 2}f}"


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
        table.add_row(entry["name"] + (" [red]†[/red]" if "note" in entry else ""),
                      _number(entry["name"], entry["score"]), entry["signature"])
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
        name = result["name"]
        sys_low, sys_high = result["system_ci"]
        base_low, base_high = result["baseline_ci"]
        verdict = f"{result['better']} better" if result["significant"] else "no significant difference"
        table.add_row(name, f"{_number(name, result['system'])} [{_number(name, sys_low)}, {_number(name, sys_high)}]",
                      f"{_number(name, result['baseline'])} [{_number(name, base_low)}, {_number(name, base_high)}]",
                      _number(name, result["delta"], "+"),
                      f"{result['p_value']:.4f}{'*' if result['significant'] else ''}", verdict)
    return table
