"""The gateway layer: the ASGI application the HTTP server runs, around the Quart app.

For every request it makes the ``Call`` (trace id, live card, cleanups), refuses
foreign hosts and origins, checks the API key and its limits (``blazar.web.middleware.auth``),
stamps ``x-blazar-trace-id`` on the answer, runs the request inside its card's
cancel scope, runs its cleanups however it ends, and records it in the ledger
without waiting. The hot inference routes (``Routes``) it serves itself, straight
on ASGI: a relayed request there costs a fraction of what a trip through the
framework's request and response objects does
(BENCHMARK.md). Every other route goes to the Quart app.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import trio

from actors.ledger import LedgerActor, RequestRecord
from blazar.errors import CATALOG, BlazarError, error_body
from blazar.scrub import scrub
from blazar.telemetry.observer import Telemetry, dialect_label
from blazar.web.call import Call, Handler, Reply, Routes
from blazar.web.cards import INFERENCE_PATHS, Card, Cards, CardState
from blazar.web.common import dialect_for, error_reply, exception_reply
from blazar.web.middleware.auth import Auth
from blazar.web.middleware.cors import LOOPBACK_NAMES, CorsPolicy, expose_header, host_name, local_origin
from blazar.web.middleware.tracing import RequestTracer

__all__ = ["JOB_ROUTE", "GatewayMiddleware", "HostGuard"]

log = logging.getLogger("blazar.web")

_DEFAULT_MAX_BODY = 50 * 1024 * 1024
_BODY_TIMEOUT_S = 60.0
JOB_ROUTE = "job:/v1/responses"
"""The ``route`` label of a background response's own facts (its job, not its HTTP request)."""
_ANSWER_KEEP = 256 * 1024
_KEY_PROTOCOL = "openai-insecure-api-key."
"""The most reply bytes kept for an audit log that records answers."""


class HostGuard:
    """A daemon bound to loopback answers only local names and local origins: a web
    page (which sends ``Origin``) or a DNS-rebound name must not drive it. Origins that
    ``cors`` grants (``cors_origins``) may call; their ``Host`` must still be local."""

    def __init__(self, allowed_hosts: Iterable[str] = (), cors: CorsPolicy | None = None) -> None:
        self.allowed = LOOPBACK_NAMES | {h.lower() for h in allowed_hosts}
        self.cors = cors

    @staticmethod
    def applies_to(bind_host: str) -> bool:
        return bind_host in LOOPBACK_NAMES or bind_host.startswith("127.")

    def refusal(self, headers: Mapping[str, str]) -> BlazarError | None:
        host = host_name(headers.get("host", "").strip().lower())
        if host and host not in self.allowed:
            return BlazarError(
                "HOST_FORBIDDEN",
                f"Host '{host}' is not allowed on a loopback-bound daemon; call it as 127.0.0.1 or "
                "localhost, or add the name to `allowed_hosts` in config.toml",
            )
        origin = headers.get("origin")
        if origin and not local_origin(origin) and not (self.cors is not None and self.cors.grants(origin)):
            return BlazarError(
                "HOST_FORBIDDEN",
                f"requests from the web origin {origin} are refused: only local clients may call "
                "(an operator can list the origin in `cors_origins` in config.toml)",
            )
        return None


class _ClientGone(Exception):
    """The client disconnected while its request body was being read."""


class GatewayMiddleware:
    """The ASGI layer around the app: calls, host guard, cleanups, drain, ledger, own routes.

    A client can disconnect between the handler returning a streaming body and
    the server starting to send it; the body is then never iterated nor closed.
    Cleanups registered on the ``Call`` run in every case, shielded. Each
    finished request is recorded in the ledger without ever waiting on it.
    """

    def __init__(
        self,
        app: Any,
        ledger: LedgerActor | None = None,
        cards: Cards | None = None,
        *,
        routes: Routes | None = None,
        guard: HostGuard | None = None,
        auth: Auth | None = None,
        max_body: int = _DEFAULT_MAX_BODY,
        tracer: RequestTracer | None = None,
        telemetry: Telemetry | None = None,
        cors: CorsPolicy | None = None,
    ) -> None:
        self.app = app
        self.telemetry = telemetry
        self.ledger = ledger
        self.cards = cards if cards is not None else Cards()
        self.routes = routes if routes is not None else Routes()
        self.guard = guard
        self.auth = auth
        self.max_body = max_body
        self.tracer = tracer
        self.cors = cors if cors is not None else CorsPolicy()
        self.in_flight = 0
        self._idle = trio.Event()
        self._idle.set()
        self._boot = secrets.token_hex(3)
        self._seq = itertools.count(1)

    async def wait_idle(self) -> None:
        """Return once no HTTP request is being handled (used to drain on shutdown)."""
        await self._idle.wait()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        trace_id = f"blz-{self._boot}-{next(self._seq)}"
        path, method = scope["path"], scope["method"]
        card: Card | None = None
        if method == "POST" and path in INFERENCE_PATHS:
            card = self.cards.open(trace_id, path)
        call = Call(scope, trace_id=trace_id, max_body=self.max_body, card=card)
        stamp = [(b"x-blazar-trace-id", trace_id.encode())]
        tracer, span = self.tracer, None
        if tracer is not None:
            span = tracer.begin(method, path, call.headers, trace_id)
            stamp.append((b"traceparent", tracer.traceparent(span)))
        started_at, t0 = time.time(), time.perf_counter()
        status = 0
        first_body_s: float | None = None
        sent = 0
        response_started = response_done = disconnected = False
        body_done = call.headers.get("content-length", "0") == "0" and "transfer-encoding" not in call.headers
        # The reply's bytes, kept only for an audit log that records answers.
        answer: list[bytes] | None = (
            [] if card is not None and self.telemetry and self.telemetry.wants_text else None
        )
        origin = call.headers.get("origin")
        grant = self.cors.actual(origin) if origin else None  # None for every non-browser client

        early: list[dict[str, Any]] = []  # read while waiting in the auth step, for the app

        async def tracked_receive() -> dict[str, Any]:
            return early.pop(0) if early else await receive_tracking()

        async def receive_tracking() -> dict[str, Any]:
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
                headers = [*message.get("headers", ()), *stamp]
                if grant is not None:
                    headers += [*grant, expose_header(headers)]
                if not body_done:
                    # Answered before reading the whole body (an error): the rest of it
                    # would be taken for the next request, so this connection must end.
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if body:
                    if first_body_s is None:
                        first_body_s = time.perf_counter() - t0
                    if card is not None:
                        card.first_byte_s = card.first_byte_s or time.perf_counter()
                        card.chunks += 1
                        card.bytes_out += len(body)
                        if answer is not None and card.bytes_out <= _ANSWER_KEEP:
                            answer.append(body)
                sent += len(body)
                response_done = not message.get("more_body", False)
            # Shielded: a cancel from another connection (or the app's own nursery)
            # must not land inside the server's send. Hypercorn recycles a
            # keep-alive connection from within the final send; cancelled there, the
            # connection stays open but never reads the client's next request.
            with trio.CancelScope(shield=True):
                await send(message)

        async def client_gone() -> None:
            """Return once the client disconnects; keep what arrives before for the app."""
            while True:
                message = await receive_tracking()
                if message["type"] == "http.disconnect":
                    return
                early.append(message)

        self.in_flight += 1
        if self._idle.is_set():
            self._idle = trio.Event()
        try:
            with call:
                refusal = self.guard.refusal(call.headers) if self.guard is not None else None
                if refusal is None and self.auth is not None:
                    refusal = await self.auth.enter(call, client_gone)
                handler = self.routes.post.get(path)
                if handler is not None and method != "POST" and path in self.routes.shared:
                    handler = None  # the app serves this path's other methods
                preflight = (
                    self.cors.preflight(origin, call.headers)
                    if origin and method == "OPTIONS" and "access-control-request-method" in call.headers
                    else None
                )
                if refusal is not None:
                    grant = None  # a refused Host (DNS rebinding) gets no grant, whatever its Origin
                    reply = exception_reply(call, refusal)
                    if not disconnected:  # gone while waiting for its key's turn: nobody to tell
                        await _send_reply(reply, tracked_send)
                elif preflight is not None:  # before any check of keys: a preflight carries none
                    await _send_preflight(preflight, send)
                    status = 204
                elif handler is not None and method != "POST":
                    await _send_reply(_other_method(call), tracked_send)
                elif card is None:
                    await self._dispatch(handler, call, scope, tracked_receive, tracked_send)
                else:
                    with card.scope:
                        await self._dispatch(handler, call, scope, tracked_receive, tracked_send)
                    card.note_expiry()
                    if card.ended_by is not None and not disconnected:
                        with trio.CancelScope(shield=True), trio.move_on_after(5.0):
                            await self._end_from_outside(call, card, send, response_started, response_done)
                            status = status or 499
        finally:
            with trio.CancelScope(shield=True):
                for fn in reversed(call.cleanups):
                    with trio.move_on_after(5.0):
                        await fn()
            if self.auth is not None:
                self.auth.leave(call)  # after the cleanups: they may fill in the card's tokens
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()
            if card is not None:
                # a client that hangs up after the whole answer has not disconnected early
                self.cards.close(card, status=status or 499, disconnected=disconnected and not response_done)
                card.key = card.key or call.key
            code, error = call.code, call.error
            if card is not None and code is None:
                if card.failed_code is not None:  # a stream that failed after its 200 head
                    code, error = card.failed_code, card.failed_reason
                elif card.ended_by is not None:
                    error = card.reason
            record = RequestRecord(
                trace_id=trace_id,
                started_at=started_at,
                method=method,
                path=path,
                model=call.model,
                status=status or 499,  # nothing sent: the client went away first
                duration_ms=(time.perf_counter() - t0) * 1000,
                ttft_ms=first_body_s * 1000 if first_body_s is not None else None,
                blazar_code=code,
                bytes_out=sent,
                client=call.client,
                dialect=dialect_label(path, call.headers),
                key=call.key,
                error=scrub(error) if error else None,
                **(card.facts() if card is not None else {}),
            )
            if self.ledger is not None:
                self.ledger.record_nowait(record)
            if self.telemetry is not None:
                self.telemetry.observe(
                    record,
                    route=call.route or (path if path in self.routes.post else "other"),
                    inference=card is not None,
                    body=call.body or None,
                    answer=b"".join(answer) if answer else None,
                    drafts=(card.drafted or 0, card.accepted or 0) if card is not None else None,
                )
            if tracer is not None and span is not None:
                tracer.end(span, status=record.status, model=call.model, code=code, card=card)

    async def _websocket(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """A WebSocket (``/v1/realtime``): the host guard and the key check of any request
        (a browser, which cannot send headers on a WebSocket, may give its key as the
        ``openai-insecure-api-key.KEY`` subprotocol, as OpenAI's clients do), then the app;
        one ledger record when the socket ends."""
        trace_id = f"blz-{self._boot}-{next(self._seq)}"
        call = Call({**scope, "method": "GET"}, trace_id=trace_id, max_body=self.max_body)
        if "authorization" not in call.headers and "x-api-key" not in call.headers:
            for proto in call.headers.get("sec-websocket-protocol", "").split(","):
                if (proto := proto.strip()).startswith(_KEY_PROTOCOL):
                    call.headers["authorization"] = "Bearer " + proto[len(_KEY_PROTOCOL) :]
        started_at, t0 = time.time(), time.perf_counter()
        status = 101
        self.in_flight += 1
        if self._idle.is_set():
            self._idle = trio.Event()
        try:
            with call:
                refusal = self.guard.refusal(call.headers) if self.guard is not None else None
                if refusal is None and self.auth is not None:
                    refusal = await self.auth.enter(call)
                if refusal is not None:
                    reply = exception_reply(call, refusal)
                    status = reply.status
                    await _deny_websocket(scope, reply, send)
                    return
                await self.app(scope, receive, send)
        finally:
            if self.auth is not None:
                self.auth.leave(call)
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()
            record = RequestRecord(
                trace_id=trace_id,
                started_at=started_at,
                method="GET",
                path=scope["path"],
                model=call.model,
                status=status,
                duration_ms=(time.perf_counter() - t0) * 1000,
                ttft_ms=None,
                blazar_code=call.code,
                bytes_out=0,
                client=call.client,
                dialect=dialect_label(scope["path"], call.headers),
                key=call.key,
                error=scrub(call.error) if call.error else None,
            )
            if self.ledger is not None:
                self.ledger.record_nowait(record)

    def record_job(self, record: RequestRecord) -> None:
        """The facts of work that ran outside any HTTP request (a background response):
        into the ledger and telemetry like a request's, its tokens charged to its key."""
        if self.ledger is not None:
            self.ledger.record_nowait(record)
        if self.telemetry is not None:
            self.telemetry.observe(record, route=JOB_ROUTE, inference=True)
        if self.auth is not None:
            self.auth.charge(record.key, (record.prompt_tokens or 0) + (record.completion_tokens or 0))

    async def _dispatch(
        self, handler: Handler | None, call: Call, scope: dict[str, Any], receive: Any, send: Any
    ) -> None:
        if handler is None:
            await self.app(scope, receive, send)
        else:
            await self._serve(handler, call, receive, send)

    async def _serve(self, handler: Handler, call: Call, receive: Any, send: Any) -> None:
        """One of the gateway's own routes: read the body, then run the handler and send its
        reply while watching for the client's disconnect, which cancels both."""
        try:
            with trio.move_on_after(_BODY_TIMEOUT_S) as waited:
                call.body = await _read_body(call, receive)
        except _ClientGone:
            return
        except BlazarError as exc:
            await _send_reply(exception_reply(call, exc), send)
            return
        if waited.cancelled_caught:
            message = f"the request body did not arrive in {_BODY_TIMEOUT_S:g} s"
            await _send_reply(error_reply(call, "BAD_REQUEST", message), send)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            try:
                reply = await handler(call)
            except Exception as exc:
                reply = exception_reply(call, exc)
            try:
                await _send_reply(reply, send)
            except Exception:
                # The head is out: all that is left is to end the connection (the server
                # closes it when the app returns with the response unfinished).
                log.exception("stream of %s %s (%s) failed", call.method, call.path, call.trace_id)
            nursery.cancel_scope.cancel()

    async def _end_from_outside(self, call: Call, card: Card, send: Any, started: bool, done: bool) -> None:
        """Finish a request cancelled or interrupted from another connection, or by its deadline."""
        message = f"request {card.trace_id} was {card.ended_by}: {card.reason}"
        call.code = card.end_code
        if not started:
            body = msgspec.json.encode(
                error_body(dialect_for(call.path, call.headers), card.end_code, message)
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": CATALOG[card.end_code].status,
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
                    else card.enders.cancelled(card.end_code, message)
                )
            await send({"type": "http.response.body", "body": tail, "more_body": False})


async def _deny_websocket(scope: dict[str, Any], reply: Reply, send: Any) -> None:
    """Refuse a WebSocket before its upgrade: the JSON error as an HTTP answer where the
    server can send one (ASGI's ``websocket.http.response``), else a close (403)."""
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    assert isinstance(reply.body, bytes)
    headers = [(b"content-type", reply.content_type.encode()), (b"content-length", b"%d" % len(reply.body))]
    if reply.headers:
        headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
    await send({"type": "websocket.http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": reply.body, "more_body": False})


async def _send_preflight(headers: list[tuple[bytes, bytes]], send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _other_method(call: Call) -> Reply:
    allow = {"Allow": "OPTIONS, POST"}
    if call.method == "OPTIONS":
        return Reply(b"", content_type="text/html; charset=utf-8", headers=allow)
    reply = error_reply(call, "METHOD_NOT_ALLOWED", f"{call.path} does not accept {call.method}")
    reply.headers = allow
    return reply


async def _read_body(call: Call, receive: Any) -> bytes:
    declared = call.declared_length()
    if declared is not None:
        call.check_length(declared)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            call.check_length(size)
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _cancel_on_disconnect(receive: Any, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _send_reply(reply: Reply, send: Any) -> None:
    headers = [(b"content-type", reply.content_type.encode())]
    if reply.headers:
        headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
    body = reply.body
    if isinstance(body, bytes):
        headers.append((b"content-length", b"%d" % len(body)))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    try:
        async for chunk in body:
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    finally:
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            with trio.CancelScope(shield=True):
                await aclose()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
