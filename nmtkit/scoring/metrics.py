"""Corpus BLEU, chrF and TER through sacreBLEU, each with sacreBLEU's own signature.

Metrics are built with sacreBLEU's command-line defaults, so a score here equals
``sacrebleu REF -i HYP -m bleu chrf ter`` digit for digit. sacreBLEU is imported inside
the functions: importing it costs ~0.1 s, and the training loop imports this module.
"""
from __future__ import annotations

from typing import Any, Sequence

from nmtkit.errors import ConfigError, DataError

METRICS = ("bleu", "chrf", "ter")
LOWER_IS_BETTER = frozenset({"ter"})


def make_metric(name: str, lowercase: bool = False) -> Any:
    """A sacreBLEU metric object with its CLI defaults.

    ``lowercase`` affects BLEU and chrF; sacreBLEU's TER is case-insensitive by default
    (its signature says ``case:lc``), so it is the same either way.
    """
    from sacrebleu.metrics import BLEU, CHRF, TER

    if name == "bleu":
        return BLEU(lowercase=lowercase)
    if name == "chrf":
        return CHRF(lowercase=lowercase)
    if name == "ter":
        return TER()
    raise ConfigError(f"unknown metric {name!r} (choose from {', '.join(METRICS)})")


def _lines(count: int) -> str:
    return "1 line" if count == 1 else f"{count} lines"


def check_line_counts(hyp_name: str, hyps: Sequence[str], refs: Sequence[tuple[str, Sequence[str]]]) -> None:
    """DataError unless the hypotheses and every named reference have the same, non-zero length."""
    if not refs:
        raise DataError("no references given")
    for ref_name, ref in refs:
        if len(ref) != len(hyps):
            found = "is empty" if not hyps else f"has {_lines(len(hyps))}"
            raise DataError(f"line counts differ: {hyp_name} {found} but {ref_name} has {_lines(len(ref))}")
    if not hyps:
        raise DataError(f"nothing to score: {hyp_name} and the references are empty")


def bleu_details(score: Any) -> dict[str, Any]:
    """The parts of a sacreBLEU ``BLEUScore`` behind the number: precisions, brevity penalty, lengths."""
    return {
        "precisions": [float(p) for p in score.precisions],
        "counts": [int(c) for c in score.counts],
        "totals": [int(t) for t in score.totals],
        "bp": float(score.bp),
        "ratio": float(score.ratio),
        "sys_len": int(score.sys_len),
        "ref_len": int(score.ref_len),
    }


def corpus_scores(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = METRICS,
    lowercase: bool = False,
) -> dict[str, dict[str, Any]]:
    """Score hypotheses against one or more reference streams (``refs[k][i]`` is reference k of line i).

    Returns ``{metric: {"name", "score", "signature", ...}}`` keyed by bleu/chrf/ter;
    BLEU adds precisions, counts, totals, bp, ratio, sys_len and ref_len.
    """
    check_line_counts("hypotheses", hyps, [(f"reference {k}", ref) for k, ref in enumerate(refs, 1)])
    results: dict[str, dict[str, Any]] = {}
    for name in metrics:
        metric = make_metric(name, lowercase)
        score = metric.corpus_score(list(hyps), [list(ref) for ref in refs])
        # The signature is read after scoring: sacreBLEU learns the number of references then.
        results[name] = {"name": score.name, "score": float(score.score),
                         "signature": metric.get_signature().format()}
        if name == "bleu":
            results[name].update(bleu_details(score))
    return results
