"""``nmtkit serve`` as a service: requests refused by their estimated memory before any search,
huge numbers refused as 4xx, an optional API key, exact /metrics counters (under concurrency
too), read timeouts, and a shutdown that no stalled client holds up."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import concurrently, reversal_pairs, train_tiny
from support.cli import cli_in_process
from support.sockets import answer_of
from nmtkit.decoding.options import TranslateOptions
from nmtkit.decoding.translate import Translator
from nmtkit.errors import ConfigError
from nmtkit.translate_files import open_engine

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")  # Starlette's TestClient

from starlette.testclient import TestClient  # noqa: E402

from nmtkit.serving.access import check_key, exposure_warning  # noqa: E402
from nmtkit.serving.admission import search_shapes  # noqa: E402
from nmtkit.serving.app import create_app, serving_card  # noqa: E402
from nmtkit.serving.batcher import Batcher  # noqa: E402
from nmtkit.serving.requests import Limits  # noqa: E402

CPU = dict(device="cpu", dtype="float32")
LIMITS = Limits(max_lines=8, max_line_chars=2000, max_beam=16)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, reversal_spm) -> Path:
    return train_tiny(reversal_spm, tmp_path_factory.mktemp("service") / "model", steps=60)


def app_client(model_dir: Path, limits: Limits = LIMITS, window_s: float = 0.0, api_key: str | None = None):
    options = TranslateOptions(**CPU)
    batcher = Batcher(open_engine([str(model_dir)], options), options, window_s, options.batch_tokens,
                      max_search_bytes=limits.max_search_bytes)
    card = serving_card([str(model_dir)], options, limits, window_s * 1000, batcher.engine.description)
    return TestClient(create_app(batcher, card, limits, api_key))


@pytest.fixture(scope="module")
def client(model_dir):
    with app_client(model_dir) as test_client:
        yield test_client


def words(n: int, seed: int) -> str:
    return " ".join(s for s, _ in reversal_pairs(n, seed, length=1))


def metrics_of(client, **headers) -> dict[str, float]:
    """/metrics parsed: sample name with labels -> value; every line is a comment or a sample."""
    answer = client.get("/metrics", headers=headers)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in answer.text.splitlines():
        if line.startswith("# "):
            assert re.fullmatch(r"# (HELP|TYPE) nmtkit_\w+ .+", line), line
            continue
        name, value = line.rsplit(" ", 1)
        assert re.fullmatch(r'nmtkit_\w+(\{\w+="[^"]*"\})?', name), line
        samples[name] = float(value)
    return samples


def test_a_request_over_the_memory_bound_is_a_413_naming_the_limit_before_any_search(client, monkeypatch):
    """32 phrases of 60 words and beam 16 under 2,000-character texts: inside every count limit."""
    from nmtkit.decoding.torch_engine import TorchEngine

    searched = []
    monkeypatch.setattr(TorchEngine, "search", lambda *args, **kwargs: searched.append(1))
    phrases = [words(60, seed) for seed in range(32)]
    body = {"texts": [words(900, 99)[:2000]], "constraints": [phrases], "beam_size": 16}
    before = metrics_of(client)['nmtkit_rejected_requests_total{reason="search_memory"}']
    answer = client.post("/translate", json=body)
    assert answer.status_code == 413 and "--max-search-bytes" in answer.json()["error"]
    assert re.search(r"about [\d.]+ GiB for one search, over the server's 4\.0 GiB", answer.json()["error"])
    assert searched == []
    assert metrics_of(client)['nmtkit_rejected_requests_total{reason="search_memory"}'] == before + 1


def test_the_memory_bound_admits_exactly_up_to_its_value(model_dir):
    texts, phrases = [words(8, 1), words(5, 2)], [[words(6, 3), words(4, 4)], []]
    options = TranslateOptions(**CPU, beam_size=4)
    engine = open_engine([str(model_dir)], options)
    from nmtkit.decoding.guides import Guide

    needed = max(shape.bytes(engine) for shape in search_shapes(engine, options, texts,
                                                                [Guide.of("", p) for p in phrases]))
    body = {"texts": texts, "constraints": phrases, "beam_size": 4}
    with app_client(model_dir, Limits(max_search_bytes=needed)) as exact:
        answer = exact.post("/translate", json=body)
        assert answer.status_code == 200
        guides = [Guide.of("", p) for p in phrases]
        assert answer.json()["translations"] == Translator(engine, options).translate(texts, guides=guides)
    with app_client(model_dir, Limits(max_search_bytes=needed - 1)) as short:
        assert short.post("/translate", json=body).status_code == 413


def test_requests_join_in_one_call_only_while_their_joint_estimate_fits(model_dir):
    from nmtkit.decoding.guides import Guide

    text, phrases = words(6, 1), [words(3, 2), words(2, 3)]
    options = TranslateOptions(**CPU)
    engine = open_engine([str(model_dir)], options)
    (shape,) = search_shapes(engine, options, [text], [Guide.of("", phrases)])
    pair = shape.joined(shape).bytes(engine)
    assert shape.joined(shape).joined(shape).bytes(engine) > pair > shape.bytes(engine)
    body = {"texts": [text], "constraints": [phrases]}
    with app_client(model_dir, Limits(max_search_bytes=pair), window_s=0.5) as batched:
        answers = concurrently(batched, [body] * 4)
        samples = metrics_of(batched)
    expected = Translator(engine, options).translate([text], guides=[Guide.of("", phrases)])
    assert [answer.json()["translations"] for answer in answers] == [expected] * 4
    assert samples["nmtkit_batch_requests_count"] == 2 and samples['nmtkit_batch_requests_bucket{le="1"}'] == 0
    with app_client(model_dir, window_s=0.5) as roomy:
        concurrently(roomy, [body] * 4)
        assert metrics_of(roomy)["nmtkit_batch_requests_count"] == 1


def test_a_refusal_raised_while_translating_is_a_400_not_a_500(client, monkeypatch):
    def refuse(*args, **kwargs):
        raise ConfigError("line 1 has constraints too costly to search")

    monkeypatch.setattr(Translator, "hypotheses", refuse)
    failed = metrics_of(client)["nmtkit_failed_requests_total"]
    answer = client.post("/translate", json={"texts": ["a b"]})
    assert answer.status_code == 400 and answer.json() == {"error": "line 1 has constraints too costly to search"}
    assert metrics_of(client)["nmtkit_failed_requests_total"] == failed


def test_an_allocation_that_fails_anyway_is_a_503_without_a_traceback(client, monkeypatch):
    def exhausted(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 131084288000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(Translator, "hypotheses", exhausted)
    answer = client.post("/translate", json={"texts": ["a b"]})
    assert answer.status_code == 503 and "ran out of memory" in answer.json()["error"]
    assert metrics_of(client)['nmtkit_rejected_requests_total{reason="out_of_memory"}'] == 1
    monkeypatch.undo()
    assert client.post("/translate", json={"texts": ["a b"]}).status_code == 200  # the server goes on


HUGE = "9" * 5000  # past Python's int-to-string limit of 4,300 digits
HUGE_BODIES = {
    "beam_size": '{"texts": ["a b"], "beam_size": %s}' % HUGE,
    "min_len": '{"texts": ["a b"], "min_len": %s}' % HUGE,
    "lenpen": '{"texts": ["a b"], "lenpen": -%s}' % HUGE,
    "a text": '{"texts": [%s]}' % HUGE,
    "texts": '{"texts": %s}' % HUGE,
    "a phrase": '{"texts": ["a"], "constraints": [[%s]]}' % HUGE,
    "a float": '{"texts": ["a"], "max_len_a": %s.5}' % HUGE,
    "under the limit": '{"texts": ["a"], "max_len_b": %s}' % HUGE[:4000],
}


@pytest.mark.parametrize("case", list(HUGE_BODIES))
def test_numbers_of_thousands_of_digits_are_a_400_in_one_short_line(client, case):
    answer = client.post("/translate", content=HUGE_BODIES[case].encode(), headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "\n" not in error and len(error) < 200, error
    if case == "under the limit":
        assert error == "max_len_b must be between 0 and 1024, not an integer of 4000 digits"


def test_a_content_length_that_is_not_ascii_digits_is_no_500(client):
    for declared in ("\u00b2".encode("latin-1"), b"1" * 5000):
        answer = client.post("/translate", content=b'{"texts": ["a"]}', headers={"content-length": declared})
        assert answer.status_code < 500


def test_the_api_key_guards_every_route_and_compares_bytes(model_dir):
    with app_client(model_dir, api_key="s3cret-key") as guarded:
        for path in ("/health", "/info", "/metrics"):
            refused = guarded.get(path)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            assert "API key" in refused.json()["error"]
        body = {"texts": ["a b"]}
        assert guarded.post("/translate", json=body).status_code == 401
        assert guarded.post("/translate", json=body, headers={"authorization": "Bearer s3cret-kex"}).status_code == 401
        assert guarded.post("/translate", json=body, headers={"x-api-key": "s3cret-key\u00e9".encode("latin-1")}).status_code == 401
        assert guarded.post("/translate", json=body, headers={"authorization": "Bearer s3cret-key"}).status_code == 200
        assert guarded.post("/translate", json=body, headers={"x-api-key": "s3cret-key"}).status_code == 200
        samples = metrics_of(guarded, **{"x-api-key": "s3cret-key"})
    assert samples['nmtkit_rejected_requests_total{reason="unauthorized"}'] == 6
    assert samples["nmtkit_requests_total"] == 2


def test_keys_no_client_could_send_and_exposed_addresses():
    for bad in ("", "two words", "caf\u00e9"):
        with pytest.raises(ConfigError, match="--api-key"):
            check_key(bad)
    assert check_key(None) is None and check_key("k-1_x") == "k-1_x"
    assert exposure_warning("0.0.0.0", None).startswith("listening on 0.0.0.0, beyond this machine")
    assert exposure_warning("::", None) and exposure_warning("192.168.1.4", None)
    assert exposure_warning("127.0.0.1", None) == exposure_warning("::1", None) == ""
    assert exposure_warning("0.0.0.0", "key") == ""


def test_metrics_count_exactly_what_was_asked(model_dir):
    with app_client(model_dir) as fresh:
        assert fresh.post("/translate", json={"texts": ["a b c", "d e", ""]}).status_code == 200
        assert fresh.post("/translate", json={"texts": ["f g"]}).status_code == 200
        assert fresh.post("/translate", content=b"{").status_code == 400
        assert fresh.post("/translate", json={"texts": ["a"] * 9}).status_code == 413
        assert fresh.get("/nowhere").status_code == 404
        samples = metrics_of(fresh)
    assert samples["nmtkit_requests_total"] == 2 and samples["nmtkit_lines_total"] == 4
    assert samples["nmtkit_failed_requests_total"] == 0 and samples["nmtkit_queued_requests"] == 0
    rejected = {name: value for name, value in samples.items() if name.startswith("nmtkit_rejected")}
    assert {name for name, value in rejected.items() if value} == {
        'nmtkit_rejected_requests_total{reason="invalid"}', 'nmtkit_rejected_requests_total{reason="texts"}',
        'nmtkit_rejected_requests_total{reason="route"}'}
    assert sum(rejected.values()) == 3
    latency = {name: value for name, value in samples.items() if name.startswith("nmtkit_request_latency")}
    buckets = [value for name, value in latency.items() if "_bucket" in name]
    assert buckets == sorted(buckets) and buckets[-1] == latency["nmtkit_request_latency_seconds_count"] == 2
    assert samples["nmtkit_batch_lines_sum"] == 4  # the empty line too is a line of its call


def test_metrics_lose_no_count_under_concurrent_requests(model_dir):
    bodies = [{"texts": [words(3, k)] * (1 + k % 3)} for k in range(12)] + [{"texts": 3}] * 4
    with app_client(model_dir, window_s=0.05) as busy:
        answers = concurrently(busy, bodies)
        samples = metrics_of(busy)
        stats = busy.get("/health").json()
    assert [answer.status_code for answer in answers] == [200] * 12 + [400] * 4
    assert samples["nmtkit_requests_total"] == 12 == samples["nmtkit_batch_requests_sum"]
    assert samples["nmtkit_lines_total"] == sum(1 + k % 3 for k in range(12)) == samples["nmtkit_batch_lines_sum"]
    assert samples['nmtkit_rejected_requests_total{reason="invalid"}'] == 4
    assert samples["nmtkit_request_latency_seconds_count"] == 12
    assert samples["nmtkit_batch_lines_count"] == stats["batches"]


def start_server(model_dir: Path, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, int, list[str]]:
    """``nmtkit serve --port 0``; the process, its port and what it said before the address."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    server = subprocess.Popen([sys.executable, "-m", "nmtkit", "serve", "-m", str(model_dir), "--port", "0", *args],
                              stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    said = []
    for raw in server.stderr:
        said.append(raw.decode())
        match = re.search(r"http://[^:]+:(\d+)", said[-1])
        if match:
            return server, int(match.group(1)), said
    raise AssertionError("".join(said))


def half_upload(port: int) -> socket.socket:
    """A connection that sent its headers and part of a 500-byte body, then nothing."""
    half = socket.create_connection(("127.0.0.1", port))
    half.sendall(b"POST /translate HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n{\"texts\": [")
    return half


def test_an_oversized_body_is_a_413_a_python_client_reads(model_dir):
    """A body declared past --max-body-bytes is refused from its headers, and a client that
    sends it all anyway (as http.client does) still reads the 413, not a reset connection; one
    that declares 100 MB and then stalls does not hold up shutdown."""
    import http.client

    server, port, _ = start_server(model_dir, "--max-body-bytes", "1000", "--read-timeout", "2")
    try:
        body = json.dumps({"texts": ["a " * 2_000_000]}).encode()
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/translate", body, {"content-type": "application/json"})
            reply = conn.getresponse()
            assert reply.status == 413 and "--max-body-bytes" in json.loads(reply.read())["error"]
            conn.close()
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(b"POST /translate HTTP/1.1\r\nhost: x\r\ncontent-length: 100000000\r\n\r\n{\"texts\": [")
        time.sleep(0.5)
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        assert server.wait(15) == 0 and time.monotonic() - started < 5
        assert answer_of(stalled, 5).startswith(b"HTTP/1.1 413 ")
        stalled.close()
    finally:
        server.kill()
        server.wait()


def test_stalled_uploads_time_out_and_never_hold_up_shutdown(model_dir):
    server, port, _ = start_server(model_dir, "--read-timeout", "2")
    try:
        idle = socket.create_connection(("127.0.0.1", port))  # connects and never sends a byte
        opened = time.monotonic()
        with half_upload(port) as half:
            started = time.monotonic()
            reply = answer_of(half, 20)
            assert reply.startswith(b"HTTP/1.1 408 ") and b"--read-timeout" in reply
            assert 1.5 < time.monotonic() - started < 10  # answered, and the connection closed
        assert answer_of(idle, 20) == b"" and time.monotonic() - opened < 15  # closed after the keep-alive timeout
        idle.close()
        stalled, silent = half_upload(port), socket.create_connection(("127.0.0.1", port))
        time.sleep(0.5)
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        assert server.wait(15) == 0
        assert time.monotonic() - started < 5
        assert answer_of(stalled, 5).startswith(b"HTTP/1.1 503 ")
        stalled.close()
        silent.close()
        assert server.stderr.read().decode().count("Traceback") == 0
    finally:
        server.kill()


def test_a_key_from_the_environment_and_the_warning_beyond_loopback(model_dir, monkeypatch, capsys):
    server, port, said = start_server(model_dir, "--host", "0.0.0.0", env={"NMTKIT_API_KEY": "env-key"})
    try:
        assert not any("without an API key" in line for line in said)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/health")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 401
        request.add_header("Authorization", "Bearer env-key")
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert json.loads(answer.read())["status"] == "ok"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    import nmtkit.serving.app

    monkeypatch.setattr(nmtkit.serving.app, "run_until_stopped", lambda server, sock: None)  # return once listening
    code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(model_dir), "--host", "0.0.0.0", "--port", "0")
    assert code == 0 and "warning: listening on 0.0.0.0, beyond this machine, without an API key" in err
    code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(model_dir), "--port", "0")
    assert code == 0 and "warning" not in err
