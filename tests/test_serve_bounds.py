"""What one client can make ``nmtkit serve`` do is bounded, and nothing is silently ignored:
connections and unfinished request heads (slowloris), waiting requests, a request's time and
work (its search stops once nobody waits for it), the shutdown; HTTP that does not parse, query
strings, repeated JSON keys and cut texts get a clear JSON answer; a second signal exits at once.

Most tests run the real HTTP stack (uvicorn on a socket, in a thread of this process) on a tiny
model; those about signals and start-up run ``nmtkit serve`` itself."""
from __future__ import annotations

import contextlib
import errno
import http.client
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import reversal_pairs, train_tiny
from support.cli import cli_in_process
from support.sockets import answer_of
from nmtkit.decoding.options import TranslateOptions
from nmtkit.decoding.translate import Translator
from nmtkit.translate_files import open_engine

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")  # Starlette's TestClient

from starlette.testclient import TestClient  # noqa: E402

import nmtkit.serving.app as serving_app  # noqa: E402
from nmtkit.serving.app import accept_error_handler, bind, build_server, create_app, serving_card  # noqa: E402
from nmtkit.serving.batcher import Batcher  # noqa: E402
from nmtkit.serving.metrics import Metrics  # noqa: E402
from nmtkit.serving.requests import Limits  # noqa: E402

CPU = dict(device="cpu", dtype="float32")
FAST = Limits(max_lines=8, read_timeout_s=1.0, request_timeout_s=30.0)
BODY = {"texts": ["a b c"]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, reversal_spm) -> Path:
    return train_tiny(reversal_spm, tmp_path_factory.mktemp("bounds") / "model", steps=60)


def new_batcher(model_dir: Path, limits: Limits, window_s: float = 0.0) -> Batcher:
    options = TranslateOptions(**CPU)
    return Batcher(open_engine([str(model_dir)], options), options, window_s, options.batch_tokens, Metrics(),
                   limits.max_search_bytes, limits.max_queued)


def app_of(batcher: Batcher, limits: Limits, model_dir: Path, stopping: threading.Event | None = None):
    card = serving_card([str(model_dir)], batcher.base, limits, batcher.window_s * 1000, batcher.engine.description)
    return create_app(batcher, card, limits, None, stopping or threading.Event())


@contextlib.contextmanager
def live(model_dir: Path, limits: Limits = FAST, window_s: float = 0.0):
    """The server ``nmtkit serve`` runs (uvicorn, the guarded protocol, the app), on a free
    port of 127.0.0.1 in a thread of this process: (port, batcher, the thread running it)."""
    batcher = new_batcher(model_dir, limits, window_s)
    stopping = threading.Event()
    server = build_server(app_of(batcher, limits, model_dir, stopping), batcher.metrics, limits, stopping)
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    thread.server = server
    try:
        yield sock.getsockname()[1], batcher, thread
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def ask(port: int, method: str, path: str, body=None, headers: dict | None = None,
        conn: http.client.HTTPConnection | None = None) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of one request (on ``conn`` when given)."""
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=json.dumps(body) if isinstance(body, dict) else body, headers=headers or {})
    reply = conn.getresponse()
    return reply.status, {k.lower(): v for k, v in reply.getheaders()}, json.loads(reply.read() or b"null")


def json_answer(raw: bytes) -> tuple[int, dict, dict]:
    """(status, headers, body) of one raw HTTP answer with a JSON body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def partial_head(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n")  # the head never ends
    return sock


class Gate:
    """Translator.hypotheses held until ``open()`` (for the first ``held`` calls), counting calls."""

    def __init__(self, monkeypatch, held: int = 1) -> None:
        self.calls, self.held, self.event = [], held, threading.Event()
        original = Translator.hypotheses

        def hypotheses(translator, lines, *args, **kwargs):
            self.calls.append(list(lines))
            if len(self.calls) <= self.held:
                assert self.event.wait(60)
            return original(translator, lines, *args, **kwargs)

        monkeypatch.setattr(Translator, "hypotheses", hypotheses)

    def open(self) -> None:
        self.event.set()


@contextlib.contextmanager
def server_log():
    """The records of the log uvicorn writes (``uvicorn.error``: uvicorn's own configuration
    keeps them from the root logger, and so from caplog)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# --- connections ------------------------------------------------------------------------------

def test_unfinished_heads_get_a_408_and_connections_past_the_limit_a_503(model_dir):
    """Slowloris: a head sent in part and then nothing held its connection forever (uvicorn's
    timer stops at the first byte), and connections were unlimited until the process ran out of
    files. Now the head has --read-timeout, after a connect or after an answer, and one
    connection past --max-connections is a 503 as it connects."""
    with live(model_dir, Limits(read_timeout_s=1.0, max_connections=3)) as (port, _, _):
        held = [partial_head(port) for _ in range(3)]
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", port))
        status, headers, body = json_answer(answer_of(extra, 5))
        assert (status, headers["retry-after"]) == (503, "2") and "--max-connections" in body["error"]
        started = time.monotonic()
        for sock in held:
            status, headers, body = json_answer(answer_of(sock, 10))
            assert status == 408 and headers["content-type"] == "application/json"
            assert body == {"error": "request head not received in full within 1 s (--read-timeout)"}
        assert time.monotonic() - started < 5
        # after an answer, on the same connection: the next head has the same deadline
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\n")
        raw = answer_of(sock, 10)
        assert raw.startswith(b"HTTP/1.1 200 ") and raw.count(b"HTTP/1.1 408 ") == 1
        assert ask(port, "GET", "/health")[0] == 200  # the server answers again
        metrics = ask_text(port, "/metrics")
        assert 'nmtkit_rejected_requests_total{reason="connections"} 1' in metrics
        assert 'nmtkit_rejected_requests_total{reason="read_timeout"} 4' in metrics


def ask_text(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    return conn.getresponse().read().decode()


def test_accept_failing_for_lack_of_files_is_one_log_line_not_a_traceback_per_retry():
    handler = accept_error_handler(interval_s=60)
    defaults = []

    class Loop:
        def default_exception_handler(self, context):
            defaults.append(context)

    with server_log() as records:
        for _ in range(50):
            handler(Loop(), {"message": "socket.accept() out of system resource",
                             "exception": OSError(errno.EMFILE, "Too many open files")})
        handler(Loop(), {"message": "something else", "exception": ValueError("x")})
    assert [record.getMessage() for record in records] == [
        "cannot accept connections: Too many open files (see ulimit -n and --max-connections); new connections "
        "wait until some close"]
    assert all(record.exc_info is None for record in records)
    assert [context["message"] for context in defaults] == ["something else"]


def test_max_connections_needs_room_among_open_files(model_dir, monkeypatch, capsys):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (300, 300))
    code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(model_dir), "--port", "0")
    assert (code, err) == (2, "nmtkit: error: --max-connections 256 needs about 576 open files, over this "
                              "process's limit of 300 (ulimit -n): give a smaller --max-connections or raise the "
                              "limit\n")


# --- queued work, a request's time, departed clients -----------------------------------------

def test_a_full_queue_is_a_503_with_retry_after_and_the_gauge_counts_collected_requests(model_dir, monkeypatch):
    gate = Gate(monkeypatch)
    limits = Limits(max_queued=2)
    batcher = new_batcher(model_dir, limits, window_s=0.0)
    with TestClient(app_of(batcher, limits, model_dir)) as client:
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(client.post("/translate", json=BODY)))
                   for _ in range(3)]
        threads[0].start()
        until(lambda: gate.calls)  # the first runs (held), the next two wait
        for thread in threads[1:]:
            thread.start()
        until(lambda: batcher.stats()["queued"] == 2)
        refused = client.post("/translate", json=BODY)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
        assert refused.json() == {"error": "2 requests already wait for the model (--max-queued); try again shortly"}
        assert client.get("/health").json()["queued"] == 2
        assert "nmtkit_queued_requests 2" in client.get("/metrics").text
        gate.open()
        for thread in threads:
            thread.join(60)
        assert [answer.status_code for answer in answers] == [200] * 3
        assert client.get("/health").json()["queued"] == 0
    batcher.close()


def test_the_queue_gauge_counts_requests_waiting_in_a_batch_window(model_dir):
    """A request collected into the next call (its window still open) still waits: the gauge
    showed 0 for it."""
    limits = Limits()
    batcher = new_batcher(model_dir, limits, window_s=1.5)
    with TestClient(app_of(batcher, limits, model_dir)) as client:
        answer = []
        thread = threading.Thread(target=lambda: answer.append(client.post("/translate", json=BODY)))
        thread.start()
        time.sleep(0.5)  # taken by the worker, inside its 1.5 s window
        assert client.get("/health").json()["queued"] == 1
        thread.join(60)
        assert answer[0].status_code == 200 and client.get("/health").json()["queued"] == 0
    batcher.close()


def test_requests_whose_clients_left_are_never_translated_nor_counted(model_dir, monkeypatch):
    gate = Gate(monkeypatch)
    with live(model_dir) as (port, batcher, _):
        first = threading.Thread(target=lambda: ask(port, "POST", "/translate", BODY))
        first.start()
        until(lambda: gate.calls)
        body = json.dumps({"texts": ["d e f"], "lenpen": 0.5}).encode()
        gone = []
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            gone.append(sock)
        until(lambda: batcher.stats()["queued"] == 5)
        for sock in gone:
            sock.close()
        until(lambda: batcher.stats()["queued"] == 0)
        gate.open()
        first.join(60)
        stats = batcher.stats()
        assert (stats["requests"], stats["abandoned"], stats["batches"]) == (1, 5, 1)
        assert len(gate.calls) == 1  # nothing was translated for the clients that left
        metrics = ask_text(port, "/metrics")
        assert "nmtkit_requests_total 1\n" in metrics and "nmtkit_disconnected_requests_total 5\n" in metrics


@pytest.fixture()
def slow_steps(monkeypatch):
    """Every decoder step of the tiny model takes 20 ms (a long text under a wide beam, in small),
    counted; ``steps.seconds`` sets another time."""
    from nmtkit.models.transformer import Transformer

    class Steps(list):
        seconds = 0.02

    steps, original = Steps(), Transformer.decode_step

    def decode_step(self, *args, **kwargs):
        steps.append(1)
        time.sleep(steps.seconds)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "decode_step", decode_step)
    return steps


def test_a_request_past_its_timeout_is_a_504_and_its_search_stops(model_dir, slow_steps):
    """min_len 60 forces 60 steps (1.2 s here; a 2,000-character text at beam 16 and min_len 1024
    took 71 s on a real model): past --request-timeout the answer is a 504 and the search stops
    at its next step, so the next request is answered at once."""
    limits = Limits(request_timeout_s=0.4)
    with live(model_dir, limits) as (port, batcher, _):
        started = time.monotonic()
        status, _, body = ask(port, "POST", "/translate", {"texts": ["a b c"], "min_len": 60, "max_len_b": 60})
        assert status == 504 and body["error"].startswith("not translated within 0.4 s (--request-timeout)")
        assert time.monotonic() - started < 1.0
        until(lambda: not batcher.stats()["queued"])
        time.sleep(0.2)
        stopped_at = len(slow_steps)
        assert stopped_at < 40  # it stopped well before its 60 steps
        assert ask(port, "POST", "/translate", {"texts": [""]})[0] == 200  # nothing left running ahead of it
        assert len(slow_steps) == stopped_at
        assert batcher.stats()["requests"] == 1 and batcher.stats()["abandoned"] == 1


def test_shutdown_waits_for_a_request_in_flight_no_longer_than_its_timeout(model_dir, slow_steps):
    """A request of 60 steps of 0.1 s is in flight as the server stops: it is answered (504) at
    its --request-timeout and the server is gone a moment later, where it waited for all 6 s (for
    hours, with 64 such requests queued)."""
    slow_steps.seconds = 0.1
    with live(model_dir, Limits(request_timeout_s=1.0)) as (port, _, thread):
        answer = []
        client = threading.Thread(target=lambda: answer.append(
            ask(port, "POST", "/translate", {"texts": ["a b c"], "min_len": 60, "max_len_b": 60})))
        client.start()
        until(lambda: slow_steps)
        started = time.monotonic()
        thread.server.should_exit = True  # as SIGTERM does
        thread.join(10)
        assert not thread.is_alive() and time.monotonic() - started < 2.5
        client.join(10)
        assert answer[0][0] == 504 and len(slow_steps) < 30


def test_a_request_that_waits_past_its_timeout_is_a_503_and_never_runs(model_dir, monkeypatch):
    gate = Gate(monkeypatch)
    limits = Limits(request_timeout_s=0.5)
    batcher = new_batcher(model_dir, limits)
    with TestClient(app_of(batcher, limits, model_dir)) as client:
        first = threading.Thread(target=lambda: client.post("/translate", json=BODY))
        first.start()
        until(lambda: gate.calls)
        waited = client.post("/translate", json={"texts": ["x y"], "lenpen": 0.5})
        assert waited.status_code == 503 and waited.headers["retry-after"] == "2"
        assert waited.json()["error"].startswith("the model did not get to this request within 0.5 s")
        gate.open()
        first.join(60)
        assert len(gate.calls) == 1 and client.get("/health").json()["queued"] == 0
    batcher.close()


def start_server(model_dir: Path, *args: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-m", "nmtkit", "serve", "-m", str(model_dir), "--port", "0", *args],
                              stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    for raw in server.stderr:
        match = re.search(r"http://127\.0\.0\.1:(\d+)", raw.decode())
        if match:
            return server, int(match.group(1))
    raise AssertionError(f"no server (exit {server.wait()})")


def test_a_second_signal_exits_at_once_in_one_line(model_dir):
    """The first SIGINT waits for a request in flight (an upload still trickling in); a second
    one ends the process at once: 130 and one line, where it printed a hundred lines of
    tracebacks and aborted (SIGABRT) when a search was running."""
    server, port = start_server(model_dir, "--read-timeout", "60")
    try:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")

        def trickle():
            with contextlib.suppress(OSError):
                for _ in range(60):
                    sock.sendall(b" ")
                    time.sleep(0.3)

        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(0.5)
        server.send_signal(signal.SIGINT)
        time.sleep(1.5)
        assert server.poll() is None  # still answering the upload
        started = time.monotonic()
        server.send_signal(signal.SIGINT)
        assert server.wait(10) == 130 and time.monotonic() - started < 3
        assert server.stderr.read().decode() == (
            "nmtkit: stopped at once by a second signal (SIGINT); requests in flight were dropped\n")
        sock.close()
    finally:
        server.kill()
        server.wait()


# --- start-up ---------------------------------------------------------------------------------

def test_max_beam_over_what_a_request_may_ask_is_refused(model_dir, monkeypatch, capsys):
    """--max-beam 80 was accepted and capped at 64 without a word, and --beam-size 80 with it
    ran every request at a beam no request could ask for."""
    monkeypatch.setattr(serving_app, "run_until_stopped", lambda server, sock: None)  # accepted: return at once
    for args in (("--max-beam", "80"), ("--max-beam", "65", "--beam-size", "65")):
        code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(model_dir), "--port", "0", *args)
        assert (code, err) == (2, f"nmtkit: error: --max-beam {args[1]} is over 64, the largest beam_size a request "
                                  "may ask for\n")


def test_a_port_taken_between_bind_and_listen_is_a_one_line_error(model_dir, monkeypatch, capsys):
    """Two servers started together may both bind one port (SO_REUSEADDR): the one that listens
    second failed with a traceback after loading its model."""
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.bind(("127.0.0.1", 0))
    port = other.getsockname()[1]
    real_bind = socket.socket.bind

    def bind_then_the_other_listens(self, address):
        real_bind(self, address)
        if address[1] == port:
            other.listen()

    monkeypatch.setattr(socket.socket, "bind", bind_then_the_other_listens)
    try:
        code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(model_dir), "--port", str(port))
    finally:
        other.close()
    assert (code, err) == (1, f"nmtkit: error: cannot listen on 127.0.0.1:{port}: Address already in use\n")


def served_app(monkeypatch, capsys, model_dir: Path, *args: str):
    """The app ``nmtkit serve ARGS`` would run, and what it printed (it returns once listening)."""
    caught = {}
    monkeypatch.setattr(serving_app, "run_until_stopped", lambda server, sock: caught.update(app=server.config.app))
    code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(model_dir), "--port", "0", *args)
    assert code == 0, err
    return caught["app"], err


def test_an_ipv6_address_is_printed_in_brackets(model_dir, monkeypatch, capsys):
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    _, err = served_app(monkeypatch, capsys, model_dir, "--host", "::1")
    assert re.search(r"on http://\[::1\]:\d+ \(SIGTERM", err), err


def test_info_leaves_paths_out_beyond_loopback(model_dir, monkeypatch, capsys):
    local, _ = served_app(monkeypatch, capsys, model_dir)
    exposed, _ = served_app(monkeypatch, capsys, model_dir, "--host", "0.0.0.0", "--api-key", "k")
    with TestClient(local) as client:
        card = client.get("/info").json()
    assert card["model_dir"] == str(model_dir) and card["serving"]["models"] == [str(model_dir)]
    with TestClient(exposed) as client:
        hidden = client.get("/info", headers={"x-api-key": "k"})
        text = client.get("/info", params={"format": "text"}, headers={"x-api-key": "k"})
    assert hidden.json()["model_dir"] == "model" and hidden.json()["serving"]["models"] == ["model"]
    assert str(model_dir.parent) not in hidden.text and str(model_dir.parent) not in text.text
    assert text.status_code == 200 and "model card: model" in text.text


# --- answers that say what happened -----------------------------------------------------------

@pytest.fixture(scope="module")
def client(model_dir):
    batcher = new_batcher(model_dir, FAST)
    with TestClient(app_of(batcher, FAST, model_dir)) as test_client:
        yield test_client


def test_query_parameters_no_route_reads_are_a_400(client):
    """/translate?beam_size=16 was a 200 translated at the server's beam."""
    refused = client.post("/translate?beam_size=16", json=BODY)
    assert refused.status_code == 400 and refused.json() == {
        "error": "unknown query parameter(s) 'beam_size': /translate takes none (decode settings go in the JSON body)"}
    for path in ("/health?x=1", "/metrics?x=1", "/info?format=json&x"):
        answer = client.get(path)
        assert answer.status_code == 400 and "unknown query parameter(s) 'x'" in answer.json()["error"], path
    assert client.get("/info?format=json&format=text").json() == {"error": "query parameter 'format' given twice"}
    assert client.get("/info?format=text").status_code == 200 and client.get("/health?").status_code == 200


def test_texts_cut_to_the_models_positions_are_named_in_the_answer(client):
    long = " ".join(s for s, _ in reversal_pairs(40, 3, length=3))  # over the tiny model's 64 positions
    answer = client.post("/translate", json={"texts": ["a b c", long, ""]})
    assert answer.status_code == 200 and answer.json()["truncated"] == [False, True, False]
    assert "truncated" not in client.post("/translate", json={"texts": ["a b c"]}).json()


def test_a_declared_length_of_any_size_over_the_limit_is_a_413_at_once(client):
    for declared in ("99999999999999999999", "0" * 30 + "1048577", "9" * 5000):
        started = time.monotonic()
        answer = client.post("/translate", content=b'{"texts": ["a"]}', headers={"content-length": declared})
        assert answer.status_code == 413 and time.monotonic() - started < 2, declared
        assert "\n" not in answer.json()["error"] and len(answer.json()["error"]) < 100
    assert client.post("/translate", content=b'{"texts": ["a"]}',
                       headers={"content-length": "0" * 30 + "16"}).status_code == 200


def test_a_failure_inside_is_a_generic_500_and_one_log_line(client, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("secret /home/x detail\nsecond line")

    monkeypatch.setattr(Translator, "hypotheses", broken)
    with server_log() as records:
        answer = client.post("/translate", json=BODY)  # the test client raises what the app re-raises
    assert answer.status_code == 500
    assert answer.json() == {"error": "internal error: the request failed on the server (see its log)"}
    assert [(r.getMessage(), r.exc_info) for r in records] == [
        ("POST /translate failed: ValueError: secret /home/x detail second line", None)]
    assert "nmtkit_failed_requests_total 1" in client.get("/metrics").text
    monkeypatch.undo()
    assert client.post("/translate", json=BODY).status_code == 200


# --- HTTP on the wire -------------------------------------------------------------------------

def test_an_oversized_chunked_upload_reads_its_413_and_the_connection_goes_on(model_dir):
    """Without a Content-Length the limit is met mid-upload: the answer was a reset connection."""
    with live(model_dir, Limits(max_body_bytes=1000)) as (port, _, _):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        chunks = (b"x" * 65536 for _ in range(200))  # 13 MB, chunked, sent in full before the answer is read
        status, headers, body = ask(port, "POST", "/translate", chunks, conn=conn)  # http.client: chunked
        assert (status, body) == (413, {"error": "body over 1000 bytes (--max-body-bytes)"})
        assert headers.get("connection") != "close"
        sock = conn.sock
        assert ask(port, "POST", "/translate", BODY, conn=conn)[0] == 200 and conn.sock is sock  # the same connection


MALFORMED_HTTP = {
    "bad content-length": b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
    "a head over h11's 16 KiB": b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 200_000 + b"\r\n\r\n",
    "TLS": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 50,
    "21-digit length": b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 21 + b"\r\n\r\n{}",
}


def test_http_that_does_not_parse_is_a_json_400(model_dir):
    with live(model_dir) as (port, _, _):
        for case, raw in MALFORMED_HTTP.items():
            sock = socket.create_connection(("127.0.0.1", port))
            with contextlib.suppress(OSError):  # the server answers and closes before a long head is all sent
                sock.sendall(raw)
            status, headers, body = json_answer(answer_of(sock, 10))
            assert (status, headers["content-type"]) == (400, "application/json"), case
            assert body == {"error": "not a valid HTTP/1.1 request (its request line, headers or body framing)"}
            sock.close()
        assert 'nmtkit_rejected_requests_total{reason="invalid"} 4' in ask_text(port, "/metrics")
