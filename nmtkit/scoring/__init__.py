"""Scoring with sacreBLEU (BLEU, chrF, TER), paired significance tests and, on request only,
paper-style tokenized BLEU. No torch here: the package stays light enough for any command."""
from nmtkit.scoring.metrics import corpus_scores

__all__ = ["corpus_scores"]
