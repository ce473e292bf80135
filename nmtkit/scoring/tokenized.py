"""Paper-style tokenized BLEU, as WMT14 En-De papers of the tensor2tensor era report it.

NOT sacreBLEU and not comparable with it: the text is tokenized (sacreBLEU's 13a or intl
tokenizer standing in for Moses' tokenizer.perl), hyphenated compounds are split
("a-b" -> "a ##AT##-##AT## b", which adds two matching tokens per compound and inflates
the score), and BLEU is then computed on those tokens without smoothing, with the
closest reference length, like Moses' multi-bleu.perl. Only ever reported on request.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

from nmtkit.errors import ConfigError
from nmtkit.scoring.metrics import bleu_details, check_line_counts

NAME = "BLEU (tokenized)"
NOTE = "paper-style tokenized BLEU with compound splitting: NOT sacreBLEU, not comparable with sacreBLEU scores"
TOKENIZERS = ("13a", "intl")

# tensor2tensor's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'.
# Matches do not overlap, so in "a-b-c" only the first hyphen is split; kept as the papers had it.
_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(text: str) -> str:
    """'well-known' -> 'well ##AT##-##AT## known'."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def _tokenizer(name: str) -> Any:
    if name == "13a":
        from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

        return Tokenizer13a()
    if name == "intl":
        from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International

        return TokenizerV14International()
    raise ConfigError(f"unknown tokenizer {name!r} for tokenized BLEU (choose from {', '.join(TOKENIZERS)})")


def paper_tokenize(lines: Sequence[str], tokenizer: str = "13a") -> list[str]:
    """Tokenize, then split hyphenated compounds."""
    tokenize = _tokenizer(tokenizer)
    return [split_compounds(tokenize(line.rstrip())) for line in lines]


def tokenized_bleu(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    tokenizer: str = "13a",
    lowercase: bool = False,
) -> dict[str, Any]:
    """Paper-style BLEU over tokenized, compound-split text; the same fields as
    ``corpus_scores()["bleu"]`` plus ``note``, with a signature that is not sacreBLEU's."""
    from sacrebleu.metrics import BLEU

    check_line_counts("hypotheses", hyps, [(f"reference {k}", ref) for k, ref in enumerate(refs, 1)])
    # tokenize="none": sacreBLEU only splits on whitespace here; smooth "none" and the
    # closest reference length are multi-bleu.perl's choices. force: the text is tokenized on purpose.
    metric = BLEU(lowercase=lowercase, tokenize="none", smooth_method="none", force=True)
    score = metric.corpus_score(paper_tokenize(hyps, tokenizer), [paper_tokenize(ref, tokenizer) for ref in refs])
    case = "lc" if lowercase else "mixed"
    signature = f"nmtkit-tokenized-bleu|nrefs:{len(refs)}|case:{case}|tok:{tokenizer}+compound-split|smooth:none"
    return {"name": NAME, "score": float(score.score), "signature": signature, "note": NOTE, **bleu_details(score)}
