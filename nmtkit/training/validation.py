"""Validation during training: dev loss/perplexity and dev BLEU on detokenized text.

Dev BLEU translates the dev source text with ``Translator``, the code behind ``nmtkit
translate`` (same encoding, batching, empty-line handling and search), and scores the
detokenized output against the untouched dev references with sacreBLEU, so it equals what
``nmtkit translate`` + ``nmtkit score`` give for the same weights (not a subword BLEU).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from nmtkit.data.batching import collate, make_batches
from nmtkit.data.ids import ParallelIds
from nmtkit.data.vocab import Vocab
from nmtkit.models.base import Seq2Seq
from nmtkit.runtime.device import autocast
from nmtkit.training.loss import projected_smoothed_loss


@torch.no_grad()
def dev_loss(model: Seq2Seq, dev: ParallelIds, max_tokens: int, device, dtype, max_len: Optional[int]) -> dict:
    """Per-token NLL and perplexity over the whole dev set (no label smoothing)."""
    model.eval()
    nll_sum, ntokens = 0.0, 0
    for indices in make_batches(dev.src_lengths(), dev.tgt_lengths(), max_tokens, 0, 0, shuffle=False):
        batch = collate(dev, indices, max_len).to(device)
        with autocast(device, dtype):
            hidden = model.features(batch.src, batch.src_mask, batch.tgt_in)
            _, nll = projected_smoothed_loss(hidden, model.output_proj, batch.tgt_out, 0.0)  # no [tokens, V] logits
        nll_sum += nll.item()
        ntokens += batch.ntokens
    loss = nll_sum / max(ntokens, 1)
    return {"dev_loss": loss, "dev_ppl": math.exp(min(loss, 50.0))}


def dev_bleu(model: Seq2Seq, sources: list[str], references: list[str], src_vocab: Vocab, tgt_vocab: Vocab,
             device, dtype, options, max_sentences: int, tokenize: str = "13a", lowercase: bool = False) -> dict:
    """sacreBLEU of the first ``max_sentences`` dev sentences, translated from their text by
    the same ``Translator`` as ``nmtkit translate`` with ``options`` (TranslateOptions), scored
    with the recipe's eval.tokenize and eval.lowercase (as ``nmtkit run`` scores dev and test)."""
    from nmtkit.decoding.torch_engine import TorchEngine
    from nmtkit.decoding.translate import Translator
    from nmtkit.scoring.metrics import corpus_scores

    n = min(len(sources), max_sentences, len(references))
    # dev sources whole, as far as the model goes; one batch at a time, as autocast holds only on this thread
    options = dataclasses.replace(options, max_source_len=10**8, workers=1)
    translator = Translator(TorchEngine(model, src_vocab, tgt_vocab, options, device), options)
    with autocast(device, dtype):
        hyps = translator.translate(sources[:n])
    scores = corpus_scores(hyps, [references[:n]], metrics=("bleu",), lowercase=lowercase, tokenize=tokenize)
    return {"dev_bleu": scores["bleu"]["score"]}
