"""The gateway layer: the ASGI application the HTTP server runs, around the Quart app.

For every request it makes the ``Call`` (trace id, live card, cleanups) and passes it
through the middleware steps of ``blazar.web.middleware``, in the order ``__call__``
shows: the trace span begins (``tracing``), the request's messages are watched and its
answer stamped with ``x-blazar-trace-id`` and the CORS grant (``exchange``, ``cors``), the
host guard refuses foreign hosts and origins (``host_guard``), the key step checks the
API key and takes its place under the key's limits (``auth``), a CORS preflight is
answered; then the route runs, an inference request inside its card's cancel scope.
However it ends, its cleanups run, its key's place is freed, and it is recorded in the
ledger without waiting. The hot inference routes (``Routes``) it serves itself, straight
on ASGI: a relayed request there costs a fraction of what a trip through the
framework's request and response objects does
(BENCHMARK.md). Every other route goes to the Quart app.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from actors.ledger import LedgerActor, RequestRecord
from blazar.errors import CATALOG, BlazarError, error_body
from blazar.serve.cards import INFERENCE_PATHS, Card, Cards, CardState
from blazar.telemetry.observer import Telemetry, dialect_label
from blazar.telemetry.scrub import scrub
from blazar.web.asgi.call import Call, Handler, Reply, Routes
from blazar.web.asgi.direct import DIRECT_BODY, WATCH_GONE
from blazar.web.asgi.replies import dialect_for, error_reply, exception_reply
from blazar.web.middleware.auth import Auth
from blazar.web.middleware.cors import CorsPolicy, send_preflight
from blazar.web.middleware.exchange import WHOLE, Exchange
from blazar.web.middleware.head_limit import head_refusal
from blazar.web.middleware.host_guard import HostGuard
from blazar.web.middleware.tracing import RequestTracer

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from blazar.serve.jobs.self_link import SelfLink

__all__ = ["JOB_ROUTE", "GatewayMiddleware", "send_reply"]

log = logging.getLogger("blazar.web")

_DEFAULT_MAX_BODY = 50 * 1024 * 1024
_BODY_TIMEOUT_S = 60.0
JOB_ROUTE = "job:/v1/responses"
"""The ``route`` label of a background response's own facts (its job, not its HTTP request)."""
_KEY_PROTOCOL = "openai-insecure-api-key."
"""The WebSocket subprotocol prefix a browser gives its API key in."""


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
        max_head: int | None = None,
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
        self.max_head = max_head
        """The largest request head in bytes (``max_header_kb``); None: hypercorn's own bound."""
        self.tracer = tracer
        self.cors = cors if cors is not None else CorsPolicy()
        self.link: SelfLink | None = None
        """The daemon's link to its own port (``blazar.web.front``), which learns its address."""
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
        trace_id = self._trace_id()
        path, method = scope["path"], scope["method"]
        card = self.cards.open(trace_id, path) if method == "POST" and path in INFERENCE_PATHS else None
        call = Call(scope, trace_id=trace_id, max_body=self.max_body, card=card)
        extensions = scope.get("extensions") or {}
        span = self.tracer.begin(method, path, call.headers, trace_id) if self.tracer is not None else None
        exchange = Exchange(
            call,
            receive,
            send,
            traceparent=RequestTracer.traceparent(span) if span is not None else None,
            keep_answer=card is not None and self.telemetry is not None and self.telemetry.wants_text,
            grant=self.cors.grant_for(call.headers),
            direct=extensions.get(DIRECT_BODY),
            watch_gone=extensions.get(WATCH_GONE),
        )
        self._arrive()
        try:
            with call:
                # The head's size, the host guard, then the key: a page or a rebound name never
                # gets to try one.
                refusal = head_refusal(scope, self.max_head)
                if refusal is None and self.guard is not None:
                    refusal = self.guard.refusal(call.headers)
                if refusal is None and self.auth is not None:
                    refusal = await self.auth.enter(call, exchange.client_gone)
                await self._answer(call, exchange, refusal, scope, send)
        finally:
            await _run_cleanups(call)
            if self.auth is not None:
                self.auth.leave(call)  # after the cleanups: they may fill in the card's tokens
            self._depart()
            if card is not None:
                # a client that hangs up after the whole answer has not disconnected early
                gone_early = exchange.disconnected and not exchange.done
                self.cards.close(
                    card,
                    status=exchange.status or 499,
                    disconnected=gone_early,
                    code=call.code,
                    error=call.error,
                )
                card.key = card.key or call.key
            self._report(exchange, span)

    async def _answer(
        self, call: Call, exchange: Exchange, refusal: BlazarError | None, scope: dict[str, Any], send: Any
    ) -> None:
        """Answer the request: its refusal, a CORS preflight, a gateway route's other
        methods, or its route (the gateway's own or the app's), an inference request
        inside its card's cancel scope and finished from here if it was ended from outside."""
        path, method = call.path, call.method
        handler = self.routes.handler_for(method, path)
        if refusal is not None:
            exchange.grant = None  # a refused Host (DNS rebinding) gets no grant, whatever its Origin
            reply = exception_reply(call, refusal)
            if not exchange.disconnected:  # gone while waiting for its key's turn: nobody to tell
                await send_reply(reply, exchange.send)
        elif (preflight := self.cors.preflight_for(method, call.headers)) is not None:
            # before any check of keys: a preflight carries none
            await send_preflight(preflight, send)
            exchange.status = 204
        elif handler is not None and method != "POST" and path not in self.routes.get:
            await send_reply(_other_method(call), exchange.send)
        elif (card := call.card) is None:
            await self._dispatch(handler, call, scope, exchange)
        else:
            with card.scope:
                await self._dispatch(handler, call, scope, exchange)
            card.note_expiry()
            if card.ended_by is not None and not exchange.disconnected:
                with trio.CancelScope(shield=True), trio.move_on_after(5.0):
                    await self._end_from_outside(call, card, send, exchange.started, exchange.done)
                    exchange.status = exchange.status or 499

    def _report(self, exchange: Exchange, span: Span | None) -> None:
        """The ended request's record: to the ledger (never waited on) and telemetry; then
        its trace span ends, with the record's status and code."""
        call, card = exchange.call, exchange.card
        record = exchange.record()
        if self.ledger is not None:
            self.ledger.record_nowait(record)
        if self.telemetry is not None:
            answer = exchange.answer
            self.telemetry.observe(
                record,
                route=call.route or (call.path if self.routes.serves(call.path) else "other"),
                inference=card is not None,
                body=call.ran_body or call.body or None,
                answer=b"".join(answer) if answer else None,
                drafts=(card.drafted or 0, card.accepted or 0) if card is not None else None,
            )
        if self.tracer is not None and span is not None:
            self.tracer.end(span, status=record.status, model=call.model, code=record.blazar_code, card=card)

    def _trace_id(self) -> str:
        return f"blz-{self._boot}-{next(self._seq)}"

    def _arrive(self) -> None:
        """A request has arrived: the gateway is no longer idle (drain)."""
        self.in_flight += 1
        if self._idle.is_set():
            self._idle = trio.Event()

    def _depart(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def _websocket(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """A WebSocket (``/v1/realtime``): the host guard and the key check of any request
        (a browser, which cannot send headers on a WebSocket, may give its key as the
        ``openai-insecure-api-key.KEY`` subprotocol, as OpenAI's clients do), then the app;
        one ledger record when the socket ends."""
        trace_id = self._trace_id()
        call = Call({**scope, "method": "GET"}, trace_id=trace_id, max_body=self.max_body)
        if "authorization" not in call.headers and "x-api-key" not in call.headers:
            for proto in call.headers.get("sec-websocket-protocol", "").split(","):
                if (proto := proto.strip()).startswith(_KEY_PROTOCOL):
                    call.headers["authorization"] = "Bearer " + proto[len(_KEY_PROTOCOL) :]
        started_at, t0 = time.time(), time.perf_counter()
        status = 101
        self._arrive()
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
                accepted = False

                async def sending(message: dict[str, Any]) -> None:
                    # A refusal of the route's own (an unknown model) is recorded as such.
                    nonlocal status, accepted
                    kind = message["type"]
                    if kind == "websocket.accept":
                        accepted = True
                    elif kind == "websocket.http.response.start":
                        status = message["status"]
                    elif kind == "websocket.close" and not accepted and status == 101:
                        status = 403
                    await send(message)

                await self.app(scope, receive, sending)
        finally:
            if self.auth is not None:
                self.auth.leave(call)
            self._depart()
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
        self, handler: Handler | None, call: Call, scope: dict[str, Any], exchange: Exchange
    ) -> None:
        if handler is None:
            await self.app(scope, exchange.receive, exchange.send)
        else:
            await self._serve(handler, call, exchange)

    async def _serve(self, handler: Handler, call: Call, exchange: Exchange) -> None:
        """One of the gateway's own routes: read the body, then run the handler and send its
        reply while watching for the client's disconnect, which cancels both."""
        receive, send = exchange.receive, exchange.send
        try:
            with trio.move_on_after(_BODY_TIMEOUT_S) as waited:
                call.body = await _read_body(call, receive)
        except _ClientGone:
            return
        except BlazarError as exc:
            await send_reply(exception_reply(call, exc), send)
            return
        if waited.cancelled_caught:
            message = f"the request body did not arrive in {_BODY_TIMEOUT_S:g} s"
            await send_reply(error_reply(call, "BAD_REQUEST", message), send)
            return
        # The client's going cancels both: told by the connection where it offers that
        # (no task of the request's own, which costs more than many a request), else read
        # from ``receive`` by a task beside them.
        watched = trio.CancelScope()
        if exchange.cancel_on_gone(watched):
            try:
                with watched:
                    await _reply(handler, call, exchange)
            finally:
                exchange.cancel_on_gone(None)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            await _reply(handler, call, exchange)
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


async def _run_cleanups(call: Call) -> None:
    """The request's cleanups, last registered first, each bounded and all shielded: they
    run however the request ended, a cancel included."""
    cleanups, call.cleanups = call.cleanups, []
    # Dropped once run: a cleanup is often a bound method of what refers back to the call (a
    # stream whose error hook knows it), and a cycle kept each request for the garbage collector,
    # whose full collections stop every stream for tens of milliseconds.
    with trio.CancelScope(shield=True):
        for fn in reversed(cleanups):
            with trio.move_on_after(5.0):
                await fn()


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


async def _reply(handler: Handler, call: Call, exchange: Exchange) -> None:
    try:
        reply = await handler(call)
    except Exception as exc:
        reply = exception_reply(call, exc)
    try:
        await send_reply(reply, exchange.send, exchange.write_body, exchange.pipe)
    except Exception:
        # The head is out: all that is left is to end the connection (the server closes
        # it when the app returns with the response unfinished).
        log.exception("stream of %s %s (%s) failed", call.method, call.path, call.trace_id)


async def _cancel_on_disconnect(receive: Any, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def send_reply(
    reply: Reply,
    send: Any,
    write_body: Callable[[bytes], Awaitable[None]] | None = None,
    pipe: Callable[[Any, Callable[[bytes], None]], Awaitable[bool]] | None = None,
) -> None:
    """Send ``reply``; a stream's chunks, as they come, through ``write_body`` where given
    (``Exchange.write_body``: one cheap step per chunk), else as body messages. A stream that
    can be piped (``UpstreamStream.pipe_into``) is handed to ``pipe`` (``Exchange.pipe``) as
    soon as it may be, and the loop takes what the pump leaves: the end, or an error."""
    headers = [(b"content-type", reply.content_type.encode())]
    if reply.headers:
        headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
    body = reply.body
    if isinstance(body, bytes):
        headers.append((b"content-length", b"%d" % len(body)))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers, WHOLE: True})
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    try:
        if write_body is not None:
            into = (
                getattr(body, "pipe_into", None)
                if pipe is not None and getattr(body, "pipeable", False)
                else None
            )
            async for chunk in body:
                if chunk:
                    await write_body(chunk)
                    if into is not None and await into(pipe):
                        into = None
        else:
            async for chunk in body:
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
    finally:
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            with trio.CancelScope(shield=True):
                await aclose()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
