"""Lexically constrained beam search: target phrases that must appear in a sentence's output.

A sentence's constraints are phrases of target pieces. Every hypothesis tracks which of
those pieces it has met (``met``) and, while inside a phrase, the piece that must come next
(``pending``). Another piece keeps what it can of the phrase, as a string matcher does
(Knuth-Morris-Pratt): the progress falls back to the longest prefix of the phrase that ends
the output, that piece included (``a a b`` after ``a a`` and another ``a``: still ``a a``);
the pieces beyond it count as unmet again. With no such prefix the phrase is abandoned and
that piece may start another phrase. So a phrase met in the output text is counted, however
it overlaps itself. One phrase is under way at a time: a piece that continues it does not
also start another phrase. Each phrase position holds its fallback (``border``, the KMP
failure link), so a step follows at most ``depth`` links for the whole batch at once.

EOS is banned until every piece is met, and where another piece would leave more unmet pieces
(those of an abandoned phrase included) than steps before the length limit, only pieces that
leave few enough are allowed: one that advances a constraint, falls back far enough, or
abandons the phrase for another. So when the limit leaves room for all the phrases at the
start, every hypothesis can still meet them all at every step, and every output does
(``beam_search`` returns hypotheses that missed one, when the limit was too short, only after
any that met them all).

Dynamic beam allocation (Post & Vilar 2018): a step's candidates are the usual best
2 * beam extensions, plus every hypothesis's best piece and every piece that advances one of
its constraints. Candidates fall into banks by how many constraint pieces they have met, and
the beam is shared among the banks round-robin: the best candidate of the most advanced
bank, then the best of the next bank down, ..., then the second best of each bank, and so
on; a bank short of candidates leaves its turns to the others. The order is one sort of
the whole batch on (rank within the bank, bank) rather than a loop over banks and
sentences, the vectorised form of Hu et al. 2019.

Phrases sharing a first piece are tried in the order given (the first unmet one is started);
a sentence without constraints gets exactly plain beam search's candidates in the same
order, so it decodes as it would in a batch without constraints.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
from torch import Tensor

from nmtkit.specials import EOS, PAD

NEG_INF = float("-inf")


@dataclasses.dataclass
class PhraseTable:
    """The phrases of each row (a sentence, a hypothesis or a candidate) as one flat,
    padded row of pieces: [N, T], T the most pieces any sentence of the batch has."""

    pieces: Tensor  # [N, T] long, PAD after the last phrase
    real: Tensor  # [N, T] bool: a piece of some phrase
    first: Tensor  # [N, T] long: flat index of the first piece of the piece's phrase
    last: Tensor  # [N, T] long: flat index of the last piece of the piece's phrase
    border: Tensor  # [N, T] long: the position to try when this one's piece does not come (KMP failure link)
    depth: int = 1  # the most positions a chain of ``border`` links visits, over the batch

    @classmethod
    def build(cls, constraints: Sequence[Sequence[Sequence[int]]], device) -> "PhraseTable":
        """One row per sentence from its phrases (lists of piece ids; empty ones are skipped)."""
        width = max(1, max(sum(len(phrase) for phrase in phrases) for phrases in constraints))
        pieces = torch.full((len(constraints), width), PAD, dtype=torch.long)
        first, last, border = (torch.zeros(len(constraints), width, dtype=torch.long) for _ in range(3))
        depth = 1
        for row, phrases in enumerate(constraints):
            start = 0
            for phrase in (list(p) for p in phrases if len(p)):
                end = start + len(phrase)
                pieces[row, start:end] = torch.as_tensor(phrase, dtype=torch.long)
                first[row, start:end], last[row, start:end] = start, end - 1
                links = failure_links(phrase)
                border[row, start:end] = start + torch.as_tensor(links, dtype=torch.long)
                chain = [1] * len(phrase)  # positions visited from each one down to the first piece
                for k in range(1, len(phrase)):
                    chain[k] = 1 + chain[links[k]]
                depth = max(depth, max(chain))
                start = end
        pieces = pieces.to(device)
        return cls(pieces, pieces.ne(PAD), first.to(device), last.to(device), border.to(device), depth)

    def rows(self, index: Tensor) -> "PhraseTable":
        return PhraseTable(*(getattr(self, name).index_select(0, index) for name in TABLE_FIELDS), depth=self.depth)

    def advancing(self, met: Tensor, pending: Tensor) -> Tensor:
        """[N, T] True on the pieces that advance a constraint: the pending piece inside a
        phrase, else the first piece of every unmet phrase."""
        position = torch.arange(met.size(1), device=met.device)
        starts = position.eq(self.first) & ~met
        return self.real & torch.where(pending.ge(0)[:, None], position.eq(pending[:, None]), starts)

    def fallbacks(self, pending: Tensor) -> Tensor:
        """[N, T] True, inside a phrase, on the positions its progress may go on from: the
        pending one, then each prefix of the phrase that ends what is met of it (following
        ``border`` down to the first piece). Taking the piece at one of them keeps the
        pieces before it met."""
        position = torch.arange(self.pieces.size(1), device=pending.device)
        state = pending.clamp(min=0)[:, None]  # (N, 1)
        chain = torch.zeros_like(self.real)
        for _ in range(self.depth):
            chain = chain | position.eq(state)
            state = self.border.gather(1, state)
        return chain & pending.ge(0)[:, None]

    def advance(self, met: Tensor, pending: Tensor, piece: Tensor) -> tuple[Tensor, Tensor]:
        """(met [N, T], pending [N]) after each row takes ``piece`` [N]: inside a phrase, the
        furthest fallback position holding ``piece`` is met and those after it unmet again;
        with none, the phrase is abandoned and ``piece`` may start another."""
        position = torch.arange(met.size(1), device=met.device)
        inside = pending.ge(0)
        hits = self.fallbacks(pending) & self.pieces.eq(piece[:, None])
        kept = torch.where(hits, position, -1).max(1).values  # -1: nothing of the phrase kept
        phrase_start = self.first.gather(1, pending.clamp(min=0)[:, None])  # (N, 1)
        lost = inside[:, None] & position.ge(phrase_start) & position.lt(pending[:, None]) & position.gt(kept[:, None])
        met = (met & ~lost) | position.eq(kept[:, None])
        starts = kept.lt(0)[:, None] & self.real & position.eq(self.first) & ~met & self.pieces.eq(piece[:, None])
        started = starts.any(1)
        start = starts.long().argmax(1)  # the first phrase this piece starts
        met = met | (started[:, None] & position.eq(start[:, None]))
        reached = torch.where(kept.ge(0), kept, torch.where(started, start, -1))  # the piece just met
        end = self.last.gather(1, reached.clamp(min=0)[:, None]).squeeze(1)
        return met, torch.where(reached.ge(0) & reached.lt(end), reached + 1, -1)

    def unmet(self, met: Tensor) -> Tensor:
        """[N] constraint pieces not met yet."""
        return (self.real & ~met).sum(-1)

    def at_stake(self, pending: Tensor) -> Tensor:
        """[N] pieces met of the phrase under way, which the worst other piece unmeets."""
        first = self.first.gather(1, pending.clamp(min=0)[:, None]).squeeze(1)
        return torch.where(pending.ge(0), pending - first, 0)

    def affordable(self, met: Tensor, pending: Tensor, spare: Tensor) -> Tensor:
        """[N, T] True, inside a phrase, on the pieces that unmeet at most ``spare`` [N] of it
        and go on: a fallback position at most ``spare`` before the pending one, or, with
        ``spare`` covering all it has met, the first piece of an unmet phrase (which a piece
        that drops the phrase under way starts)."""
        position = torch.arange(met.size(1), device=met.device)
        near = self.fallbacks(pending) & position.ge((pending - spare)[:, None])
        restart = self.real & position.eq(self.first) & ~met & spare.ge(self.at_stake(pending))[:, None]
        return near | (restart & pending.ge(0)[:, None])


TABLE_FIELDS = ("pieces", "real", "first", "last", "border")


def failure_links(phrase: Sequence[int]) -> list[int]:
    """For each k < len(phrase): the length of the longest proper prefix of ``phrase[:k]``
    that also ends it (0 for k < 2), where a KMP matcher with k pieces matched falls back to."""
    links, border = [0] * len(phrase), 0
    for k in range(2, len(phrase)):
        while border and phrase[border] != phrase[k - 1]:
            border = links[border]
        if phrase[border] == phrase[k - 1]:
            border += 1
        links[k] = border
    return links


def duplicates(keys: Tensor) -> Tensor:
    """[n, M] True where a key repeats one earlier in its row."""
    order = keys.sort(dim=1, stable=True).indices
    ordered = keys.gather(1, order)
    repeat = torch.zeros_like(keys, dtype=torch.bool)
    repeat[:, 1:] = ordered[:, 1:].eq(ordered[:, :-1])
    return torch.zeros_like(repeat).scatter(1, order, repeat)


def bank_order(scores: Tensor, banks: Tensor, top_bank: int) -> Tensor:
    """[n, M] candidate indices in allocation order: round-robin over the banks (0 ..
    ``top_bank`` pieces met, most advanced first), best score first within a bank;
    candidates of score -inf last."""
    by_score = scores.sort(dim=1, descending=True, stable=True).indices
    by_bank = banks.gather(1, by_score).sort(dim=1, descending=True, stable=True).indices
    order = by_score.gather(1, by_bank)  # most advanced bank first, best first within a bank
    banks, finite = banks.gather(1, order), scores.gather(1, order).isfinite()
    position = torch.arange(order.size(1), device=order.device).expand_as(order)
    bank_starts = torch.ones_like(finite)
    bank_starts[:, 1:] = banks[:, 1:].ne(banks[:, :-1])
    rank = position - torch.where(bank_starts, position, 0).cummax(1).values  # place within its bank
    key = torch.where(finite, rank * (top_bank + 1) + (top_bank - banks), order.size(1) * (top_bank + 1))
    return order.gather(1, key.sort(dim=1, stable=True).indices)


class LexicalConstraints:
    """The constraints of a batch and every live hypothesis's progress through them, for
    ``search.beam_search``: ``restrict`` the step's log-probabilities, ``expand`` to the
    ordered candidates, ``keep`` the ones that stay live."""

    def __init__(self, constraints: Sequence[Sequence[Sequence[int]]], beam: int, device) -> None:
        self.table, self.beam = PhraseTable.build(constraints, device), beam
        rows, width = len(constraints) * beam, self.table.pieces.size(1)
        self.met = torch.zeros(rows, width, dtype=torch.bool, device=device)  # [rows, T]
        self.pending = torch.full((rows,), -1, dtype=torch.long, device=device)  # [rows]
        self._candidates: Optional[tuple[Tensor, Tensor]] = None

    def restrict(self, lprobs: Tensor, step: int, limits: Tensor, row_sentence: Tensor) -> Tensor:
        """lprobs [rows, V] with EOS banned until all is met (in place: no copy of the
        distribution per step), and pieces that would leave more unmet pieces than steps before
        the length limit ([rows] ``limits``) banned."""
        table = self.table.rows(row_sentence)
        unmet, left = table.unmet(self.met), limits - step
        waiting = unmet.gt(0) & left.gt(0)
        lprobs[:, EOS] = torch.where(waiting, NEG_INF, lprobs[:, EOS])
        # after this step, left - 1 steps remain for the unmet pieces: an advancing piece leaves
        # unmet - 1, one that falls back within the phrase under way unmet + (the pieces it
        # unmeets) - 1, one that abandons it for another phrase unmet + stake - 1, any other
        # unmet + stake; whatever would not fit is banned
        stake = table.at_stake(self.pending)
        hurry = waiting & (unmet + stake).ge(left)
        if not bool(hurry.any()):
            return lprobs
        useful = table.advancing(self.met, self.pending) | table.affordable(self.met, self.pending, left - unmet)
        useful = torch.zeros_like(lprobs).scatter_add(1, table.pieces, useful.float()).gt(0)  # (rows, V)
        return lprobs.masked_fill(hurry[:, None] & ~useful, NEG_INF)

    def expand(self, scores: Tensor, lprobs: Tensor, top_scores: Tensor, origin: Tensor, piece: Tensor,
               sent: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The step's candidates in allocation order, as many as plain beam search's
        (``top_scores``, ``origin``, ``piece`` [n, 2 * beam] from ``beam_step``), plus whether
        each has met all its constraints. ``scores`` [n, beam], ``lprobs`` [n * beam, V]
        (restricted), ``sent`` [n] the batch sentence of each row of ``scores``."""
        n, beam = scores.shape
        table = self.table.rows(sent.repeat_interleave(beam))
        width, device = table.pieces.size(1), scores.device
        constrained = table.real.view(n, beam * width).any(1, keepdim=True)  # (n, 1)
        best_lprob, best_piece = lprobs.max(1)
        advance_lprobs = lprobs.gather(1, table.pieces).masked_fill(~table.advancing(self.met, self.pending), NEG_INF)
        extra = torch.cat([(scores.reshape(-1) + best_lprob).view(n, beam),
                           (scores.reshape(-1, 1) + advance_lprobs).view(n, beam * width)], 1)
        beams = torch.arange(beam, device=device)
        cand_scores = torch.cat([top_scores, extra.masked_fill(~constrained, NEG_INF)], 1)  # (n, M)
        cand_origin = torch.cat([origin, beams.expand(n, beam), beams.repeat_interleave(width).expand(n, -1)], 1)
        cand_piece = torch.cat([piece, best_piece.view(n, beam), table.pieces.view(n, beam * width)], 1)
        cand_scores = cand_scores.masked_fill(duplicates(cand_origin * lprobs.size(1) + cand_piece), NEG_INF)
        rows = (cand_origin + torch.arange(n, device=device)[:, None] * beam).reshape(-1)
        met, pending = table.rows(rows).advance(self.met[rows], self.pending[rows], cand_piece.reshape(-1))
        met, pending = met.view(n, -1, width), pending.view(n, -1)
        order = bank_order(cand_scores, met.sum(2), width)[:, :top_scores.size(1)]
        met, pending = met.gather(1, order[:, :, None].expand(-1, -1, width)), pending.gather(1, order)
        self._candidates = met, pending
        complete = (table.real.view(n, beam, width)[:, :1] & ~met).sum(2).eq(0)
        return cand_scores.gather(1, order), cand_origin.gather(1, order), cand_piece.gather(1, order), complete

    def keep(self, live: Tensor, sentences: Optional[Tensor]) -> None:
        """Progress of the candidates ``live`` [n, beam] (indices into ``expand``'s order), of
        the ``sentences`` that go on (all when None)."""
        met, pending = self._candidates
        met, pending = met.gather(1, live[:, :, None].expand(-1, -1, met.size(2))), pending.gather(1, live)
        if sentences is not None:
            met, pending = met[sentences], pending[sentences]
        self.met, self.pending = met.reshape(-1, met.size(2)), pending.reshape(-1)
