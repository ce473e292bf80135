"""Training-data filters: normalisation and exact counts per rule."""
import sys
import unicodedata

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from nmtkit.data.clean import _ODD_SPACES, RULES, TextFilter, length_filter, normalize, normalize_batch


def test_normalize_nfc_and_whitespace():
    assert normalize("  cafe\u0301 \t au\u00a0lait\u2028ok \n") == "caf\u00e9 au lait ok"
    assert normalize(" \t\n ") == ""


@given(st.text())
def test_normalize_is_idempotent_nfc_and_single_spaced(text):
    once = normalize(text)
    assert normalize(once) == once
    assert unicodedata.is_normalized("NFC", once)
    assert "  " not in once and once == once.strip()


_MARKS = ["a", "e", " ", "\u0301", "\u0327", "\u1100", "\u1161", "\u11a8", "\u212b", "\u0f73", "\ufeff"]
_CLEAN = st.lists(st.text(st.sampled_from(_MARKS), max_size=8), max_size=600)  # the fast path, mostly
_NASTY = st.lists(st.text(st.sampled_from([*_ODD_SPACES[:-1], "\x00", *_MARKS]), max_size=8), max_size=600)


@given(st.one_of(_CLEAN, _NASTY, st.lists(st.text(), max_size=20)))
def test_normalize_batch_is_normalize_of_each(texts):
    # blocks of 256: clean blocks take the fast path, others (and NULs) go one by one
    assert normalize_batch(texts) == [normalize(text) for text in texts]


def test_odd_spaces_are_every_split_character_but_the_space():
    every = {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}
    assert set(_ODD_SPACES[:-1]) == every - {" "} and _ODD_SPACES[-1] == "  "


def test_text_filter_counts_each_rule_once():
    heldout = [("held out", "retenido")]
    pairs = [
        ("a cat", "un gato"),
        ("", "vacío"),  # empty source
        ("solo", "   "),  # whitespace-only target
        ("a  cat", "un gato\t"),  # duplicate of pair 1 after whitespace normalisation
        ("cafe\u0301", "cafe\u0301"),
        ("caf\u00e9", "caf\u00e9"),  # duplicate of the NFD pair after NFC
        ("held  out", "retenido"),  # also in dev/test
        ("held out", "retenido"),  # and again: now a plain duplicate
        ("a dog", "un perro"),
    ]
    text_filter = TextFilter(dedup=True, heldout=heldout)
    kept = list(text_filter(pairs))
    assert kept == [("a cat", "un gato"), ("caf\u00e9", "caf\u00e9"), ("a dog", "un perro")]
    assert text_filter.counts == {"read": 9, "empty": 2, "duplicate": 3, "heldout": 1}


def test_text_filter_without_dedup_keeps_repeats():
    text_filter = TextFilter(dedup=False, heldout=[("x", "y")])
    kept = list(text_filter([("x", "y"), ("x", "y"), ("", "y")]))
    assert kept == [("x", "y"), ("x", "y")]
    assert text_filter.counts == {"read": 3, "empty": 1, "duplicate": 0, "heldout": 0}


def test_length_filter_exact_counts():
    src = np.array([5, 300, 2, 10, 300, 7, 0])
    tgt = np.array([6, 5, 9, 30, 300, 7, 3])
    keep, counts = length_filter(src, tgt, max_len=250, max_ratio=3.0)
    # too long: pairs 1 and 4 (pair 1 would also fail the ratio: counted once, as too long)
    # ratio: 2 vs 9 (4.5), 10 vs 30 is exactly 3 (kept), 0 vs 3
    assert counts == {"too_long": 2, "ratio": 2}
    assert keep.tolist() == [True, False, False, True, False, True, False]


def test_length_filter_rules_can_be_disabled():
    src, tgt = np.array([1, 500]), np.array([10, 500])
    keep, counts = length_filter(src, tgt, max_len=0, max_ratio=0)
    assert keep.all() and counts == {"too_long": 0, "ratio": 0}


def test_rules_are_listed_in_report_order():
    assert RULES == ("empty", "duplicate", "heldout", "too_long", "ratio")
