"""Paired significance tests of a system against a baseline on the same references.

Both tests work on sacreBLEU's per-sentence sufficient statistics (n-gram matches for
BLEU and chrF, edits for TER): a resampled corpus is a weighted sum of those rows,
rescored with sacreBLEU's own formula, so no sentence is re-tokenised.

- Paired bootstrap (Koehn 2004): draw sentences with replacement, score both systems on
  the same draw. Two-sided p-value with the resampled differences centred on the observed
  one, i.e. shifted to the null hypothesis (Berg-Kirkpatrick et al. 2012).
- Approximate randomisation (Riezler & Maxwell 2005): swap the two systems' outputs of each
  sentence with probability 1/2; p-value = how often the shuffled difference is as large.

Both p-values count ties as "as extreme" and use (1 + count) / (1 + trials), so two
identical systems get p = 1. A system is named better only when p < alpha (0.05 unless
chosen); otherwise the verdict is "no significant difference", whatever the sign of the
delta. The (1 - alpha) confidence interval of each system is the alpha/2 to 1 - alpha/2
percentile range of its bootstrap scores. Everything is seeded and deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from nmtkit.errors import ConfigError
from nmtkit.limits import check_range
from nmtkit.scoring.metrics import DEFAULT_METRICS, LOWER_IS_BETTER, check_line_counts, make_metric

TESTS = ("bootstrap", "ar")
DEFAULT_SEED = 12345
DEFAULT_ALPHA = 0.05
NO_DIFFERENCE = "none"  # ``better`` when p >= alpha
# Scores are 0..100; differences closer than this are ties (float rounding of averaged TER lengths).
_TIE = 1e-9
# Cells of the (resamples x sentences) weight matrix built at once, to bound memory.
_CHUNK_CELLS = 1 << 22


@dataclass(frozen=True)
class PairedResult:
    """One metric's comparison; scores are sacreBLEU's, intervals are 95% bootstrap percentiles."""

    metric: str
    name: str
    system: float
    baseline: float
    p_value: float
    system_ci: tuple[float, float]
    baseline_ci: tuple[float, float]
    alpha: float = DEFAULT_ALPHA

    @property
    def delta(self) -> float:
        return self.system - self.baseline

    @property
    def significant(self) -> bool:
        return self.p_value < self.alpha

    @property
    def better(self) -> str:
        """The side that is significantly better on this metric (TER: lower), or ``none``."""
        if not self.significant or self.system == self.baseline:
            return NO_DIFFERENCE
        system_higher = self.system > self.baseline
        return "system" if system_higher != (self.metric in LOWER_IS_BETTER) else "baseline"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "system": self.system, "baseline": self.baseline, "delta": self.delta,
                "p_value": self.p_value, "significant": self.significant, "better": self.better,
                "system_ci": list(self.system_ci), "baseline_ci": list(self.baseline_ci)}


def score_with_stats(metric: Any, hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> tuple[Any, np.ndarray]:
    """sacreBLEU's corpus score (exactly as ``corpus_score`` sums it) and the per-sentence
    sufficient statistics, float64 [N, K]. Uses the internal hooks that sacreBLEU's own
    ``sacrebleu.significance`` relies on."""
    stats = metric._extract_corpus_statistics(list(hyps), [list(ref) for ref in refs])
    return metric._aggregate_and_compute(stats), np.asarray(stats, dtype=np.float64)


def scores_from_totals(metric: Any, totals: np.ndarray) -> np.ndarray:
    """sacreBLEU scores of corpora given by summed statistics: [R, K] -> [R]."""
    return np.array([metric._compute_score_from_stats(row.tolist()).score for row in np.atleast_2d(totals)])


def _chunks(total: int, sentences: int) -> Iterator[int]:
    rows = max(1, _CHUNK_CELLS // max(sentences, 1))
    for start in range(0, total, rows):
        yield min(rows, total - start)


def bootstrap_totals(stats: Sequence[np.ndarray], resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Summed statistics [resamples, K] of each array in ``stats`` under the same bootstrap draws."""
    sentences = len(stats[0])
    uniform = np.full(sentences, 1.0 / sentences)
    parts: list[list[np.ndarray]] = [[] for _ in stats]
    for rows in _chunks(resamples, sentences):
        # How often each sentence is drawn in each resample: [rows, N].
        weights = rng.multinomial(sentences, uniform, size=rows).astype(np.float64)
        for part, array in zip(parts, stats):
            part.append(weights @ array)
    return [np.concatenate(part) for part in parts]


def randomised_totals(sys_stats: np.ndarray, base_stats: np.ndarray, trials: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Summed statistics [trials, K] of two pseudo-systems, each sentence's outputs swapped with p = 1/2."""
    sys_total, both_total = sys_stats.sum(0), sys_stats.sum(0) + base_stats.sum(0)
    swap_gain = base_stats - sys_stats
    parts = []
    for rows in _chunks(trials, len(sys_stats)):
        swapped = rng.integers(0, 2, size=(rows, len(sys_stats))).astype(np.float64)  # [rows, N]
        parts.append(sys_total + swapped @ swap_gain)
    first = np.concatenate(parts)
    return first, both_total - first


def bootstrap_p_value(deltas: np.ndarray, observed: float) -> float:
    """Two-sided: share of resampled differences, shifted by -observed, at least as far from 0."""
    extreme = np.abs(deltas - observed) >= abs(observed) - _TIE
    return float((1 + extreme.sum()) / (1 + len(deltas)))


def randomisation_p_value(shuffled_deltas: np.ndarray, observed: float) -> float:
    """Two-sided: share of shuffled differences at least as large as the observed one."""
    extreme = np.abs(shuffled_deltas) >= abs(observed) - _TIE
    return float((1 + extreme.sum()) / (1 + len(shuffled_deltas)))


def _interval(scores: np.ndarray, alpha: float) -> tuple[float, float]:
    low, high = np.percentile(scores, [50 * alpha, 100 - 50 * alpha])
    return float(low), float(high)


def check_test_options(test: str, resamples: int, alpha: float = DEFAULT_ALPHA) -> None:
    if test not in TESTS:
        raise ConfigError(f"unknown significance test {test!r} (choose from {', '.join(TESTS)})")
    check_range("score.resamples", resamples, "resamples")
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha must be between 0 and 1 (exclusive), got {alpha}")


def paired_test(
    hyps: Sequence[str],
    baseline_hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    test: str = "bootstrap",
    resamples: int = 1000,
    seed: int = DEFAULT_SEED,
    lowercase: bool = False,
    alpha: float = DEFAULT_ALPHA,
    tokenize: str = "13a",
) -> dict[str, PairedResult]:
    """Compare a system with a baseline on every sacreBLEU metric; ``resamples`` bootstrap draws for
    the intervals (and the p-value when test="bootstrap"), as many shuffles when test="ar"."""
    check_test_options(test, resamples, alpha)
    named_refs = [(f"reference {k}", ref) for k, ref in enumerate(refs, 1)]
    check_line_counts("system", hyps, named_refs)
    check_line_counts("baseline", baseline_hyps, named_refs)
    results = {}
    for name in metrics:
        metric = make_metric(name, lowercase, tokenize)
        system, sys_stats = score_with_stats(metric, hyps, refs)
        baseline, base_stats = score_with_stats(metric, baseline_hyps, refs)
        results[name] = _compare(name, system.name, metric, (system.score, sys_stats), (baseline.score, base_stats),
                                 test, resamples, seed, alpha)
    return results


class MeanOfSegments:
    """A metric whose corpus score is the mean of its segment scores (COMET), behind the same
    statistics hooks as sacreBLEU's: a sentence's statistics are (its score, 1), so a resampled
    corpus is rescored as sum / count."""

    @staticmethod
    def _compute_score_from_stats(totals: Sequence[float]) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(score=totals[0] / totals[1])


def paired_segment_test(name: str, system: Sequence[float], baseline: Sequence[float], test: str = "bootstrap",
                        resamples: int = 1000, seed: int = DEFAULT_SEED, alpha: float = DEFAULT_ALPHA,
                        metric: str = "comet") -> PairedResult:
    """``paired_test`` for a metric given as segment scores whose corpus score is their mean."""
    check_test_options(test, resamples, alpha)
    if len(system) != len(baseline) or not system:
        raise ConfigError(f"{name}: system and baseline need the same, non-zero number of segment scores")
    sys_stats, base_stats = (np.stack([np.asarray(scores, dtype=np.float64), np.ones(len(scores))], axis=1)
                             for scores in (system, baseline))  # [N, 2]: (score, 1)
    return _compare(metric, name, MeanOfSegments(), (float(np.mean(system)), sys_stats),
                    (float(np.mean(baseline)), base_stats), test, resamples, seed, alpha)


def _compare(metric_key: str, name: str, metric: Any, system: tuple[float, np.ndarray],
             baseline: tuple[float, np.ndarray], test: str, resamples: int, seed: int, alpha: float) -> PairedResult:
    """One metric's p-value and intervals from the two systems' (score, statistics [N, K])."""
    (sys_score, sys_stats), (base_score, base_stats) = system, baseline
    observed = sys_score - base_score
    # A fresh generator per metric: every metric sees the same draws, whatever else is asked for.
    bootstrap_seed, shuffle_seed = np.random.SeedSequence(seed).spawn(2)
    sys_boot, base_boot = (scores_from_totals(metric, totals) for totals in
                           bootstrap_totals([sys_stats, base_stats], resamples, np.random.default_rng(bootstrap_seed)))
    if test == "bootstrap":
        p_value = bootstrap_p_value(sys_boot - base_boot, observed)
    else:
        first, second = randomised_totals(sys_stats, base_stats, resamples, np.random.default_rng(shuffle_seed))
        p_value = randomisation_p_value(scores_from_totals(metric, first) - scores_from_totals(metric, second),
                                        observed)
    return PairedResult(metric=metric_key, name=name, system=float(sys_score), baseline=float(base_score),
                        p_value=p_value, system_ci=_interval(sys_boot, alpha), baseline_ci=_interval(base_boot, alpha),
                        alpha=alpha)


def paired_runs_test(runs: Sequence[tuple[Sequence[str], Sequence[str], Sequence[str], Any]], metric_name: str = "bleu",
                     resamples: int = 1000, seed: int = DEFAULT_SEED, lowercase: bool = False,
                     tokenize: str = "13a") -> PairedResult:
    """A system against a baseline over several paired runs: each run is (system hyps, baseline
    hyps, references, its test-set key), the two systems trained with the same seed on the same
    split. The score is the metric of all runs' outputs pooled (one corpus of every run's test
    set); the paired bootstrap draws the sentences of each test set, and a drawn sentence brings
    its outputs of every run on that test set (the runs of other seeds): the sentence, not the
    (sentence, seed), is the unit sampled, so k seeds do not pass for k times the test data."""
    check_test_options("bootstrap", resamples)
    metric = make_metric(metric_name, lowercase=lowercase, tokenize=tokenize)
    clusters: dict[Any, list[np.ndarray]] = {}
    for hyps, baseline_hyps, refs, key in runs:
        check_line_counts("system", hyps, [("reference", refs)])
        check_line_counts("baseline", baseline_hyps, [("reference", refs)])
        _, sys_stats = score_with_stats(metric, hyps, [refs])
        _, base_stats = score_with_stats(metric, baseline_hyps, [refs])
        if key in clusters and clusters[key][0].shape != sys_stats.shape:
            raise ConfigError(f"runs on test set {key!r} have different numbers of sentences")
        summed = clusters.setdefault(key, [np.zeros_like(sys_stats), np.zeros_like(base_stats)])
        summed[0] += sys_stats
        summed[1] += base_stats
    sys_stats = np.concatenate([pair[0] for pair in clusters.values()])  # [sentences of all test sets, K]
    base_stats = np.concatenate([pair[1] for pair in clusters.values()])
    system, baseline = (float(scores_from_totals(metric, stats.sum(0))[0]) for stats in (sys_stats, base_stats))
    sys_boot, base_boot = (scores_from_totals(metric, totals) for totals in
                           bootstrap_totals([sys_stats, base_stats], resamples,
                                            np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[0])))
    return PairedResult(metric=metric_name, name=metric_name, system=system, baseline=baseline,
                        p_value=bootstrap_p_value(sys_boot - base_boot, system - baseline),
                        system_ci=_interval(sys_boot, DEFAULT_ALPHA), baseline_ci=_interval(base_boot, DEFAULT_ALPHA))


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test of ``wins`` against ``losses`` (ties left out): the chance of a
    split at least this uneven between two systems that are equally good. 1.0 with no decided pair."""
    from math import comb

    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(wins, losses) + 1)) / 2 ** n
    return min(1.0, 2 * tail)
