"""Search over the model contract of ``nmtkit.models.base``: beam, greedy and sampling.

Every search works on any ``Seq2Seq``: it calls ``encode`` once, ``init_state(enc, rows)``
and then ``decode_step`` per output position, and reorders hypotheses only through
``state.select`` / ``enc.select``. Search owns log-softmax, EOS handling and scoring.

Scoring (one rule for every search):
    logprob  = sum of log p(y_t | y_<t, x) over the output pieces and the final EOS
    score    = logprob / lp(|y|),   lp(L) = ((5 + L) / 6) ** lenpen   (GNMT, Wu et al. 2016)
``|y|`` counts output pieces without BOS/EOS. ``lenpen`` = 0 ranks by the raw sum of
log-probabilities (which favours short outputs); a larger ``lenpen`` divides the
(negative) log-probability of long outputs by more and so favours longer outputs.

Output length per sentence: at most ``floor(max_len_a * |x| + max_len_b)`` pieces, |x| the
source pieces, capped by the model's ``max_positions``. At that length only EOS is allowed,
so a hypothesis reaching it is finished there; its score includes the EOS log-probability, or,
with ``eos_at_limit`` "free", counts that forced EOS as log 1 = 0 (transformers' ``generate`` with
``forced_eos_token_id``, which then prefers outputs cut at the limit more than we do).
EOS is blocked before ``min_len`` pieces; the length limit wins if the two conflict.
PAD and BOS are never generated.

Target prefixes (``prefixes``, per sentence a list of pieces, [] for none): the first pieces
of every hypothesis are forced to the prefix (their log-probabilities count in the score),
then the search goes on from it. A sentence's length limit is raised to its prefix length
where it is shorter. Lexical constraints (``constraints``, beam search only): see
``constraints.py``. Sentences given neither decode exactly as without them.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from nmtkit.decoding.constraints import LexicalConstraints
from nmtkit.decoding.hypothesis import Hypothesis, length_penalty
from nmtkit.decoding.options import SearchSettings
from nmtkit.models.base import Seq2Seq
from nmtkit.specials import BOS, EOS, PAD, UNK

NEG_INF = float("-inf")
# greedy search drops finished sentences only once they are over this share of its batch: each drop
# copies every cache (RNN states at once, Transformer caches in the next step's append), and an ended
# row that stays costs one row of compute per step while its output stays fixed (EOS fed, nothing
# added); benchmarks/RESULTS.md, "Batches side by side", measures it (before the deferred reorder).
COMPACT_SHARE = 0.1
DEFAULT = SearchSettings()  # its defaults are DecodeConfig's and TranslateOptions' (decoding/options.py)


def output_limits(src: Tensor, src_mask: Tensor, max_len_a: float, max_len_b: int,
                  max_positions: Optional[int], prefix_lengths: Optional[Tensor] = None) -> Tensor:
    """[B] longest output (pieces, EOS excluded) per sentence: a * |x| + b, at least the
    sentence's prefix (``prefix_lengths`` [B]), within max_positions (one sentence without torch:
    ``hypothesis.output_limit``)."""
    src_pieces = (src_mask & (src.gt(EOS) | src.eq(UNK))).sum(1).float()  # pieces, <unk> too; not BOS/EOS/PAD
    limits = torch.floor(src_pieces * max_len_a + max_len_b).long().clamp(min=0)
    if prefix_lengths is not None:
        limits = torch.maximum(limits, prefix_lengths)
    if max_positions is not None:  # decoder input at step t sits at position t (BOS at 0)
        limits = limits.clamp(max=max_positions - 1)
    return limits


def constrained_logprobs(logits: Tensor, step: int, min_len: int, limits: Tensor,
                         free_eos: bool = False) -> Tensor:
    """Log-softmax over [rows, V] in float32 with PAD/BOS banned, EOS blocked before
    ``min_len`` and forced once a row reaches its length limit ``limits`` [rows] (keeping its
    log-probability, or 0 with ``free_eos``)."""
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    eos = torch.zeros_like(lprobs[:, EOS]) if free_eos else lprobs[:, EOS].clone()
    lprobs[:, PAD] = NEG_INF
    lprobs[:, BOS] = NEG_INF
    if step < min_len:
        lprobs[:, EOS] = NEG_INF
    at_limit = limits.le(step)
    if bool(at_limit.any()):
        forced = torch.full_like(lprobs, NEG_INF)
        forced[:, EOS] = eos
        lprobs = torch.where(at_limit[:, None], forced, lprobs)
    return lprobs


class Prefixes:
    """Target prefixes of a batch as pieces to force, step by step."""

    def __init__(self, prefixes: Sequence[Sequence[int]], device) -> None:
        width = max(1, max(len(p) for p in prefixes))
        self.ids = torch.full((len(prefixes), width), PAD, dtype=torch.long)
        for row, prefix in enumerate(prefixes):
            self.ids[row, :len(prefix)] = torch.as_tensor(list(prefix), dtype=torch.long)
        self.ids = self.ids.to(device)
        self.lengths = torch.tensor([len(p) for p in prefixes], dtype=torch.long, device=device)  # [B]

    def fit(self, limits: Tensor) -> None:
        """Cut prefixes longer than their sentence's length limit ([B], after ``output_limits``)."""
        self.lengths = torch.minimum(self.lengths, limits)

    def force(self, lprobs: Tensor, allowed: Tensor, step: int, row_sentence: Tensor) -> Tensor:
        """``allowed`` [rows, V] with every piece but the prefix's at ``step`` banned in rows
        whose sentence ([rows] in ``row_sentence``) is still in its prefix; the forced piece
        keeps its log-probability from ``lprobs`` (before any other ban)."""
        if step >= self.ids.size(1):
            return allowed
        forcing = self.lengths[row_sentence].gt(step)  # [rows]
        piece = self.ids[row_sentence, step][:, None]  # (rows, 1)
        forced = torch.full_like(allowed, NEG_INF).scatter(1, piece, lprobs.gather(1, piece))
        return torch.where(forcing[:, None], forced, allowed)


def prefixed_limits(model: Seq2Seq, src: Tensor, src_mask: Tensor, settings: SearchSettings,
                    prefixes: Optional[Sequence[Sequence[int]]]) -> tuple[Tensor, Optional[Prefixes]]:
    """[B] output length limits (``output_limits``, raised to fit each prefix) and the batch's
    ``Prefixes`` (None without prefixes)."""
    forced = Prefixes(prefixes, src.device) if prefixes is not None else None
    limits = output_limits(src, src_mask, settings.max_len_a, settings.max_len_b, model.max_positions,
                           None if forced is None else forced.lengths)
    if forced is not None:
        forced.fit(limits)
    return limits, forced


def step_logprobs(logits: Tensor, step: int, settings: SearchSettings, limits: Tensor, row_sentence: Tensor,
                  prefixes: Optional[Prefixes], lexical: Optional[LexicalConstraints]) -> Tensor:
    """The log-probabilities a search step ranks, [rows, V]: ``constrained_logprobs`` (by
    ``settings``' min_len and eos_at_limit), then the lexical constraints' bans, then the
    prefixes' forced pieces (which win)."""
    lprobs = constrained_logprobs(logits, step, settings.min_len, limits, settings.eos_at_limit == "free")
    allowed = lprobs if lexical is None else lexical.restrict(lprobs, step, limits, row_sentence)
    return allowed if prefixes is None else prefixes.force(lprobs, allowed, step, row_sentence)


class _Finished:
    """The ``keep`` best finished hypotheses of every sentence, as padded tensors.

    Merging new ones is a top-k over [kept + new] per sentence: no Python loop per
    sentence or hypothesis. With lexical constraints (``unmet_apart``), hypotheses that end
    without meeting them (forced by the length limit) are kept apart in ``unmet``: they are
    neither counted nor returned before the others.
    """

    def __init__(self, batch: int, keep: int, max_len: int, src_len: int, need_attn: bool, device,
                 unmet_apart: bool = False) -> None:
        self.scores = torch.full((batch, keep), NEG_INF, device=device)
        self.logprobs = torch.full((batch, keep), NEG_INF, device=device)
        self.lengths = torch.zeros(batch, keep, dtype=torch.long, device=device)
        self.tokens = torch.full((batch, keep, max_len), PAD, dtype=torch.long, device=device)
        self.attn = torch.zeros(batch, keep, max_len, src_len, device=device) if need_attn else None
        self.count = torch.zeros(batch, dtype=torch.long, device=device)  # all ever finished
        self.keep = keep
        self.unmet = _Finished(batch, keep, max_len, src_len, need_attn, device) if unmet_apart else None

    def add(self, sent: Tensor, is_new: Tensor, logprobs: Tensor, step: int, lenpen: float,
            prefixes: Tensor, attn: Optional[Tensor], complete: Optional[Tensor] = None) -> None:
        """Offer candidates ending at ``step``: is_new/logprobs [n, C]; prefixes [n, C, step]
        (pieces without BOS); attn [n, C, step, S]; ``sent`` [n] maps rows to sentences;
        ``complete`` [n, C] (with constraints): which met them all."""
        if complete is not None:
            self.unmet.add(sent, is_new & ~complete, logprobs, step, lenpen, prefixes, attn)
            is_new = is_new & complete
        n, cands = is_new.shape
        self.count[sent] += is_new.sum(1)
        new_scores = torch.where(is_new, logprobs / length_penalty(step, lenpen), NEG_INF)
        scores, pick = torch.cat([self.scores[sent], new_scores], 1).topk(self.keep, dim=1)  # (n, keep)
        self.scores[sent] = scores
        self.logprobs[sent] = torch.cat([self.logprobs[sent], logprobs], 1).gather(1, pick)
        lengths = torch.cat([self.lengths[sent], torch.full_like(logprobs, step, dtype=torch.long)], 1)
        self.lengths[sent] = lengths.gather(1, pick)
        width = self.tokens.size(2)
        new_tokens = torch.full((n, cands, width), PAD, dtype=torch.long, device=prefixes.device)
        new_tokens[:, :, :step] = prefixes
        tokens = torch.cat([self.tokens[sent], new_tokens], 1)
        self.tokens[sent] = tokens.gather(1, pick[:, :, None].expand(n, self.keep, width))
        if self.attn is not None:
            new_attn = attn.new_zeros(n, cands, width, attn.size(3))
            new_attn[:, :, :step] = attn
            every = torch.cat([self.attn[sent], new_attn], 1)
            self.attn[sent] = every.gather(1, pick[:, :, None, None].expand(n, self.keep, *every.shape[2:]))

    def worst_kept(self, sent: Tensor) -> Tensor:
        return self.scores[sent, self.keep - 1]

    def results(self, src_mask: Tensor, nbest: int) -> list[list[Hypothesis]]:
        """Per sentence, its best ``nbest`` finished hypotheses, best first (then, if there are
        fewer, the best of those that missed a constraint)."""
        first = self._kept(src_mask, nbest)
        second = self.unmet._kept(src_mask, nbest) if self.unmet is not None else [[] for _ in first]
        # an empty list only if every piece had probability 0
        return [(mine + other)[:nbest] or [Hypothesis([], NEG_INF, NEG_INF)] for mine, other in zip(first, second)]

    def _kept(self, src_mask: Tensor, nbest: int) -> list[list[Hypothesis]]:
        scores, logprobs, lengths = self.scores.tolist(), self.logprobs.tolist(), self.lengths.tolist()
        tokens = self.tokens.tolist()
        out = []
        for b in range(len(scores)):
            hyps = []
            for k in range(min(nbest, self.keep)):
                if scores[b][k] == NEG_INF:
                    break
                length = lengths[b][k]
                attn = None if self.attn is None else self.attn[b, k, :length][:, src_mask[b]].cpu()
                hyps.append(Hypothesis(tokens[b][k][:length], scores[b][k], logprobs[b][k], attn))
            out.append(hyps)
        return out


def beam_step(scores: Tensor, lprobs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Expand live hypotheses, scores [n, beam], by lprobs [n * beam, V]: the best 2 * beam
    extensions per sentence as (log-prob, source beam, piece), each [n, 2 * beam], best first.
    Twice the beam, so that ``beam`` remain live even if ``beam`` of them end in EOS."""
    n, beam = scores.shape
    vocab = lprobs.size(1)
    cand = (scores.view(n * beam, 1) + lprobs).view(n, beam * vocab)
    top_scores, top_index = cand.topk(min(2 * beam, beam * vocab), dim=1)
    return top_scores, top_index // vocab, top_index % vocab


@torch.inference_mode()
def beam_search(model: Seq2Seq, src: Tensor, src_mask: Tensor, settings: SearchSettings = DEFAULT,
                prefixes: Optional[Sequence[Sequence[int]]] = None,
                constraints: Optional[Sequence[Sequence[Sequence[int]]]] = None) -> list[list[Hypothesis]]:
    """Beam search for a batch src [B, S]; per sentence up to ``settings.nbest`` hypotheses,
    best first (``settings``: beam_size, nbest, lenpen, length limits, need_attn).

    All sentences and beams advance together as ``B * beam`` decoder rows. Each step takes
    the top ``2 * beam`` extensions per sentence (with ``constraints``: in the order of
    ``LexicalConstraints.expand``): those ending in EOS among the first ``beam`` are finished
    and set aside, and the best ``beam`` others stay live. A sentence is done, and leaves the
    batch, when
      (1) ``beam`` hypotheses have finished (the beam is spent; this makes beam 1 greedy), or
      (2) ``nbest`` have finished and no live one can still beat the worst of them: a live
          hypothesis with log-probability s < 0 and length l ends with a log-probability
          <= s at a length in [l, limit], so its score is at most s / max(lp(l), lp(limit))
          (lp is monotonic in the length), or
      (3) it reached its length limit (every live hypothesis was forced to EOS).
    Hypotheses forced to end by the limit before meeting their constraints are kept apart and
    returned only after every hypothesis that met them.
    """
    beam, nbest, lenpen, need_attn = settings.beam_size, settings.nbest, settings.lenpen, settings.need_attn
    if nbest > beam:
        raise ValueError(f"nbest {nbest} > beam size {beam}")
    batch, src_len = src.shape
    device = src.device
    limits, forced = prefixed_limits(model, src, src_mask, settings, prefixes)
    lexical = LexicalConstraints(constraints, beam, device) if constraints is not None else None
    enc = model.encode(src, src_mask)
    state = model.init_state(enc, beam)
    finished = _Finished(batch, nbest, int(limits.max()) + 1, src_len, need_attn, device, lexical is not None)
    sent = torch.arange(batch, device=device)  # original index of each sentence still decoding
    scores = torch.full((batch, beam), NEG_INF, device=device)
    scores[:, 0] = 0.0  # one live hypothesis at the start, so the beam does not fill with copies
    tokens = torch.full((batch * beam, 1), BOS, dtype=torch.long, device=device)  # BOS y1 .. yt
    attn_history = torch.zeros(batch * beam, 0, src_len, device=device) if need_attn else None
    for step in range(int(limits.max()) + 1):
        n = sent.numel()
        logits, state = model.decode_step(tokens[:, -1], enc, state, need_attn)
        row_sentence = sent.repeat_interleave(beam)
        lprobs = step_logprobs(logits, step, settings, limits[row_sentence], row_sentence, forced, lexical)
        top_scores, origin, token = beam_step(scores, lprobs)
        complete = None  # with constraints: which candidates have met them all
        if lexical is not None:
            top_scores, origin, token, complete = lexical.expand(scores, lprobs, top_scores, origin, token, sent)
        is_eos = token.eq(EOS) & top_scores.isfinite()
        origin_rows = origin + torch.arange(n, device=device)[:, None] * beam  # (n, 2*beam)
        ends = is_eos[:, :beam]
        if bool(ends.any()):
            rows = origin_rows[:, :beam]
            attn = None if attn_history is None else attn_history[rows]
            finished.add(sent, ends, top_scores[:, :beam], step, lenpen, tokens[rows][:, :, 1:], attn,
                         None if complete is None else complete[:, :beam])
        # the best `beam` candidates that do not end (stable sort keeps their order)
        live = torch.sort(is_eos.to(torch.uint8), dim=1, stable=True).indices[:, :beam]
        scores = top_scores.gather(1, live)
        rows, next_tokens = origin_rows.gather(1, live), token.gather(1, live)
        done = _sentences_done(finished, sent, scores, limits, step, settings)
        if bool(done.all()):
            break
        keep = (~done).nonzero().squeeze(1) if bool(done.any()) else None
        if lexical is not None:
            lexical.keep(live, keep)
        if keep is not None:  # drop finished sentences: the batch shrinks
            enc = enc.select(keep)
            sent, scores, rows, next_tokens = sent[keep], scores[keep], rows[keep], next_tokens[keep]
        rows = rows.reshape(-1)
        if attn_history is not None:
            attn_history = torch.cat([attn_history[rows], state.attn[rows].float()[:, None]], 1)
        state = state.select(rows)
        tokens = torch.cat([tokens[rows], next_tokens.reshape(-1, 1)], 1)
    return finished.results(src_mask, nbest)


def _sentences_done(finished: _Finished, sent: Tensor, scores: Tensor, limits: Tensor, step: int,
                    settings: SearchSettings) -> Tensor:
    """Which sentences of the batch stop after ``step``: rules (1)-(3) of ``beam_search``."""
    beam, nbest, lenpen = settings.beam_size, settings.nbest, settings.lenpen
    best = scores.max(1).values  # scores[:, 0] but with constraints, whose order is not by score
    done = finished.count[sent].ge(beam) | limits[sent].le(step) | ~best.isfinite()
    bound = best / length_penalty(limits[sent], lenpen).clamp(min=length_penalty(step + 1, lenpen))
    return done | (finished.count[sent].ge(nbest) & finished.worst_kept(sent).ge(bound))


@torch.inference_mode()
def sequential_search(model: Seq2Seq, src: Tensor, src_mask: Tensor, choose: Callable[[Tensor], Tensor],
                      rows_per_sentence: int, settings: SearchSettings,
                      prefixes: Optional[Sequence[Sequence[int]]] = None,
                      compact_share: float = 0.0) -> list[list[Hypothesis]]:
    """Extend each of ``rows_per_sentence`` rows per sentence by ``choose(lprobs [rows, V]) -> [rows]``
    until EOS; no reordering. Finished sentences leave the batch once they are over ``compact_share``
    of it (``COMPACT_SHARE``); until then their rows are fed EOS and change nothing. Sampling keeps 0,
    since ``choose`` draws for every row. Greedy and sampling are this loop with different choices
    (``settings``: lenpen, length limits, need_attn; its beam and sampling fields are not read)."""
    batch, src_len = src.shape
    per, device, need_attn = rows_per_sentence, src.device, settings.need_attn
    limits, forced = prefixed_limits(model, src, src_mask, settings, prefixes)
    max_len, row_limits = int(limits.max()), limits.repeat_interleave(per)
    enc = model.encode(src, src_mask)
    state = model.init_state(enc, per)
    total = batch * per
    out_tokens = torch.full((total, max_len + 1), PAD, dtype=torch.long, device=device)
    out_attn = torch.zeros(total, max_len + 1, src_len, device=device) if need_attn else None
    lengths = torch.zeros(total, dtype=torch.long, device=device)
    logprobs = torch.zeros(total, device=device)
    row_ids = torch.arange(total, device=device)  # original row of each row still decoding
    ended = torch.zeros(total, dtype=torch.bool, device=device)
    prev = torch.full((total,), BOS, dtype=torch.long, device=device)
    for step in range(max_len + 1):
        logits, state = model.decode_step(prev, enc, state, need_attn)
        lprobs = step_logprobs(logits, step, settings, row_limits[row_ids], row_ids // per, forced, None)
        token = torch.where(ended, EOS, choose(lprobs))
        logprobs[row_ids] += torch.where(ended, 0.0, lprobs.gather(1, token[:, None]).squeeze(1))
        growing = ~ended & token.ne(EOS)
        out_tokens[row_ids, step] = torch.where(growing, token, PAD)
        lengths[row_ids] += growing.long()
        if out_attn is not None:
            out_attn[row_ids, step] = state.attn.float()
        ended |= token.eq(EOS)
        done = ended.view(-1, per).all(1)  # sentences whose rows have all ended
        finished_now = int(done.sum())
        if finished_now == done.numel():
            break
        prev = token
        if finished_now > compact_share * done.numel():
            keep = (~done).nonzero().squeeze(1)
            rows = (keep[:, None] * per + torch.arange(per, device=device)).reshape(-1)
            enc, state = enc.select(keep), state.select(rows)
            row_ids, ended, prev = row_ids[rows], ended[rows], prev[rows]
    scores = logprobs / length_penalty(lengths, settings.lenpen)
    results = []
    for b in range(batch):
        hyps = []
        for r in range(b * per, (b + 1) * per):
            length = int(lengths[r])
            attn = None if out_attn is None else out_attn[r, :length][:, src_mask[b]].cpu()
            hyps.append(Hypothesis(out_tokens[r, :length].tolist(), float(scores[r]), float(logprobs[r]), attn))
        results.append(sorted(hyps, key=lambda h: -h.score))
    return results


def greedy_search(model: Seq2Seq, src: Tensor, src_mask: Tensor, settings: SearchSettings = DEFAULT,
                  prefixes: Optional[Sequence[Sequence[int]]] = None) -> list[list[Hypothesis]]:
    """The most likely piece at every step (identical tokens to beam_search with beam 1);
    ``settings.beam_size`` and ``nbest`` are not read."""
    return sequential_search(model, src, src_mask, lambda lprobs: lprobs.argmax(1), 1, settings, prefixes,
                             COMPACT_SHARE)


def sampling_choice(generator: torch.Generator, topk: int = DEFAULT.topk, topp: float = DEFAULT.topp,
                    temperature: float = DEFAULT.temperature) -> Callable[[Tensor], Tensor]:
    """A ``choose`` that samples from the model distribution sharpened by ``temperature``,
    restricted to the ``topk`` most likely pieces (0: all) and to the smallest set whose
    probability reaches ``topp`` (nucleus sampling, Holtzman et al. 2020)."""
    def choose(lprobs: Tensor) -> Tensor:
        logits = lprobs / temperature
        if topk > 0:
            kth = logits.topk(min(topk, logits.size(1)), dim=1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, NEG_INF)
        if topp < 1.0:
            sorted_logits, order = logits.sort(dim=1, descending=True)
            probs = sorted_logits.softmax(1)
            before = probs.cumsum(1) - probs  # mass of the strictly more likely pieces
            drop = before >= topp
            drop[:, 0] = False  # the most likely piece is always kept: a topp below float32's range compares as 0
            logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, NEG_INF))
        return torch.multinomial(logits.softmax(1), 1, generator=generator).squeeze(1)

    return choose


def sample(model: Seq2Seq, src: Tensor, src_mask: Tensor, settings: SearchSettings = DEFAULT,
           generator: Optional[torch.Generator] = None,
           prefixes: Optional[Sequence[Sequence[int]]] = None) -> list[list[Hypothesis]]:
    """``settings.nbest`` independent samples per sentence (best score first), reproducible
    under ``settings.seed`` (or a caller's ``generator``, on src's device, for a stream over
    many batches); ``beam_size`` is not read. Scores use the untempered model probabilities."""
    s = settings
    if s.temperature <= 0 or not 0 < s.topp <= 1 or s.topk < 0:
        raise ValueError(f"bad sampling settings: temperature {s.temperature}, topp {s.topp}, topk {s.topk}")
    if generator is None:
        generator = torch.Generator(device=src.device)
        generator.manual_seed(s.seed)
    choose = sampling_choice(generator, s.topk, s.topp, s.temperature)
    return sequential_search(model, src, src_mask, choose, s.nbest, s, prefixes)
