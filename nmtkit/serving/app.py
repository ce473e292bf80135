"""The HTTP side of ``nmtkit serve``: a Starlette app that checks requests and hands them
to the batcher, and ``serve`` that loads the model and runs it under uvicorn.

    POST /translate   {"texts": [...], "beam_size": 4, "scores": true, ...}  -> {"translations": [...], ...}
                      (optional "prefixes": a string per text, "constraints": a list of phrases per text,
                      "target_lang": a multilingual model's language to translate into)
    GET  /health      status and counters (requests, lines, batches, queued)
    GET  /info        the model card of ``nmtkit info`` (its "target_languages" too; ?format=text for the table)
    GET  /metrics     counters and histograms in Prometheus's text format (``metrics.py``)

Every refusal is a JSON object ``{"error": "..."}`` with a 4xx status (503 while busy or
stopping, 504 past --request-timeout), HTTP that does not parse included (``guarded_protocol``);
a failed translation is a 500 and the server goes on. A request is checked whole (key, query,
body, schema, estimated memory) before it is queued. What one client can make the server do is
bounded: connections (--max-connections), a request's head and body (--read-timeout each),
requests waiting (--max-queued), a request's time (--request-timeout; its search stops when
nobody waits for it, its client gone included). SIGTERM (or Ctrl-C) stops accepting
connections, cuts uploads that have stalled, answers the requests in flight, then exits; a
second signal exits at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import io
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from contextlib import asynccontextmanager
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any, Awaitable, Callable, Optional, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from nmtkit.decoding.translate import target_tag_for
from nmtkit.errors import ConfigError, NmtkitError
from nmtkit.limits import check_range
from nmtkit.serving.access import authorize, check_key, exposure_warning
from nmtkit.serving.admission import admit
from nmtkit.serving.batcher import RUNNING, Batcher, Job, QueueFull
from nmtkit.serving.metrics import CONTENT_TYPE, Metrics
from nmtkit.serving.requests import LANGUAGE_FIELD, Limits, RequestError, parse_request

POLL_S = 0.25  # how often a body read looks at the clock and at the stop flag
SHUTDOWN_IDLE_S = 1.0  # once stopping, an upload that sent nothing for this long is cut
CLOSE = {"connection": "close"}  # a refusal before the whole body arrived ends the connection
RETRY_AFTER_S = 2  # what a 503 for a busy server tells the client to wait
REFUSAL_LINGER_S = 1.0  # a connection refused as it connected is read (and dropped) this long, then closed
WORKER_STOP_S = 10.0  # at the end, how long to wait for a search that cannot stop midway (CTranslate2)
SPARE_FILES = 64  # descriptors beside the connections: the model's files, logs, the event loop
PATH_KEYS = frozenset({"model_dir", "run_dir", "config", "workdir", "manifest", "models", "source_model"})
log = logging.getLogger("uvicorn.error")  # the log uvicorn writes, with its level and format


class ClientGone(Exception):
    """The client closed its connection before its answer."""


def create_app(batcher: Batcher, card: dict[str, Any], limits: Limits, api_key: Optional[str] = None,
               stopping: Optional[threading.Event] = None) -> Starlette:
    """The app around a running ``batcher`` (whose ``metrics`` it adds to); every route needs
    ``api_key`` when one is given; ``stopping`` is set when shutdown begins (uvicorn's, in
    ``serve``). Its shutdown stops the batcher's worker (waiting ``WORKER_STOP_S`` at most)."""
    metrics, stopping = batcher.metrics, stopping or threading.Event()

    async def translate(request: Request) -> Response:
        started = time.monotonic()
        try:
            body = await read_body(request, limits, stopping)
        except ClientDisconnect:
            metrics.disconnected()
            return Response(status_code=400)  # nobody is left to read it
        parsed = parse_request(body, limits)
        nbest = parsed.decode.get("nbest", batcher.base.nbest)
        if nbest > parsed.decode.get("beam_size", batcher.base.beam_size):  # the server's defaults count too
            raise RequestError(400, f"nbest {nbest} needs beam_size >= {nbest}")
        constrained = parsed.guides is not None and any(guide.constraints for guide in parsed.guides)
        if constrained and not batcher.engine.constrained_search:
            raise RequestError(400, "constraints need the torch engine: CTranslate2 has no lexically constrained search")
        try:  # the model must have the language's tag, as for translate --target-lang
            target_tag_for(batcher.engine.src_vocab, parsed.decode.get(LANGUAGE_FIELD, ""), LANGUAGE_FIELD)
        except ConfigError as err:
            raise RequestError(400, str(err)) from None
        shape, cut = admit(batcher.engine, batcher.base, limits, parsed.texts, parsed.decode, parsed.guides)
        try:
            job = batcher.submit(parsed.texts, parsed.decode, parsed.guides, shape)
        except QueueFull:
            raise RequestError(503, f"{limits.max_queued} requests already wait for the model (--max-queued); "
                                    "try again shortly", "queue_full", {"retry-after": str(RETRY_AFTER_S)}) from None
        try:
            answer = await outcome(request, batcher, job, limits)
        except ClientGone:
            metrics.disconnected()
            return Response(status_code=400)  # nobody is left to read it
        except NmtkitError as err:  # a refusal from the translator itself: the request's fault, not the server's
            raise RequestError(400, str(err)) from None
        except (MemoryError, RuntimeError) as err:  # what the estimate did not foresee (other processes' memory)
            if not out_of_memory(err):
                raise
            raise RequestError(503, "the server ran out of memory translating this request; send fewer or shorter "
                                    "texts, or try again later", "out_of_memory") from None
        if any(cut):  # which texts the model saw cut to its positions, in the order of the texts
            answer = {**answer, "truncated": cut}
        metrics.answered(len(parsed.texts), time.monotonic() - started)
        return JSONResponse(answer)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", **batcher.stats()})

    async def metrics_text(request: Request) -> Response:
        return Response(metrics.text(batcher.stats()["queued"]), media_type=CONTENT_TYPE)

    async def info(request: Request) -> Response:
        form = request.query_params.get("format", "json")
        if form == "json":
            return JSONResponse(card)
        if form == "text":
            return PlainTextResponse(card_text(card))
        raise RequestError(400, f"format must be json or text, not {form!r}")

    def route(path: str, handler: Callable[[Request], Awaitable[Response]], method: str,
              queries: Sequence[str] = ()) -> Route:
        async def endpoint(request: Request) -> Response:
            authorize(request.headers, api_key)
            check_query(request, queries)
            try:
                return await handler(request)
            except (RequestError, HTTPException):
                raise
            except Exception as err:  # a bug or a failed translation: a generic 500 and one log line, no traceback
                metrics.failed_request()
                log.error("%s %s failed: %s: %s", method, path, type(err).__name__, one_line(str(err)))
                return JSONResponse({"error": "internal error: the request failed on the server (see its log)"},
                                    status_code=500)

        return Route(path, endpoint, methods=[method])

    @asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        # uvicorn has drained the connections by now: every job is answered or abandoned
        if not await asyncio.to_thread(batcher.close, WORKER_STOP_S):
            log.error("a translation still runs %g s after the last request ended; exiting without it", WORKER_STOP_S)

    routes = [route("/translate", translate, "POST"), route("/health", health, "GET"),
              route("/info", info, "GET", ("format",)), route("/metrics", metrics_text, "GET")]
    return Starlette(routes=routes, exception_handlers=error_handlers(metrics), lifespan=lifespan)


def error_handlers(metrics: Metrics) -> dict:
    """JSON answers for refusals (counted by reason) and unknown routes and methods."""

    async def refusal(request: Request, err: RequestError) -> Response:
        metrics.reject(err.reason)
        return JSONResponse({"error": str(err)}, status_code=err.status, headers=err.headers)

    async def http_error(request: Request, err: HTTPException) -> Response:
        metrics.reject("route")
        return JSONResponse({"error": err.detail}, status_code=err.status_code, headers=err.headers)

    return {RequestError: refusal, HTTPException: http_error}


def check_query(request: Request, allowed: Sequence[str]) -> None:
    """A 400 for a query parameter the route does not read, or one given twice: ignored, it
    would look like a setting that took effect (``/translate?beam_size=16``)."""
    names = [name for name, _ in request.query_params.multi_items()]
    unknown = sorted(set(names) - set(allowed))
    if unknown:
        path = request.url.path
        takes = f"takes only {', '.join(allowed)}" if allowed else "takes none"
        hint = " (decode settings go in the JSON body)" if path == "/translate" else ""
        raise RequestError(400, f"unknown query parameter(s) {', '.join(repr(n[:40]) for n in unknown)}: "
                                f"{path} {takes}{hint}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise RequestError(400, f"query parameter {repeated[0]!r} given twice")


async def outcome(request: Request, batcher: Batcher, job: Job, limits: Limits) -> dict[str, Any]:
    """``job``'s answer. When its client disconnects first (ClientGone) or --request-timeout
    passes, the job is abandoned, so no work is done for nobody: dropped if it still waits,
    its search stopped once no request in it is wanted."""
    waiter = asyncio.wrap_future(job.future)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        done, _ = await asyncio.wait({waiter, gone}, timeout=limits.request_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            return waiter.result()
        started = job.state == RUNNING
        batcher.abandon(job)
        if gone in done:
            raise ClientGone()
        if started:
            raise RequestError(504, f"not translated within {limits.request_timeout_s:g} s (--request-timeout): send "
                                    "fewer or shorter texts, or a smaller beam_size, min_len or max_len_b",
                               "request_timeout")
        raise RequestError(503, f"the model did not get to this request within {limits.request_timeout_s:g} s "
                                "(--request-timeout): the server is busy, try again later", "request_timeout",
                           {"retry-after": str(RETRY_AFTER_S)})
    finally:
        gone.cancel()
        if not waiter.done():  # left, timed out, or this task was cancelled: nobody reads the answer
            batcher.abandon(job)
            waiter.cancel()


async def disconnected(request: Request) -> None:
    """Returns once the client of ``request`` (whose body has been read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation that failed: Python's MemoryError, torch's
    OutOfMemoryError (a device), or the RuntimeError of torch's CPU allocator."""
    import torch

    return isinstance(err, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(err)


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def cut_short(status: int, message: str, reason: str) -> RequestError:
    """A refusal sent before the body ended: its connection is closed after the answer, so
    the rest of the upload is never waited for."""
    return RequestError(status, message, reason, headers=CLOSE)


def declared_over(declared: str, limit: int) -> bool:
    """Whether a Content-Length of ASCII digits ``declared`` is over ``limit``, however many
    digits it has (never converting thousands of them)."""
    digits = declared.lstrip("0") or "0"
    return len(digits) > len(str(limit)) or (len(digits) == len(str(limit)) and digits > str(limit))


async def read_body(request: Request, limits: Limits, stopping: threading.Event) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limits.max_body_bytes``,
    with 408 when it has not arrived in full ``limits.read_timeout_s`` after the headers,
    and with 503 once ``stopping`` is set and the client has sent nothing for
    ``SHUTDOWN_IDLE_S`` (a stalled upload never holds up shutdown)."""
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and declared_over(declared, limit):
        # not cut_short: the connection stays with the server (uvicorn), which reads and drops the rest of the
        # body (for --read-timeout at most: guarded_protocol), so a client still sending it reads this 413;
        # closing at once reset it, and Python's http.client saw a broken pipe
        digits = declared.lstrip("0")
        size = digits if len(digits) <= 20 else f"a {len(digits)}-digit number of"
        raise RequestError(413, f"body of {size} bytes; at most {limit} (--max-body-bytes)", "body_size")
    chunks, size = [], 0
    deadline = last = time.monotonic()
    deadline += limits.read_timeout_s
    while True:
        now = time.monotonic()
        if now >= deadline:
            raise cut_short(408, f"body not received in full within {limits.read_timeout_s:g} s (--read-timeout)",
                            "read_timeout")
        if stopping.is_set() and now - last >= SHUTDOWN_IDLE_S:
            raise cut_short(503, "the server is stopping; send the request again to the next one", "shutting_down")
        try:
            message = await asyncio.wait_for(request.receive(), min(POLL_S, deadline - now))
        except asyncio.TimeoutError:
            continue
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk, last = message.get("body", b""), time.monotonic()
        size += len(chunk)
        if size > limit:  # without a Content-Length (chunked): the rest is dropped as for a declared size
            raise RequestError(413, f"body over {limit} bytes (--max-body-bytes)", "body_size")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def card_text(card: dict[str, Any]) -> str:
    """The card as ``nmtkit info`` prints it, without colours."""
    from nmtkit.card import print_card

    buffer = io.StringIO()
    print_card(card, file=buffer)
    serving = card.get("serving", {})
    return buffer.getvalue() + "".join(f"serving {key}: {value}\n" for key, value in serving.items())


def serving_card(model_dirs: Sequence[str], options, limits: Limits, window_ms: float, running: str) -> dict[str, Any]:
    """The model card plus how this server runs it (engine, limits, decode defaults); ``running``
    is the engine's own description (device and the dtype it resolved, e.g. ``auto``'s choice, or
    int8's fallback), where ``dtype`` is the one asked for."""
    from nmtkit.card import model_card
    from nmtkit.translate_files import resolve_engine

    card = model_card(model_dirs[0])
    defaults = {f: getattr(options, f) for f in ("beam_size", "nbest", "lenpen", "max_len_a", "max_len_b", "min_len",
                                                 "eos_at_limit", "scores", "alignments", "alignment_units",
                                                 "target_lang")}
    card["serving"] = {"engine": resolve_engine(model_dirs, options.engine), "models": [str(m) for m in model_dirs],
                       "device": options.device, "dtype": options.dtype, "running": running,
                       "batch_tokens": options.batch_tokens, "batch_window_ms": window_ms,
                       "limits": dataclasses.asdict(limits), "defaults": defaults}
    return card


def without_paths(value: Any, key: str = "") -> Any:
    """``value`` (a card) with every filesystem path cut to its last part: the values of the
    keys that hold paths, and any absolute path elsewhere. A server reachable beyond this
    machine does not tell how its disks are laid out."""
    if isinstance(value, dict):
        return {name: without_paths(item, name) for name, item in value.items()}
    if isinstance(value, list):
        return [without_paths(item, key) for item in value]
    if isinstance(value, str) and (key in PATH_KEYS or PurePosixPath(value).is_absolute()
                                   or PureWindowsPath(value).drive):
        return PureWindowsPath(value).name if PureWindowsPath(value).drive else PurePosixPath(value).name
    return value


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port``, or a one-line error (port taken, unknown
    host): a busy port fails before the model loads. It listens at once, as two servers
    started together on one port may both bind it (SO_REUSEADDR) and only one can listen;
    connections made while the model loads wait in the backlog."""
    sock = None
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        if sock is not None:
            sock.close()
        raise NmtkitError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    except ValueError as err:  # a name IDNA cannot encode (an empty or over-long label): UnicodeError
        raise NmtkitError(f"cannot listen on {host}:{port}: not a valid host name ({err})") from None
    return sock


def url_host(host: str) -> str:
    """``host`` as it stands in a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def check_file_limit(max_connections: int) -> None:
    """Room for ``max_connections`` connections (and as many being refused) among the files
    this process may open: the soft limit is raised toward the hard one when short, and a
    ConfigError names both when even that is too few (accept() would fail with EMFILE)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return
    needed = 2 * max_connections + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    try:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise ValueError("over the hard limit")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    except (ValueError, OSError):  # over the hard limit, or over what the kernel allows (fs.nr_open)
        raise ConfigError(f"--max-connections {max_connections} needs about {needed} open files, over this process's "
                          f"limit of {soft} (ulimit -n): give a smaller --max-connections or raise the limit") from None


def serve(model_dirs: Sequence[str], options, limits: Limits, host: str, port: int, window_ms: float,
          console, verbose: bool = False, api_key: Optional[str] = None) -> None:
    """Load the model(s), then answer HTTP requests on ``host:port`` until SIGTERM or Ctrl-C;
    with ``api_key``, only requests that carry it."""
    from nmtkit.runtime.threads import configure_threads
    from nmtkit.translate_files import open_engine

    options.validate()
    limits.check(options.beam_size, **{name: getattr(options, name) for name in ("lenpen", "max_len_a", "max_len_b", "min_len")})
    check_range("serve.batch_window_ms", window_ms, "--batch-window-ms")
    check_range("serve.port", port, "--port")
    api_key = check_key(api_key)
    check_file_limit(limits.max_connections)
    sock = bind(host, port)
    try:
        configure_threads(options.threads, console, what="serving", option="--threads")
        engine = open_engine(model_dirs, options)
        target_tag_for(engine.src_vocab, options.target_lang)  # a --target-lang it lacks: refused, as by translate
        console.detail(f"translating {engine.description}")
        card = serving_card(model_dirs, options, limits, window_ms, engine.description)
        address = sock.getsockname()[0]
        if not is_loopback(address):
            card = without_paths(card)
        stopping = threading.Event()
        batcher = Batcher(engine, options, window_ms / 1000, options.batch_tokens, Metrics(), limits.max_search_bytes,
                          limits.max_queued)
        server = build_server(create_app(batcher, card, limits, api_key, stopping), batcher.metrics, limits,
                              stopping, verbose)
        warning = exposure_warning(address, api_key)
        if warning:
            console.warn(warning)
        console.info(f"serving {model_dirs[0]} ({card['serving']['engine']}) on http://{url_host(host)}:"
                     f"{sock.getsockname()[1]} (SIGTERM or Ctrl-C: finish requests in flight, then stop)"
                     f"{' with an API key' if api_key else ''}", soft_wrap=True)
        interrupted = run_until_stopped(server, sock)
    finally:
        sock.close()
    if batcher.close(WORKER_STOP_S):  # stopped already, unless uvicorn's shutdown never ran
        if interrupted:
            raise KeyboardInterrupt
        return
    # a search that cannot stop midway still runs: leaving with it running aborts in torch's or CTranslate2's
    # threads at exit, so the process ends here
    console.warn("a translation was still running: exiting without it")
    exit_now(130 if interrupted else 0)


def exit_now(code: int) -> None:
    """End the process at once (no interpreter shutdown, which a thread still inside torch or
    CTranslate2 would abort with SIGABRT), its output flushed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def build_server(app: Starlette, metrics: Metrics, limits: Limits, stopping: threading.Event, verbose: bool = False):
    """The uvicorn server for ``app``: its connections held to ``limits`` (``guarded_protocol``),
    ``stopping`` set as its shutdown begins, and signals handled by ``StoppingServer``."""
    import uvicorn

    # no WebSocket upgrades (the app has no such route): an Upgrade header is an ordinary HTTP request
    config = uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=verbose, lifespan="on",
                            http=guarded_protocol(limits, metrics), ws="none", loop="asyncio")
    return stopping_server(config, stopping)


def raw_response(status: int, reason: str, message: str, *headers: str) -> bytes:
    """A whole HTTP/1.1 answer with the JSON body ``{"error": message}`` that closes its
    connection, for what the app never sees (a connection refused, a head that never ended)."""
    body = json.dumps({"error": message}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def guarded_protocol(limits: Limits, metrics: Metrics):
    """uvicorn's h11 protocol, bounded as a network service must be:

    - at most ``limits.max_connections`` connections: one more is answered 503 (JSON, with
      Retry-After) as it connects, read for ``REFUSAL_LINGER_S`` so the client reads the answer
      rather than a reset, then closed;
    - a request head must arrive in full within ``limits.read_timeout_s`` of the connection
      (or of the previous answer): else 408 and the connection closes. uvicorn's own timer is
      cancelled by the first byte, so a client sending a head a byte at a time, or part of one
      and then nothing, held its connection (and a file) forever;
    - a connection that sends nothing is closed after uvicorn's keep-alive timeout, as one idle
      between requests is;
    - HTTP that does not parse (a bad Content-Length, a header over h11's 16 KiB, TLS bytes)
      gets a JSON 400 like every other refusal, not uvicorn's text/plain one.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        lingering = 0  # refused connections not yet closed (one event loop: no lock needed)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.head_timer: Optional[asyncio.TimerHandle] = None
            self.refused = self.lingers = False
            if len(self.connections) > limits.max_connections:
                self.refuse()
                return
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
            self.await_head()

        def refuse(self) -> None:
            self.refused = True
            self.connections.discard(self)  # not a connection the server serves, nor waits for at shutdown
            metrics.reject("connections")
            self.transport.write(raw_response(503, "Service Unavailable",
                                              f"the server has {limits.max_connections} connections open "
                                              "(--max-connections); try again shortly", f"retry-after: {RETRY_AFTER_S}"))
            if Protocol.lingering >= limits.max_connections:  # refusals themselves are bounded too
                self.transport.close()
                return
            Protocol.lingering += 1
            self.lingers = True
            self.loop.call_later(REFUSAL_LINGER_S, self.transport.close)

        def await_head(self) -> None:
            self.stop_head_timer()
            self.head_timer = self.loop.call_later(limits.read_timeout_s, self.head_timed_out)

        def stop_head_timer(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def head_timed_out(self) -> None:
            self.head_timer = None
            if self.transport.is_closing():
                return
            if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:  # part of a head came
                metrics.reject("read_timeout")
                self.transport.write(raw_response(408, "Request Timeout", "request head not received in full within "
                                                  f"{limits.read_timeout_s:g} s (--read-timeout)"))
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.refused:
                return  # read and dropped until the connection closes
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:  # a whole request head arrived
                self.stop_head_timer()

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if self.cycle is cycle and not self.transport.is_closing():  # no pipelined request began
                self.await_head()

        def connection_lost(self, exc) -> None:
            self.stop_head_timer()
            if self.lingers:
                Protocol.lingering -= 1
                self.lingers = False
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            metrics.reject("invalid")
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True  # the app's answer to a request gone bad is not sent
                if self.cycle.response_started:
                    self.transport.close()
                    return
            self.transport.write(raw_response(400, "Bad Request", "not a valid HTTP/1.1 request (its request line, "
                                              "headers or body framing)"))
            self.transport.close()

    return Protocol


def accept_error_handler(interval_s: float = 60.0):
    """An event loop exception handler that reports accept() failing for lack of files or
    memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) in one log line at most every ``interval_s``:
    asyncio logs a traceback for every retry, which filled the log while the server was out
    of descriptors. Everything else goes to the loop's default handler."""
    last = [-float("inf")]

    def handler(loop, context) -> None:
        err = context.get("exception")
        if isinstance(err, OSError) and err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            now = time.monotonic()
            if now - last[0] >= interval_s:
                last[0] = now
                log.error("cannot accept connections: %s (see ulimit -n and --max-connections); new connections wait "
                          "until some close", err.strerror or err)
            return
        loop.default_exception_handler(context)

    return handler


def stopping_server(config, stopping: threading.Event):
    """A uvicorn server that sets ``stopping`` as its shutdown begins, so body reads cut
    uploads that stalled instead of holding the shutdown until their clients leave. The
    first SIGTERM or SIGINT stops it gracefully (``stopped_by`` says which); a second one
    ends the process at once with one line (exit 128 + the signal: a translation in flight
    holds no lock worth waiting for, and stopping Python around it aborted in torch)."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: Optional[int] = None

        async def startup(self, sockets=None) -> None:
            asyncio.get_running_loop().set_exception_handler(accept_error_handler())
            await super().startup(sockets)

        async def shutdown(self, sockets=None) -> None:
            stopping.set()
            await super().shutdown(sockets)

        @contextlib.contextmanager
        def capture_signals(self):
            """uvicorn's, less its re-raising of the signal afterwards: ``run_until_stopped``
            says how the process ends."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig: int, frame) -> None:
            if self.stopped_by is not None:
                print(f"nmtkit: stopped at once by a second signal ({signal.Signals(sig).name}); requests in flight "
                      "were dropped", file=sys.stderr)
                exit_now(128 + sig)
            self.stopped_by = sig
            self.should_exit = True

    return Server(config)


def run_until_stopped(server, sock: socket.socket) -> bool:
    """Run uvicorn on ``sock`` until it stops; whether Ctrl-C (SIGINT) stopped it, as the
    caller then reports an interruption, where SIGTERM is a requested stop (exit 0)."""
    server.run(sockets=[sock])
    return server.stopped_by == signal.SIGINT
