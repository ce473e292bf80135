"""Validation during training: dev loss/perplexity and dev BLEU on detokenized text.

Dev BLEU decodes dev sources, turns the pieces back into text with the target
SentencePiece model and scores them against the untouched dev references with sacreBLEU,
so it is comparable to test BLEU (not a subword BLEU).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from nmtkit.data.batching import collate, make_batches
from nmtkit.data.ids import ParallelIds
from nmtkit.data.vocab import Vocab
from nmtkit.device import autocast
from nmtkit.models.base import Seq2Seq
from nmtkit.training.loss import label_smoothed_loss


@torch.no_grad()
def dev_loss(model: Seq2Seq, dev: ParallelIds, max_tokens: int, device, dtype, max_len: Optional[int]) -> dict:
    """Per-token NLL and perplexity over the whole dev set (no label smoothing)."""
    model.eval()
    nll_sum, ntokens = 0.0, 0
    for indices in make_batches(dev.src_lengths(), dev.tgt_lengths(), max_tokens, 0, 0, shuffle=False):
        batch = collate(dev, indices, max_len).to(device)
        with autocast(device, dtype):
            logits = model(batch.src, batch.src_mask, batch.tgt_in)
        _, nll = label_smoothed_loss(logits, batch.tgt_out, 0.0)
        nll_sum += nll.item()
        ntokens += batch.ntokens
    loss = nll_sum / max(ntokens, 1)
    return {"dev_loss": loss, "dev_ppl": math.exp(min(loss, 50.0))}


@torch.no_grad()
def dev_bleu(model: Seq2Seq, dev: ParallelIds, references: list[str], tgt_vocab: Vocab, device, dtype,
             beam_size: int, decode_cfg, max_sentences: int, max_len: Optional[int]) -> dict:
    """sacreBLEU of the first ``max_sentences`` dev sentences (detokenized)."""
    from nmtkit.decoding.search import beam_search
    from nmtkit.scoring.metrics import corpus_scores

    model.eval()
    n = min(len(dev), max_sentences, len(references))
    lengths = dev.src_lengths()[:n]
    hyps: list[str] = [""] * n
    budget = max(decode_cfg.batch_tokens // max(beam_size, 1), 64)
    for indices in make_batches(lengths, np.zeros_like(lengths), budget, 0, 0, shuffle=False):
        batch = collate(dev, indices, max_len).to(device)
        with autocast(device, dtype):
            results = beam_search(model, batch.src, batch.src_mask, beam_size=beam_size, lenpen=decode_cfg.lenpen,
                                  max_len_a=decode_cfg.max_len_a, max_len_b=decode_cfg.max_len_b)
        for i, hyps_i in zip(indices, results):
            hyps[int(i)] = tgt_vocab.decode(hyps_i[0].tokens)
    scores = corpus_scores(hyps, [references[:n]], metrics=("bleu",))
    return {"dev_bleu": scores["bleu"]["score"]}
