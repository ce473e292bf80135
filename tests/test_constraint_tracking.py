"""The constraint tracker (``decoding/constraints.py``) against a brute-force reading of the
output: a phrase counts as met exactly when the output holds it, however it overlaps itself,
and the progress under way is the longest prefix of the phrase that ends the output."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from nmtkit.decoding.constraints import PhraseTable, failure_links


def contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[i:i + len(phrase)] == phrase for i in range(len(tokens) - len(phrase) + 1))


def reference(phrases: list[list[int]], output: list[int]) -> tuple[list[bool], int]:
    """(met, pending) a tracker should hold after ``output``, for phrases over disjoint pieces
    (so at most one can be under way): a phrase the output holds is met; otherwise its longest
    prefix that ends the output is, and the next piece of it is pending (-1 for none)."""
    met, pending, start = [], -1, 0
    for phrase in phrases:
        if contains(output, phrase):
            met += [True] * len(phrase)
        else:
            done = max(k for k in range(len(phrase)) if k == 0 or output[-k:] == phrase[:k])
            met += [True] * done + [False] * (len(phrase) - done)
            pending = start + done if done else pending
        start += len(phrase)
    return met, pending


def track(phrases_per_row: list[list[list[int]]], outputs: list[list[int]]) -> list[list[tuple[list[bool], int]]]:
    """The tracker's (met, pending) after every piece of each row's output, all rows advanced
    together as one batch (a finished row keeps taking a piece no phrase holds)."""
    table = PhraseTable.build(phrases_per_row, "cpu")
    rows, width = len(outputs), table.pieces.size(1)
    met, pending = torch.zeros(rows, width, dtype=torch.bool), torch.full((rows,), -1)
    states: list[list] = [[] for _ in outputs]
    for step in range(max(map(len, outputs), default=0)):
        piece = torch.tensor([out[step] if step < len(out) else 99 for out in outputs])
        met, pending = table.advance(met, pending, piece)
        for row, out in enumerate(outputs):
            if step < len(out):
                width_used = sum(map(len, phrases_per_row[row]))
                states[row].append((met[row, :width_used].tolist(), int(pending[row])))
    return states


def assert_tracks(phrases_per_row: list[list[list[int]]], outputs: list[list[int]]) -> None:
    for phrases, out, states in zip(phrases_per_row, outputs, track(phrases_per_row, outputs)):
        assert states == [reference(phrases, out[:t + 1]) for t in range(len(out))], (phrases, out)


A, B, C, D, E = 4, 5, 6, 7, 8


def test_self_overlapping_phrases_are_met_where_the_output_holds_them():
    assert failure_links([A, A, B]) == [0, 0, 1] and failure_links([A, B, A, C]) == [0, 0, 0, 1]
    assert failure_links([A, B, A, B, A, C]) == [0, 0, 0, 1, 2, 3]
    cases = [([[A, A, B]], [A, A, A, B]), ([[A, B, A, C]], [A, B, A, B, A, C]),
             ([[A, B, A, B, A, C]], [A, B, A, B, A, B, A, C]), ([[A, A, A]], [A, A, B, A, A, A]),
             ([[A, B, A, C], [D, E]], [A, B, D, A, B, A, B, A, C, D, D, E]),  # abandoned for another phrase
             ([[A, B]], [A, A, B]), ([[A, B]], [B, A, C, A]), ([[A]], [])]
    phrases, outputs = zip(*cases)
    assert_tracks(list(phrases), list(outputs))
    met, pending = track([[[A, A, B]]], [[A, A, A]])[0][-1]
    assert (met, pending) == ([True, True, False], 2)  # still two pieces in, waiting for B


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from([A, B, C]), min_size=1, max_size=5),
                          st.lists(st.sampled_from([D, E]), max_size=3),
                          st.lists(st.sampled_from([A, B, C, D, E]), max_size=14)), min_size=1, max_size=4),
       st.booleans())
def test_random_outputs_over_few_pieces_agree_with_brute_force(rows, two_letters):
    """Phrases over a 2- or 3-piece alphabet, perhaps with a second phrase over two other
    pieces, and outputs over all of them: every step's state is the brute-force one."""
    if two_letters:
        rows = [([A if piece == C else piece for piece in phrase], other, [A if piece == C else piece for piece in out])
                for phrase, other, out in rows]
    phrases = [[phrase, other] if other else [phrase] for phrase, other, _ in rows]
    assert_tracks(phrases, [out for _, _, out in rows])
