"""The HTTP side of ``nmtkit serve``: a Starlette app that checks requests and hands them
to the batcher, and ``serve`` that loads the model and runs it under uvicorn.

    POST /translate   {"texts": [...], "beam_size": 4, "scores": true, ...}  -> {"translations": [...], ...}
                      (optional "prefixes": a string per text, "constraints": a list of phrases per text,
                      "target_lang": a multilingual model's language to translate into)
    GET  /health      status and counters (requests, lines, batches, queued)
    GET  /info        the model card of ``nmtkit info`` (its "target_languages" too; ?format=text for the table)
    GET  /metrics     counters and histograms in Prometheus's text format (``metrics.py``)

Every refusal is a JSON object ``{"error": "..."}`` with a 4xx status (503 while stopping);
a failed translation is a 500 and the server goes on. A request is checked whole (key, body,
schema, estimated memory) before it is queued. A body must arrive within the read timeout;
SIGTERM (or Ctrl-C) stops accepting connections, cuts uploads that have stalled, answers the
requests in flight, then exits.
"""
from __future__ import annotations

import asyncio
import dataclasses
import io
import signal
import socket
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, Optional, Sequence

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
from nmtkit.serving.batcher import Batcher
from nmtkit.serving.metrics import CONTENT_TYPE, Metrics
from nmtkit.serving.requests import LANGUAGE_FIELD, Limits, RequestError, parse_request

POLL_S = 0.25  # how often a body read looks at the clock and at the stop flag
SHUTDOWN_IDLE_S = 1.0  # once stopping, an upload that sent nothing for this long is cut
CLOSE = {"connection": "close"}  # a refusal before the whole body arrived ends the connection


def create_app(batcher: Batcher, card: dict[str, Any], limits: Limits, api_key: Optional[str] = None,
               stopping: Optional[threading.Event] = None) -> Starlette:
    """The app around a running ``batcher`` (whose ``metrics`` it adds to); every route needs
    ``api_key`` when one is given; ``stopping`` is set when shutdown begins (uvicorn's, in
    ``serve``). Its shutdown waits for the batcher's jobs."""
    metrics, stopping = batcher.metrics, stopping or threading.Event()

    async def translate(request: Request) -> Response:
        started = time.monotonic()
        authorize(request.headers, api_key)
        try:
            body = await read_body(request, limits, stopping)
        except ClientDisconnect:
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
        shape = admit(batcher.engine, batcher.base, limits, parsed.texts, parsed.decode, parsed.guides)
        try:
            answer = await asyncio.wrap_future(batcher.submit(parsed.texts, parsed.decode, parsed.guides, shape))
        except NmtkitError as err:  # a refusal from the translator itself: the request's fault, not the server's
            raise RequestError(400, str(err)) from None
        except (MemoryError, RuntimeError) as err:  # what the estimate did not foresee (other processes' memory)
            if not out_of_memory(err):
                raise
            raise RequestError(503, "the server ran out of memory translating this request; send fewer or shorter "
                                    "texts, or try again later", "out_of_memory") from None
        metrics.answered(len(parsed.texts), time.monotonic() - started)
        return JSONResponse(answer)

    async def health(request: Request) -> Response:
        authorize(request.headers, api_key)
        return JSONResponse({"status": "ok", **batcher.stats()})

    async def metrics_text(request: Request) -> Response:
        authorize(request.headers, api_key)
        return Response(metrics.text(batcher.stats()["queued"]), media_type=CONTENT_TYPE)

    async def info(request: Request) -> Response:
        authorize(request.headers, api_key)
        form = request.query_params.get("format", "json")
        if form == "json":
            return JSONResponse(card)
        if form == "text":
            return PlainTextResponse(card_text(card))
        raise RequestError(400, f"format must be json or text, not {form!r}")

    @asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        await asyncio.to_thread(batcher.close)  # uvicorn has drained the connections by now

    routes = [Route("/translate", translate, methods=["POST"]), Route("/health", health, methods=["GET"]),
              Route("/info", info, methods=["GET"]), Route("/metrics", metrics_text, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers=error_handlers(metrics), lifespan=lifespan)


def error_handlers(metrics: Metrics) -> dict:
    """JSON answers for refusals (counted by reason), unknown routes and methods, and
    failed translations (500, counted)."""

    async def refusal(request: Request, err: RequestError) -> Response:
        metrics.reject(err.reason)
        return JSONResponse({"error": str(err)}, status_code=err.status, headers=err.headers)

    async def http_error(request: Request, err: HTTPException) -> Response:
        metrics.reject("route")
        return JSONResponse({"error": err.detail}, status_code=err.status_code, headers=err.headers)

    async def failure(request: Request, err: Exception) -> Response:
        metrics.failed_request()
        return JSONResponse({"error": f"translation failed: {type(err).__name__}: {err}"}, status_code=500)

    return {RequestError: refusal, HTTPException: http_error, Exception: failure}


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation that failed: Python's MemoryError, torch's
    OutOfMemoryError (a device), or the RuntimeError of torch's CPU allocator."""
    import torch

    return isinstance(err, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(err)


def cut_short(status: int, message: str, reason: str) -> RequestError:
    """A refusal sent before the body ended: its connection is closed after the answer, so
    the rest of the upload is never waited for."""
    return RequestError(status, message, reason, headers=CLOSE)


async def read_body(request: Request, limits: Limits, stopping: threading.Event) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limits.max_body_bytes``,
    with 408 when it has not arrived in full ``limits.read_timeout_s`` after the headers,
    and with 503 once ``stopping`` is set and the client has sent nothing for
    ``SHUTDOWN_IDLE_S`` (a stalled upload never holds up shutdown)."""
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and len(declared) < 20 and int(declared) > limit:
        # not cut_short: the connection stays with the server (uvicorn), so a client still sending
        # the body reads this 413; closing at once reset it, and Python's http.client saw a broken pipe
        raise RequestError(413, f"body of {int(declared)} bytes; at most {limit} (--max-body-bytes)", "body_size")
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
        if size > limit:
            raise cut_short(413, f"body over {limit} bytes (--max-body-bytes)", "body_size")
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


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening), or a one-line error (port
    taken, unknown host): a busy port fails before the model loads."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as err:
        raise NmtkitError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    except ValueError as err:  # a name IDNA cannot encode (an empty or over-long label): UnicodeError
        raise NmtkitError(f"cannot listen on {host}:{port}: not a valid host name ({err})") from None
    return sock


def serve(model_dirs: Sequence[str], options, limits: Limits, host: str, port: int, window_ms: float,
          console, verbose: bool = False, api_key: Optional[str] = None) -> None:
    """Load the model(s), then answer HTTP requests on ``host:port`` until SIGTERM or Ctrl-C;
    with ``api_key``, only requests that carry it."""
    import uvicorn

    from nmtkit.runtime.threads import configure_threads
    from nmtkit.translate_files import open_engine

    options.validate()
    limits.check(options.beam_size, **{name: getattr(options, name) for name in ("lenpen", "max_len_a", "max_len_b", "min_len")})
    check_range("serve.batch_window_ms", window_ms, "--batch-window-ms")
    check_range("serve.port", port, "--port")
    api_key = check_key(api_key)
    sock = bind(host, port)
    try:
        configure_threads(options.threads, console, what="serving", option="--threads")
        engine = open_engine(model_dirs, options)
        target_tag_for(engine.src_vocab, options.target_lang)  # a --target-lang it lacks: refused, as by translate
        console.detail(f"translating {engine.description}")
        card = serving_card(model_dirs, options, limits, window_ms, engine.description)
        sock.listen(2048)  # from here connections wait in the backlog until uvicorn accepts them
        stopping = threading.Event()
        batcher = Batcher(engine, options, window_ms / 1000, options.batch_tokens, Metrics(), limits.max_search_bytes)
        app = create_app(batcher, card, limits, api_key, stopping)
        config = uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=verbose, lifespan="on",
                                http=idle_closing())
        warning = exposure_warning(sock.getsockname()[0], api_key)
        if warning:
            console.warn(warning)
        console.info(f"serving {model_dirs[0]} ({card['serving']['engine']}) on http://{host}:{sock.getsockname()[1]} "
                     f"(SIGTERM or Ctrl-C: finish requests in flight, then stop){' with an API key' if api_key else ''}",
                     soft_wrap=True)
        run_until_stopped(stopping_server(config, stopping), sock)
    finally:
        sock.close()


def idle_closing():
    """uvicorn's HTTP protocol, except that a connection which sends nothing is closed after
    uvicorn's keep-alive timeout, as a connection idle between requests already is (uvicorn
    starts that timer only after a first answer, so a silent client held its connection)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    if not hasattr(AutoHTTPProtocol, "timeout_keep_alive_handler"):
        return AutoHTTPProtocol

    class Protocol(AutoHTTPProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            # cancelled by the protocol as soon as any byte arrives, like the timer between requests
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    return Protocol


def stopping_server(config, stopping: threading.Event):
    """A uvicorn server that sets ``stopping`` as its shutdown begins, so body reads cut
    uploads that stalled instead of holding the shutdown until their clients leave."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            stopping.set()
            await super().shutdown(sockets)

    return Server(config)


def run_until_stopped(server, sock: socket.socket) -> None:
    """Run uvicorn on ``sock``. It re-raises the signal it stopped on once it has shut down;
    a SIGTERM is a requested stop, so it ends here (exit 0) instead of killing the process."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
