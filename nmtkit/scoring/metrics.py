"""Corpus BLEU, chrF, chrF++ and TER through sacreBLEU, each with sacreBLEU's own signature.

Metrics are built with sacreBLEU's command-line defaults, so a score here equals
``sacrebleu REF -i HYP -m bleu chrf ter -tok TOK`` digit for digit (chrF++ is sacreBLEU's
``--chrf-word-order 2``; with a Chinese, Japanese or Korean tokenizer TER splits Chinese
characters one by one, sacreBLEU's ``--ter-asian-support --ter-normalized``: the first does
nothing without the second). sacreBLEU is imported inside the functions: importing it
costs ~0.1 s, and the training loop imports this module.
"""
from __future__ import annotations

from typing import Any, Sequence

from nmtkit.config.schema import SCORE_METRICS, SCORE_TOKENIZERS, default_tokenizer
from nmtkit.errors import ConfigError, DataError

METRICS = tuple(m for m in SCORE_METRICS if m != "comet")  # the sacreBLEU ones
DEFAULT_METRICS = ("bleu", "chrf", "ter")
LOWER_IS_BETTER = frozenset({"ter"})
TOKENIZERS = SCORE_TOKENIZERS
CJK_TOKENIZERS = frozenset({"zh", "ja-mecab", "ko-mecab"})
SPM_TOKENIZERS = frozenset({"flores101", "flores200", "spBLEU-1K"})  # sacreBLEU's, with a downloaded model
# the sacreBLEU extra each MeCab tokenizer needs (nmtkit's extras of the same name pull them in)
_MECAB_EXTRAS = {"ja-mecab": "ja", "ko-mecab": "ko"}

__all__ = ["DEFAULT_METRICS", "METRICS", "TOKENIZERS", "default_tokenizer", "corpus_scores", "make_metric",
           "resolve_tokenizer"]


def resolve_tokenizer(tokenize: str, lang: str = "") -> str:
    """``tokenize`` when given (checked), else the one for the target language ``lang``."""
    if not tokenize:
        return default_tokenizer(lang)
    if tokenize not in TOKENIZERS:
        raise ConfigError(f"unknown tokenizer {tokenize!r} (choose from {', '.join(TOKENIZERS)})")
    return tokenize


def check_tokenizer(tokenize: str) -> None:
    """Build sacreBLEU's tokenizer once, so what it lacks (MeCab, a SentencePiece model it cannot
    download) is a one-line error before any scoring, not a traceback in the middle of it."""
    from urllib.error import URLError

    from sacrebleu.metrics.bleu import BLEU

    try:
        BLEU(tokenize=resolve_tokenizer(tokenize))
    except RuntimeError as err:  # sacreBLEU's "requires extra dependencies" for the MeCab ones
        if tokenize in _MECAB_EXTRAS:
            extra = _MECAB_EXTRAS[tokenize]
            raise ConfigError(f"tokenizer {tokenize} needs MeCab and its dictionary: pip install 'nmtkit[{extra}]' "
                              f"(sacreBLEU's extra sacrebleu[{extra}])") from err
        if tokenize in SPM_TOKENIZERS:  # SentencePiece cannot read the file where the model should be
            raise ConfigError(f"tokenizer {tokenize}: sacreBLEU's SentencePiece model is not readable "
                              f"({_reason(err)}): {spm_model_hint(tokenize)}") from None
        raise
    except (URLError, OSError) as err:  # the flores SentencePiece models, fetched on first use
        raise ConfigError(f"tokenizer {tokenize} needs sacreBLEU's SentencePiece model, which it could not "
                          f"download ({_reason(err)}): {spm_model_hint(tokenize)}") from None


def _reason(err: Exception) -> str:
    return str(getattr(err, "reason", None) or err).splitlines()[0]


def spm_model_hint(tokenize: str) -> str:
    """Where sacreBLEU looks for a flores tokenizer's model and where to fetch it from."""
    import os

    from sacrebleu.tokenizers import tokenizer_spm

    url = tokenizer_spm.SPM_MODELS[tokenize]["url"]
    path = os.path.join(tokenizer_spm.SACREBLEU_DIR, "models", os.path.basename(url))
    return f"fetch {url} to {path} on a machine with network access"


def make_metric(name: str, lowercase: bool = False, tokenize: str = "13a") -> Any:
    """A sacreBLEU metric object with its CLI defaults; ``tokenize`` is BLEU's tokenizer.

    ``lowercase`` affects BLEU and chrF; sacreBLEU's TER is case-insensitive by default
    (its signature says ``case:lc``), so it is the same either way.
    """
    from sacrebleu.metrics import BLEU, CHRF, TER

    if name == "bleu":
        return BLEU(lowercase=lowercase, tokenize=resolve_tokenizer(tokenize))
    if name == "chrf":
        return CHRF(lowercase=lowercase)
    if name == "chrf++":
        return CHRF(lowercase=lowercase, word_order=2)
    if name == "ter":  # sacreBLEU splits CJK characters only in its normalised mode
        cjk = tokenize in CJK_TOKENIZERS
        return TER(asian_support=cjk, normalized=cjk)
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
    metrics: Sequence[str] = DEFAULT_METRICS,
    lowercase: bool = False,
    tokenize: str = "13a",
) -> dict[str, dict[str, Any]]:
    """Score hypotheses against one or more reference streams (``refs[k][i]`` is reference k of line i).

    Returns ``{metric: {"name", "score", "signature", ...}}`` keyed by bleu/chrf/chrf++/ter;
    BLEU adds precisions, counts, totals, bp, ratio, sys_len and ref_len.
    """
    check_line_counts("hypotheses", hyps, [(f"reference {k}", ref) for k, ref in enumerate(refs, 1)])
    results: dict[str, dict[str, Any]] = {}
    for name in metrics:
        metric = make_metric(name, lowercase, tokenize)
        score = metric.corpus_score(list(hyps), [list(ref) for ref in refs])
        # The signature is read after scoring: sacreBLEU learns the number of references then.
        results[name] = {"name": score.name, "score": float(score.score),
                         "signature": metric.get_signature().format()}
        if name == "bleu":
            results[name].update(bleu_details(score))
    return results


def segment_scores(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    lowercase: bool = False,
    tokenize: str = "13a",
) -> list[dict[str, float]]:
    """One ``{metric: score}`` per line, as sacreBLEU's ``sentence_score`` gives it (BLEU with
    effective order, as ``sacrebleu --sentence-level`` does)."""
    from sacrebleu.metrics import BLEU

    check_line_counts("hypotheses", hyps, [(f"reference {k}", ref) for k, ref in enumerate(refs, 1)])
    rows: list[dict[str, float]] = [{} for _ in hyps]
    for name in metrics:
        metric = (BLEU(lowercase=lowercase, tokenize=resolve_tokenizer(tokenize), effective_order=True)
                  if name == "bleu" else make_metric(name, lowercase, tokenize))
        for row, hyp, *line_refs in zip(rows, hyps, *refs):
            row[name] = float(metric.sentence_score(hyp, list(line_refs)).score)
    return rows
