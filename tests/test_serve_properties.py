"""Properties of the serve request schema over generated bodies: any body is a request or a
4xx with a one-line error (never a 5xx or an exception), and no search the server runs is
estimated over its memory bound."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import train_tiny
from nmtkit.decoding.cost import estimate_search_bytes
from nmtkit.decoding.options import TranslateOptions
from nmtkit.serving.requests import DECODE_CHOICES, DECODE_RANGES, Limits, RequestError, parse_request

SYMBOLS = "abcdefghij"
LIMITS = Limits(max_body_bytes=1 << 16, max_lines=4, max_line_chars=80, max_beam=8, max_search_bytes=2 << 20)
HYPOTHESIS = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)


def obj(pairs: dict[str, str]) -> str:
    """A JSON object from keys and JSON texts of their values (which json.dumps could not
    all write: integers past the int-to-string limit, NaN)."""
    return "{" + ",".join(f"{json.dumps(key)}:{value}" for key, value in pairs.items()) + "}"


SCALARS = st.one_of(
    st.sampled_from(["null", "true", "false", "NaN", "Infinity", "-Infinity", "1e999", "-0", "0.5", "[]", "{}"]),
    st.integers(-2 ** 80, 2 ** 80).map(str),
    st.integers(4000, 5200).map(lambda digits: "9" * digits),  # around Python's 4,300-digit limit
    st.text(max_size=24).map(json.dumps),  # lone surrogates and line breaks too, escaped
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4).map(lambda items: "[" + ",".join(items) + "]"),
    st.dictionaries(st.text(max_size=6), inner, max_size=3).map(obj)), max_leaves=10)
WORDS = st.lists(st.sampled_from(SYMBOLS), min_size=1, max_size=40).map(" ".join)


def setting_values(name: str):
    """Values of decode setting ``name``: in range, at and past its bounds, of another type."""
    if name in DECODE_CHOICES:
        return st.one_of(st.sampled_from(DECODE_CHOICES[name]).map(json.dumps), VALUES)
    kind, low, high = DECODE_RANGES[name]
    if kind is bool:
        return st.one_of(st.booleans().map(json.dumps), VALUES)
    near = st.integers(int(low) - 2, min(int(high), 20) + 2)
    return st.one_of(near.map(str), st.floats(low - 1, high + 1).map(repr), VALUES)


@st.composite
def bodies(draw) -> bytes:
    """A body mostly shaped like a request (texts, per-text prefixes and constraints of the
    same count, settings), with any field possibly of any JSON value, or arbitrary bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=64))
    count = draw(st.integers(0, 5))
    fields = {"texts": draw(st.one_of(st.lists(WORDS | st.text(max_size=90), min_size=count, max_size=count)
                                      .map(json.dumps), VALUES))}
    if draw(st.booleans()):
        phrases = st.lists(WORDS, max_size=8)
        fields["constraints"] = draw(st.one_of(st.lists(phrases, min_size=count, max_size=count).map(json.dumps),
                                               VALUES))
    if draw(st.booleans()):
        fields["prefixes"] = draw(st.one_of(st.lists(WORDS | st.just(""), min_size=count, max_size=count)
                                            .map(json.dumps), VALUES))
    for name in draw(st.lists(st.sampled_from([*DECODE_RANGES, *DECODE_CHOICES, "target_lang", "x"]), max_size=4)):
        fields[name] = draw(setting_values(name)) if name in DECODE_RANGES or name in DECODE_CHOICES else draw(VALUES)
    return obj(fields).encode()


@settings(max_examples=400, **HYPOTHESIS)
@given(bodies())
def test_any_body_is_a_request_or_a_4xx_refusal_in_one_line(body):
    try:
        request = parse_request(body, LIMITS)
    except RequestError as err:
        assert 400 <= err.status < 500 and "\n" not in str(err) and len(str(err)) < 400
        return
    assert len(request.texts) <= LIMITS.max_lines
    assert all(len(text) <= LIMITS.max_line_chars for text in request.texts)


@pytest.fixture(scope="module")
def served(tmp_path_factory, reversal_spm):
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from nmtkit.serving.app import create_app, serving_card
    from nmtkit.serving.batcher import Batcher
    from nmtkit.translate_files import open_engine

    model_dir = str(train_tiny(reversal_spm, tmp_path_factory.mktemp("properties") / "model", steps=40))
    options = TranslateOptions(device="cpu", dtype="float32")
    batcher = Batcher(open_engine([model_dir], options), options, 0.0, options.batch_tokens,
                      max_search_bytes=LIMITS.max_search_bytes)
    with TestClient(create_app(batcher, serving_card([model_dir], options, LIMITS, 0.0, batcher.engine.description), LIMITS)) as client:
        yield client


def call_estimate(engine, src, targets: dict) -> int:
    """The cost estimate of one search call, from the tensors and pieces it was given."""
    from nmtkit.serving.admission import decoder_state_bytes

    options = engine.options
    sentences, source = src.shape
    output = math.floor(options.max_len_a * source + options.max_len_b)
    output = max([output, *(len(prefix) for prefix in targets.get("prefixes") or [])])
    if engine.max_positions:
        output = min(output, engine.max_positions - 1)
    pieces = max((sum(len(p) for p in phrases) for phrases in targets.get("constraints") or []), default=0)
    return estimate_search_bytes(sentences, source, output, options.beam_size, len(engine.tgt_vocab), pieces,
                                 options.alignments, decoder_state_bytes(engine))


def test_the_server_answers_any_body_with_2xx_or_4xx_and_never_searches_over_its_bound(served, monkeypatch):
    from nmtkit.decoding.torch_engine import TorchEngine

    estimates: list[int] = []
    search = TorchEngine.search

    def measured(engine, src, src_mask, **targets):
        estimates.append(call_estimate(engine, src, targets))
        return search(engine, src, src_mask, **targets)

    monkeypatch.setattr(TorchEngine, "search", measured)
    statuses: list[int] = []

    @settings(max_examples=80, **HYPOTHESIS)
    @given(bodies())
    @example(json.dumps({"texts": ["a b c"], "constraints": [[" ".join(SYMBOLS * 4)] * 8], "beam_size": 8}).encode())
    def answer_any(body):
        answer = served.post("/translate", content=body, headers={"content-type": "application/json"})
        statuses.append(answer.status_code)
        assert answer.status_code == 200 or 400 <= answer.status_code < 500, answer.text
        reply = answer.json()
        if answer.status_code == 200:
            assert len(reply["translations"]) == len(json.loads(body)["texts"])
        else:
            assert "\n" not in reply["error"]

    answer_any()
    assert estimates and max(estimates) <= LIMITS.max_search_bytes
    refused = served.get("/metrics").text
    assert 200 in statuses and 'nmtkit_rejected_requests_total{reason="search_memory"} 0' not in refused
