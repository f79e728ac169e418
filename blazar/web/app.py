"""``create_app(runtime)``: the HTTP gateway on quart-trio.

Every error — ours, the framework's (unknown route, wrong method, bad JSON)
and the unexpected — answers in JSON in the caller's dialect with a
``blazar_code``. Streams are never cut by a framework timeout.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import time
from typing import Any

import httpx
import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from actors.engine import EnsureReady
from actors.errors import BlazarRuntimeError
from actors.ledger import LedgerActor, RequestRecord, read_requests, record_nowait
from actors.runtime import Runtime
from blazar import __version__
from blazar.config import Config
from blazar.dialects.neutral import DecodeError
from blazar.errors import CATALOG, BlazarError, error_body
from blazar.web import anthropic as web_anthropic
from blazar.web import capacity as web_capacity
from blazar.web import lifecycle_routes as web_lifecycle
from blazar.web import ollama as web_ollama
from blazar.web import openai as web_openai
from blazar.web.cards import INFERENCE_PATHS, Card, Cards, CardState, CardView
from blazar.web.common import JSON, Cleanup, dialect_for, error_response
from blazar.web.relay import crash_error
from registry.errors import RegistryError

__all__ = ["GatewayMiddleware", "create_app", "serve_app"]

log = logging.getLogger("blazar.web")

_HTTP_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "PAYLOAD_TOO_LARGE", 400: "BAD_REQUEST"}
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "[::1]", "::1"}


class GatewayMiddleware:
    """The ASGI layer around the app: trace ids, per-request cleanups, drain, ledger.

    A client can disconnect between the handler returning a streaming body and
    the server starting to send it; the body is then never iterated nor closed.
    Cleanups registered in the request scope run in every case, shielded. Each
    finished request is recorded in the ledger without ever waiting on it.
    """

    def __init__(self, app: Any, ledger: LedgerActor | None = None, cards: Cards | None = None) -> None:
        self.app = app
        self.ledger = ledger
        self.cards = cards if cards is not None else Cards()
        self.in_flight = 0
        self._idle = trio.Event()
        self._idle.set()
        self._boot = secrets.token_hex(3)
        self._seq = itertools.count(1)

    async def wait_idle(self) -> None:
        """Return once no HTTP request is being handled (used to drain on shutdown)."""
        await self._idle.wait()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cleanups: list[Cleanup] = []
        scope["blazar.cleanups"] = cleanups
        scope["blazar.trace_id"] = trace_id = f"blz-{self._boot}-{next(self._seq)}"
        card: Card | None = None
        if scope["method"] == "POST" and scope["path"] in INFERENCE_PATHS:
            card = scope["blazar.card"] = self.cards.open(trace_id, scope["path"])
        started_at, t0 = time.time(), time.perf_counter()
        status = 0
        first_body_s: float | None = None
        sent = 0
        response_started = response_done = disconnected = False
        headers = dict(scope.get("headers") or [])
        body_done = headers.get(b"content-length", b"0") == b"0" and b"transfer-encoding" not in headers

        async def tracked_receive() -> dict[str, Any]:
            nonlocal body_done, disconnected
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_done = True
            elif message["type"] == "http.disconnect":
                disconnected = True
            return message

        async def tracked_send(message: dict[str, Any]) -> None:
            nonlocal status, first_body_s, sent, response_started, response_done
            if message["type"] == "http.response.start":
                status = message["status"]
                response_started = True
                if not body_done:
                    # Answered before reading the whole body (an error): the rest of it
                    # would be taken for the next request, so this connection must end.
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if body:
                    if first_body_s is None:
                        first_body_s = time.perf_counter() - t0
                    if card is not None:
                        card.first_byte_s = card.first_byte_s or time.perf_counter()
                        card.chunks += 1
                        card.bytes_out += len(body)
                sent += len(body)
                response_done = not message.get("more_body", False)
            # Shielded: a cancel from another connection (or the app's own nursery)
            # must not land inside the server's send. Hypercorn recycles a
            # keep-alive connection from within the final send; cancelled there, the
            # connection stays open but never reads the client's next request.
            with trio.CancelScope(shield=True):
                await send(message)

        self.in_flight += 1
        if self._idle.is_set():
            self._idle = trio.Event()
        try:
            if card is None:
                await self.app(scope, tracked_receive, tracked_send)
            else:
                with card.scope:
                    await self.app(scope, tracked_receive, tracked_send)
                if card.ended_by is not None and not disconnected:
                    with trio.CancelScope(shield=True), trio.move_on_after(5.0):
                        await self._end_from_outside(scope, card, send, response_started, response_done)
                        status = status or 499
        finally:
            with trio.CancelScope(shield=True):
                for fn in reversed(cleanups):
                    with trio.move_on_after(5.0):
                        await fn()
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()
            if card is not None:
                card.model = scope.get("blazar.model")
                self.cards.close(card, status=status or 499, disconnected=disconnected)
            if self.ledger is not None:
                client = scope.get("client")
                record_nowait(
                    self.ledger,
                    RequestRecord(
                        trace_id=trace_id,
                        started_at=started_at,
                        method=scope["method"],
                        path=scope["path"],
                        model=scope.get("blazar.model"),
                        status=status or 499,  # nothing sent: the client went away first
                        duration_ms=(time.perf_counter() - t0) * 1000,
                        ttft_ms=first_body_s * 1000 if first_body_s is not None else None,
                        blazar_code=scope.get("blazar.code"),
                        bytes_out=sent,
                        client=client[0] if client else None,
                    ),
                )

    async def _end_from_outside(
        self, scope: dict[str, Any], card: Card, send: Any, started: bool, done: bool
    ) -> None:
        """Finish a request cancelled or interrupted from another connection."""
        if not started:
            headers = {k.decode("latin1").lower(): v.decode("latin1") for k, v in scope.get("headers") or []}
            body = msgspec.json.encode(
                error_body(
                    dialect_for(scope["path"], headers),
                    "CLIENT_CLOSED_REQUEST",
                    f"request {card.trace_id} was {card.ended_by} from another connection: {card.reason}",
                )
            )
            scope["blazar.code"] = "CLIENT_CLOSED_REQUEST"
            await send(
                {
                    "type": "http.response.start",
                    "status": 499,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body, "more_body": False})
        elif not done:
            tail = b""
            if card.enders is not None:
                tail = (
                    card.enders.interrupted()
                    if card.ended_by is CardState.INTERRUPTED
                    else card.enders.cancelled()
                )
            await send({"type": "http.response.body", "body": tail, "more_body": False})


_LOCAL_SCHEMES = ("app://", "file://", "tauri://", "vscode-webview://", "vscode-file://")


def _local_origin(origin: str) -> bool:
    if origin == "null" or origin.startswith(_LOCAL_SCHEMES):
        return origin != "null"
    host = origin.split("://", 1)[-1].rstrip("/")
    return _host_name(host).lower() in _LOOPBACK_NAMES


def _is_loopback_bind(host: str) -> bool:
    return host in _LOOPBACK_NAMES or host.startswith("127.")


def _host_name(header: str) -> str:
    if header.startswith("["):
        return header.split("]")[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def serve_app(runtime: Runtime, config: Config) -> GatewayMiddleware:
    """The ASGI application hypercorn serves: the app inside the gateway layer."""
    cards = Cards()
    return GatewayMiddleware(create_app(runtime, config, cards=cards), runtime.ledger, cards)


def create_app(runtime: Runtime, config: Config, *, cards: Cards | None = None) -> QuartTrio:
    cards = cards if cards is not None else Cards()
    app = QuartTrio("blazar")
    app.config.update(
        RESPONSE_TIMEOUT=None,  # long generations must not be cut
        BODY_TIMEOUT=60,
        MAX_CONTENT_LENGTH=None,  # enforced while reading, chunked bodies included
        PROVIDE_AUTOMATIC_OPTIONS=True,
    )
    max_body = int(config.max_body_mb * 1024 * 1024)
    allowed_hosts = _LOOPBACK_NAMES | {h.lower() for h in config.allowed_hosts}
    guard_host = _is_loopback_bind(config.host)

    # -- cross-cutting ----------------------------------------------------

    @app.before_request
    async def _before() -> Response | None:
        request.scope["blazar.max_body"] = max_body  # type: ignore[typeddict-unknown-key]
        if guard_host:
            host = _host_name(request.headers.get("Host", "").strip().lower())
            if host and host not in allowed_hosts:
                return error_response(
                    "HOST_FORBIDDEN",
                    f"Host '{host}' is not allowed on a loopback-bound daemon; call it as 127.0.0.1 or "
                    "localhost, or add the name to `allowed_hosts` in config.toml",
                )
            origin = request.headers.get("Origin")
            if origin and not _local_origin(origin):
                # Browsers send Origin on cross-site requests: a web page must not drive the daemon.
                return error_response(
                    "HOST_FORBIDDEN",
                    f"requests from the web origin {origin} are refused: only local clients may call",
                )
        return None

    @app.after_request
    async def _after(resp: Response) -> Response:
        trace = request.scope.get("blazar.trace_id")
        if trace:
            resp.headers["x-blazar-trace-id"] = trace
        return resp

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        code = _HTTP_CODES.get(status, "BAD_REQUEST" if status < 500 else "INTERNAL")
        if status == 404:
            message = f"no route {request.method} {request.path} — see docs/api.md for the routes"
        elif status == 405:
            message = f"{request.path} does not accept {request.method}"
        else:
            message = exc.description or exc.name
        return error_response(code, message)

    @app.errorhandler(BlazarError)
    async def _blazar_error(exc: BlazarError) -> Response:
        return error_response(exc.code, exc.message, retry_after_s=exc.retry_after_s)

    @app.errorhandler(DecodeError)
    async def _decode_error(exc: DecodeError) -> Response:
        return error_response(exc.code, exc.message)

    @app.errorhandler(RegistryError)
    async def _registry_error(exc: RegistryError) -> Response:
        return error_response(exc.code if exc.code in CATALOG else "BAD_REQUEST", exc.message)

    @app.errorhandler(BlazarRuntimeError)
    async def _runtime_error(exc: BlazarRuntimeError) -> Response:
        code = exc.code if exc.code in CATALOG else "INTERNAL"
        return error_response(code, exc.message, retry_after_s=getattr(exc, "retry_after_s", None))

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        trace = request.scope.get("blazar.trace_id", "?")
        log.exception("unhandled error in %s %s (%s)", request.method, request.path, trace)
        return error_response("INTERNAL", f"internal error ({type(exc).__name__}); trace id {trace}")

    # -- native -----------------------------------------------------------

    @app.get("/health")
    @app.get("/healthz")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "version": __version__}

    @app.get("/api/errors")
    async def errors() -> Response:
        return Response(
            msgspec.json.encode({"object": "list", "data": list(CATALOG.values())}), content_type=JSON
        )

    @app.get("/admin/engines")
    async def admin_engines() -> Response:
        return Response(msgspec.json.encode(runtime.statistics()), content_type=JSON)

    @app.get("/admin/engines/<path:name>/slots")
    async def admin_slots(name: str) -> Response:
        """The engine's own view of its slots (llama.cpp ``/slots``), for diagnostics."""
        engine = await runtime.engine_for(name)
        handle = await engine.ask(EnsureReady())
        try:
            upstream = await handle.client.get("/slots", timeout=10.0)
        except httpx.HTTPError as exc:
            raise await crash_error(engine, handle, exc) from exc
        return Response(upstream.content, upstream.status_code, content_type=JSON)

    @app.get("/admin/requests")
    async def admin_requests() -> Response:
        """The most recent finished requests from the ledger, newest first."""
        limit = min(max(request.args.get("limit", 50, type=int) or 50, 1), 1000)
        records = await trio.to_thread.run_sync(
            lambda: read_requests(runtime.ledger.path, limit=limit, trace_id=request.args.get("trace_id"))
        )
        return Response(msgspec.json.encode({"object": "list", "data": records}), content_type=JSON)

    # -- live requests ----------------------------------------------------

    def card_view(card: Card) -> CardView:
        position = None
        if card.state is CardState.QUEUED and card.model and card.waiter_id is not None:
            position = runtime.admission.position(card.model, card.waiter_id)
        return card.view(position)

    def find_card(card_id: str) -> Card:
        card = cards.get(card_id)
        if card is None:
            raise BlazarError("NOT_FOUND", f"no request {card_id} — see GET /v1/requests for the live ones")
        return card

    @app.get("/v1/requests")
    async def list_requests() -> Response:
        model, state = request.args.get("model"), request.args.get("state")
        views = [
            card_view(c)
            for c in cards.all()
            if (model is None or c.model == model) and (state is None or c.state == state)
        ]
        return Response(msgspec.json.encode({"object": "list", "data": views}), content_type=JSON)

    @app.get("/v1/requests/<card_id>")
    async def get_request(card_id: str) -> Response:
        return Response(msgspec.json.encode(card_view(find_card(card_id))), content_type=JSON)

    @app.post("/v1/requests/<card_id>/cancel")
    async def cancel_request(card_id: str) -> Response:
        card = find_card(card_id)
        ended = card.end_from_outside(CardState.CANCELLED, "cancelled by POST /v1/requests/{id}/cancel")
        return Response(msgspec.json.encode({"id": card_id, "cancelled": ended}), content_type=JSON)

    @app.post("/v1/requests/<card_id>/interrupt")
    async def interrupt_request(card_id: str) -> Response:
        card = find_card(card_id)
        ended = card.end_from_outside(
            CardState.INTERRUPTED, "interrupted by POST /v1/requests/{id}/interrupt"
        )
        return Response(msgspec.json.encode({"id": card_id, "interrupted": ended}), content_type=JSON)

    @app.post("/admin/models/<path:name>/unload")
    async def admin_unload(name: str) -> dict[str, Any]:
        return {"model": name, "unloaded": await runtime.lifecycle.unload(name)}

    @app.post("/admin/models/<path:name>/forget")
    async def admin_forget(name: str) -> dict[str, Any]:
        """Stop and drop the engine of a model whose file was removed or replaced."""
        await runtime.forget(name)
        return {"model": name, "forgotten": True}

    @app.post("/admin/shutdown")
    async def admin_shutdown() -> dict[str, Any]:
        app.config["BLAZAR_SHUTDOWN"].set()
        return {"status": "stopping", "pid": os.getpid()}

    web_openai.register(app, runtime)
    web_anthropic.register(app, runtime)
    web_ollama.register(app, runtime)
    web_lifecycle.register(app, runtime)
    web_capacity.register(app, runtime)
    return app
