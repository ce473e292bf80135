"""What a ``POST /translate`` body may be, checked before anything reaches the model.

A body is one JSON object: ``texts`` (a list of single-line strings) plus optional decode
settings, each within a range (``DECODE_RANGES``) or among its choices (``DECODE_CHOICES``),
optional ``prefixes`` and ``constraints`` (one per text, as ``translate --prefix-file``
and ``--constraints`` give them) and ``target_lang`` (as ``translate --target-lang``; here only
its form is checked, the app checks it against the model). Every problem is a ``RequestError``
with an HTTP status, a one-line message and a ``reason`` (the label ``/metrics`` counts it
under); nothing here imports torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from nmtkit.decoding.guides import Guide
from nmtkit.decoding.options import language_problem

# setting -> (type, lowest, highest); beam_size's highest comes from Limits.max_beam
DECODE_RANGES: dict[str, tuple[type, float, float]] = {
    "beam_size": (int, 1, 64), "nbest": (int, 1, 64), "lenpen": (float, 0.0, 10.0),
    "max_len_a": (float, 0.0, 10.0), "max_len_b": (int, 0, 1024), "min_len": (int, 0, 1024),
    "scores": (bool, False, True), "alignments": (bool, False, True),
}
DECODE_CHOICES: dict[str, tuple[str, ...]] = {"alignment_units": ("words", "pieces")}  # as translate's flag
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # one text is one line, as in `nmtkit translate`
GUIDE_FIELDS = ("prefixes", "constraints")  # per text: a target prefix, target phrases to include
LANGUAGE_FIELD = "target_lang"  # a multilingual model: the language of every translation of the request
MAX_PHRASES = 32  # constraint phrases per text
# why a request was refused: the label of nmtkit_rejected_requests_total (every one is exported, 0 included)
REASONS = ("invalid", "body_size", "texts", "text_length", "phrases", "search_memory", "out_of_memory",
           "read_timeout", "unauthorized", "shutting_down", "route", "connections", "queue_full", "request_timeout")
LARGEST_BEAM = DECODE_RANGES["beam_size"][2]  # what --max-beam may allow


class RequestError(Exception):
    """A request the server refuses: ``status`` (4xx; 503 when it is busy, stopping or out of memory;
    504 when its translation ran out of time), a one-line message, the ``reason`` /metrics counts
    it under, and any ``headers`` to answer with."""

    def __init__(self, status: int, message: str, reason: str = "invalid",
                 headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status, self.reason, self.headers = status, reason, headers


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (the defaults suit interactive use on a CPU)."""

    max_body_bytes: int = 1 << 20
    max_lines: int = 256
    max_line_chars: int = 2000
    max_beam: int = 16
    max_search_bytes: int = 4 << 30  # the estimated peak memory of one search call (decoding/cost.py)
    read_timeout_s: float = 30.0  # a request's head, then its body, must each arrive in full this soon
    request_timeout_s: float = 60.0  # a request must be translated this soon after its body arrived
    max_queued: int = 64  # requests waiting for the model; more are refused with 503
    max_connections: int = 256  # open connections; more are refused with 503 as they connect

    def check(self, beam_size: int, **defaults: Any) -> None:
        """The limits are usable and admit the server's own ``beam_size`` and other decode
        ``defaults``: a default that a request could not ask for explicitly would make the
        two answer differently."""
        from nmtkit.errors import ConfigError

        if min(self.max_body_bytes, self.max_lines, self.max_line_chars, self.max_beam, self.max_search_bytes,
               self.max_queued, self.max_connections) < 1:
            raise ConfigError("--max-body-bytes, --max-lines, --max-line-chars, --max-beam, --max-search-bytes, "
                              "--max-queued and --max-connections must be at least 1")
        if self.max_beam > LARGEST_BEAM:  # a request's beam_size and nbest stop there whatever --max-beam says
            raise ConfigError(f"--max-beam {self.max_beam} is over {LARGEST_BEAM}, the largest beam_size a request "
                              "may ask for")
        for flag, seconds in (("--read-timeout", self.read_timeout_s), ("--request-timeout", self.request_timeout_s)):
            if not 0 < seconds <= 3600:  # NaN fails too
                raise ConfigError(f"{flag} must be above 0 and at most 3600 seconds, not {seconds}")
        if beam_size > self.max_beam:
            raise ConfigError(f"the server's beam size {beam_size} (--beam-size, else the model's decode settings) "
                              f"is over --max-beam {self.max_beam}: give a smaller --beam-size or a larger --max-beam")
        for name, value in defaults.items():
            _, low, high = DECODE_RANGES[name]
            if not low <= value <= high:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"the server's {flag} {value} ({flag}, else the model's decode settings) is outside "
                                  f"[{low}, {high}], the range a request may ask for: give a {flag} within it")


@dataclass(frozen=True)
class TranslateRequest:
    texts: list[str]
    decode: dict[str, Any]  # only the settings the client gave; the server's defaults fill the rest
    guides: Optional[list[Guide]] = None  # a prefix and constraints per text, when the request gives them


def parse_request(body: bytes, limits: Limits) -> TranslateRequest:
    """The checked request in ``body``, or a RequestError naming the first problem."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(400, f"body is not valid UTF-8 (byte {err.start})") from None
    try:
        payload = json.loads(text, object_pairs_hook=unique_keys)
    except RepeatedKey as err:
        raise RequestError(400, f"body repeats the key {shown_key(str(err))}: give each field once") from None
    except json.JSONDecodeError as err:
        raise RequestError(400, f"body is not JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:
        raise RequestError(400, "body is not JSON this server reads: nested too deeply") from None
    except ValueError:  # an integer past Python's int-to-string limit (4,300 digits)
        raise RequestError(400, "body is not JSON this server reads: a number with thousands of digits") from None
    if not isinstance(payload, dict):
        raise RequestError(400, 'body must be a JSON object such as {"texts": ["a line"]}')
    known = [*GUIDE_FIELDS, *DECODE_RANGES, *DECODE_CHOICES, LANGUAGE_FIELD]
    unknown = sorted(set(payload) - {"texts", *known})
    if unknown:
        raise RequestError(400, f"unknown field(s) {', '.join(map(repr, unknown))}; known: texts, {', '.join(known)}")
    texts = check_texts(payload.get("texts"), limits)
    decode = {name: check_setting(name, value, limits) for name, value in payload.items()
              if name in DECODE_RANGES or name in DECODE_CHOICES}
    # as translate refuses --alignment-units without --alignments (serve has no --alignments: the default is off)
    if "alignment_units" in decode and not decode.get("alignments", False):
        raise RequestError(400, 'alignment_units applies to "alignments": true only')
    if LANGUAGE_FIELD in payload:  # a setting like the others: requests that share it share batches
        decode[LANGUAGE_FIELD] = check_language(payload[LANGUAGE_FIELD])
    return TranslateRequest(texts, decode, check_guides(payload.get("prefixes"), payload.get("constraints"), texts, limits))


class RepeatedKey(ValueError):
    """A JSON object names the same key twice (its message is the key)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refusing a key given twice: json.loads would keep the last
    silently, so {"beam_size": 1, "beam_size": 16} would run at 16 whatever the client meant."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise RepeatedKey(key)
        out[key] = value
    return out


def shown_key(key: str) -> str:
    """``key`` for a one-line message: quoted, and cut when long."""
    return repr(key) if len(key) <= 40 else repr(key[:40]) + "..."


def check_texts(texts: Any, limits: Limits) -> list[str]:
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise RequestError(400, '"texts" must be a list of strings')
    if len(texts) > limits.max_lines:
        raise RequestError(413, f"{len(texts)} texts; at most {limits.max_lines} per request (--max-lines)", "texts")
    check_lines(texts, "texts", limits)
    return texts


def check_lines(lines: list[str], name: str, limits: Limits) -> None:
    """Each string of ``lines`` (the field ``name``) is one line of valid Unicode within the limit."""
    for index, line in enumerate(lines):
        if len(line) > limits.max_line_chars:
            raise RequestError(413, f"{name}[{index}] has {len(line)} characters; at most {limits.max_line_chars} "
                                    "(--max-line-chars)", "text_length")
        if any(c in LINE_BREAKS for c in line):
            raise RequestError(400, f"{name}[{index}] holds a line break; send one line per text")
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate escaped in the JSON ("\ud800")
            raise RequestError(400, f"{name}[{index}] is not valid Unicode (a lone surrogate)") from None


def check_guides(prefixes: Any, constraints: Any, texts: list[str], limits: Limits) -> Optional[list[Guide]]:
    """A Guide per text from the optional ``prefixes`` (a string per text, "" for none) and
    ``constraints`` (a list of target phrases per text), as ``translate --prefix-file`` and
    ``--constraints`` give them; None when the request has neither."""
    if prefixes is None and constraints is None:
        return None
    if prefixes is not None:
        if not isinstance(prefixes, list) or len(prefixes) != len(texts) or \
                not all(isinstance(prefix, str) for prefix in prefixes):
            raise RequestError(400, '"prefixes" must be a list of strings, one per text')
        check_lines(prefixes, "prefixes", limits)
    if constraints is not None:
        if not isinstance(constraints, list) or len(constraints) != len(texts) or \
                not all(isinstance(phrases, list) and all(isinstance(p, str) for p in phrases) for phrases in constraints):
            raise RequestError(400, '"constraints" must be a list with a list of strings per text')
        for index, phrases in enumerate(constraints):
            if len(phrases) > MAX_PHRASES:
                raise RequestError(413, f"constraints[{index}] has {len(phrases)} phrases; at most {MAX_PHRASES}",
                                   "phrases")
            check_lines(phrases, f"constraints[{index}]", limits)
            if not all(phrase.strip() for phrase in phrases):
                raise RequestError(400, f"constraints[{index}] holds an empty phrase")
    return [Guide.of(prefixes[i] if prefixes is not None else "", constraints[i] if constraints is not None else ())
            for i in range(len(texts))]


def check_language(lang: Any) -> str:
    """A ``target_lang`` of the form ``translate --target-lang`` takes ("" for none)."""
    if not isinstance(lang, str):
        raise RequestError(400, f'{LANGUAGE_FIELD} must be a string such as "es"')
    problem = language_problem(lang, LANGUAGE_FIELD)
    if problem:
        raise RequestError(400, problem)
    return lang


def check_setting(name: str, value: Any, limits: Limits) -> Any:
    """``value`` of decode setting ``name`` if its type and range are right."""
    if name in DECODE_CHOICES:
        if value not in DECODE_CHOICES[name]:
            raise RequestError(400, f"{name} must be one of {', '.join(map(repr, DECODE_CHOICES[name]))}")
        return value
    kind, low, high = DECODE_RANGES[name]
    if name in ("beam_size", "nbest"):
        high = min(high, limits.max_beam)
    if kind is bool:
        if not isinstance(value, bool):
            raise RequestError(400, f"{name} must be true or false")
        return value
    numeric = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, numeric):
        raise RequestError(400, f"{name} must be {'an integer' if kind is int else 'a number'}")
    if not low <= value <= high:  # NaN fails too
        raise RequestError(400, f"{name} must be between {low} and {high}, not {shown(value)}")
    return kind(value)


def shown(number: float) -> str:
    """``number`` for a message, a huge integer by its size (its digits would flood the line)."""
    if isinstance(number, int) and abs(number) >= 10 ** 18:  # JSON's integers stay within str()'s digit limit
        return f"an integer of {len(str(abs(number)))} digits"
    return str(number)
