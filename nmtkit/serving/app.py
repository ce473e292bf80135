"""The HTTP side of ``nmtkit serve``: a Starlette app that checks requests and hands them
to the batcher, and ``serve`` that loads the model and runs it under uvicorn.

    POST /translate   {"texts": [...], "beam_size": 4, "scores": true, ...}  -> {"translations": [...], ...}
                      (optional "prefixes": a string per text, "constraints": a list of phrases per text,
                      "target_lang": a multilingual model's language to translate into)
    GET  /health      status and counters (requests, lines, batches, queued)
    GET  /info        the model card of ``nmtkit info`` (its "target_languages" too; ?format=text for the table)

Every refusal is a JSON object ``{"error": "..."}`` with a 4xx status; a failed translation
is a 500 and the server goes on. SIGTERM (or Ctrl-C) stops accepting connections, answers
the requests in flight, then exits.
"""
from __future__ import annotations

import asyncio
import dataclasses
import io
import signal
import socket
from contextlib import asynccontextmanager
from typing import Any, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from nmtkit.decoding.translate import target_tag_for
from nmtkit.errors import ConfigError, NmtkitError
from nmtkit.limits import check_range
from nmtkit.serving.batcher import Batcher
from nmtkit.serving.requests import LANGUAGE_FIELD, Limits, RequestError, parse_request


def create_app(batcher: Batcher, card: dict[str, Any], limits: Limits) -> Starlette:
    """The app around a running ``batcher``; its shutdown waits for the batcher's jobs."""

    async def translate(request: Request) -> Response:
        try:
            body = await read_body(request, limits.max_body_bytes)
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
        return JSONResponse(await asyncio.wrap_future(batcher.submit(parsed.texts, parsed.decode, parsed.guides)))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", **batcher.stats()})

    async def info(request: Request) -> Response:
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

    handlers = {RequestError: refusal, HTTPException: http_error, Exception: failure}
    routes = [Route("/translate", translate, methods=["POST"]), Route("/health", health, methods=["GET"]),
              Route("/info", info, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"body of {int(declared)} bytes; at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def refusal(request: Request, err: RequestError) -> Response:
    return JSONResponse({"error": str(err)}, status_code=err.status)


async def http_error(request: Request, err: HTTPException) -> Response:
    return JSONResponse({"error": err.detail}, status_code=err.status_code, headers=err.headers)


async def failure(request: Request, err: Exception) -> Response:
    return JSONResponse({"error": f"translation failed: {type(err).__name__}: {err}"}, status_code=500)


def card_text(card: dict[str, Any]) -> str:
    """The card as ``nmtkit info`` prints it, without colours."""
    from nmtkit.card import print_card

    buffer = io.StringIO()
    print_card(card, file=buffer)
    serving = card.get("serving", {})
    return buffer.getvalue() + "".join(f"serving {key}: {value}\n" for key, value in serving.items())


def serving_card(model_dirs: Sequence[str], options, limits: Limits, window_ms: float) -> dict[str, Any]:
    """The model card plus how this server runs it (engine, limits, decode defaults)."""
    from nmtkit.card import model_card
    from nmtkit.translate_files import resolve_engine

    card = model_card(model_dirs[0])
    defaults = {f: getattr(options, f) for f in ("beam_size", "nbest", "lenpen", "max_len_a", "max_len_b", "min_len",
                                                 "scores", "alignments", "alignment_units", "target_lang")}
    card["serving"] = {"engine": resolve_engine(model_dirs, options.engine), "models": [str(m) for m in model_dirs], "device": options.device,
                       "dtype": options.dtype, "batch_tokens": options.batch_tokens, "batch_window_ms": window_ms,
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
          console, verbose: bool = False) -> None:
    """Load the model(s), then answer HTTP requests on ``host:port`` until SIGTERM or Ctrl-C."""
    import uvicorn

    from nmtkit.translate_files import open_engine

    options.validate()
    limits.check(options.beam_size, **{name: getattr(options, name) for name in ("lenpen", "max_len_a", "max_len_b", "min_len")})
    check_range("serve.batch_window_ms", window_ms, "--batch-window-ms")
    check_range("serve.port", port, "--port")
    sock = bind(host, port)
    try:
        engine = open_engine(model_dirs, options)
        target_tag_for(engine.src_vocab, options.target_lang)  # a --target-lang it lacks: refused, as by translate
        console.detail(f"translating {engine.description}")
        card = serving_card(model_dirs, options, limits, window_ms)
        sock.listen(2048)  # from here connections wait in the backlog until uvicorn accepts them
        app = create_app(Batcher(engine, options, window_ms / 1000, options.batch_tokens), card, limits)
        config = uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=verbose, lifespan="on")
        console.info(f"serving {model_dirs[0]} ({card['serving']['engine']}) on http://{host}:{sock.getsockname()[1]} "
                     "(SIGTERM or Ctrl-C: finish requests in flight, then stop)", soft_wrap=True)
        run_until_stopped(uvicorn.Server(config), sock)
    finally:
        sock.close()


def run_until_stopped(server, sock: socket.socket) -> None:
    """Run uvicorn on ``sock``. It re-raises the signal it stopped on once it has shut down;
    a SIGTERM is a requested stop, so it ends here (exit 0) instead of killing the process."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
