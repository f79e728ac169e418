"""One request's ASGI messages as the gateway watches them, and the ledger's record of it.

The gateway hands its routes (its own and the framework app) ``Exchange.receive`` and
``Exchange.send`` in place of the server's. Receiving notes when the body has been read
whole and when the client disconnects, and first gives back what ``client_gone`` read
while the request waited in the key step. Sending stamps the head of the answer
(``x-blazar-trace-id``, ``traceparent``, the CORS grant, and ``connection: close`` when
the body was not read whole) and counts what goes out: the status, the time to the first
byte, the bytes, the live card's chunks, and the answer's text where the audit log keeps
it. ``record`` turns what was seen into the ledger's ``RequestRecord`` once the request
has ended.

A streamed answer's chunks come through ``write_body`` instead: counted the same way, and
written by the connection's direct writer where it offers one (``blazar.web.asgi.direct``),
which costs a fraction of the server's path for a body message; or, through ``pipe``, the
rest of an engine's stream is relayed by the process's pump (``blazar.web.asgi.pump``).

It wraps the whole request, from before the host guard to after the cleanups, so every
answer is stamped and counted the same way, a refusal as much as a route's. Its ``send``
runs once per body message, so one costs only a few counter updates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from actors.ledger import RequestRecord
from blazar.telemetry.observer import dialect_label
from blazar.telemetry.scrub import scrub
from blazar.web.asgi.call import Call
from blazar.web.middleware.cors import expose_header

__all__ = ["WHOLE", "Exchange"]

_ANSWER_KEEP = 256 * 1024
"""The most reply bytes kept for an audit log that records answers."""


WHOLE = "blazar.whole"
"""Set in an ``http.response.start`` whose whole body is sent next, at once: the head
waits for it, and both go out in one write (``BodyWriter.hold``)."""


class DirectBody(Protocol):
    """What writes a streamed body's chunks straight to the connection (``BodyWriter``)."""

    async def write(self, data: bytes) -> None: ...

    async def pipe(self, source: Any, on_chunk: Callable[[bytes], None]) -> bool: ...

    def hold(self) -> None: ...


class Exchange:
    """The receive and send of one HTTP request, watched; and what they saw."""

    __slots__ = (
        "_direct",
        "_receive",
        "_send",
        "_watch_gone",
        "answer",
        "body_done",
        "call",
        "card",
        "disconnected",
        "done",
        "early",
        "first_body_s",
        "grant",
        "sent",
        "stamp",
        "started",
        "started_at",
        "status",
        "t0",
    )

    def __init__(
        self,
        call: Call,
        receive: Any,
        send: Any,
        *,
        grant: list[tuple[bytes, bytes]] | None,
        traceparent: bytes | None,
        keep_answer: bool,
        direct: DirectBody | None = None,
        watch_gone: Callable[[Callable[[], None] | None], None] | None = None,
    ) -> None:
        self.call = call
        self.card = call.card
        self._receive = receive
        self._send = send
        self._direct = direct
        self._watch_gone = watch_gone
        """The connection's watch for the client's going (``blazar.web.asgi.direct.WATCH_GONE``)."""
        self.stamp = [(b"x-blazar-trace-id", call.trace_id.encode())]
        """Headers added to the head of the answer."""
        if traceparent is not None:
            self.stamp.append((b"traceparent", traceparent))
        self.started_at, self.t0 = time.time(), time.perf_counter()
        self.status = 0
        """The answer's status; 0 while no head has gone out."""
        self.first_body_s: float | None = None
        self.sent = 0
        self.started = self.done = self.disconnected = False
        self.body_done = (
            call.headers.get("content-length", "0") == "0" and "transfer-encoding" not in call.headers
        )
        """Whether the request's body has been read whole (from the start, when it has none)."""
        self.answer: list[bytes] | None = [] if keep_answer else None
        """The reply's bytes, kept only for an audit log that records answers."""
        self.grant = grant
        """The CORS headers for the request's origin: None for every non-browser client."""
        self.early: list[dict[str, Any]] = []
        """Messages read while waiting in the key step, for the route."""

    async def receive(self) -> dict[str, Any]:
        return self.early.pop(0) if self.early else await self._watch()

    async def _watch(self) -> dict[str, Any]:
        message = await self._receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            self.body_done = True
        elif message["type"] == "http.disconnect":
            self.disconnected = True
        return message

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.started = True
            headers = [*message.get("headers", ()), *self.stamp]
            if self.card is not None:  # an inference request: what it cost so far, once
                headers += self.card.cost_headers(stream=_is_stream(headers))
            if self.grant is not None:
                headers += [*self.grant, expose_header(headers)]
            if not self.body_done:
                # Answered before reading the whole body (an error): the rest of it
                # would be taken for the next request, so this connection must end.
                headers.append((b"connection", b"close"))
            if message.get(WHOLE) and self._direct is not None:
                self._direct.hold()
            message = {**message, "headers": headers}
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            if body:
                self._count(body)
            self.done = not message.get("more_body", False)
        # Shielded: a cancel from another connection (or the app's own nursery)
        # must not land inside the server's send. Hypercorn recycles a
        # keep-alive connection from within the final send; cancelled there, the
        # connection stays open but never reads the client's next request.
        with trio.CancelScope(shield=True):
            await self._send(message)

    async def write_body(self, body: bytes) -> None:
        """The next chunk of a streamed answer (never empty, never the last message):
        counted as ``send`` counts it, and written straight to the connection where it
        offers a direct writer. That write lets no cancel in; the ordinary send is shielded."""
        self._count(body)
        if self._direct is not None:
            await self._direct.write(body)
        else:
            with trio.CancelScope(shield=True):
                await self._send({"type": "http.response.body", "body": body, "more_body": True})

    async def pipe(self, source: Any, on_chunk: Callable[[bytes], None]) -> bool:
        """Have the rest of a stream's body (an ``UpstreamResponse``) relayed by the
        connection's pump where it offers one (``BodyWriter.pipe``), each chunk given to
        ``on_chunk`` and counted as ``write_body`` counts it. False where it cannot."""
        direct = self._direct
        if direct is None:
            return False
        count = self._count

        def chunk(body: bytes) -> None:
            on_chunk(body)
            count(body)

        return await direct.pipe(source, chunk)

    def cancel_on_gone(self, scope: trio.CancelScope | None) -> bool:
        """Have the connection cancel ``scope`` when the client goes, noted as a disconnect
        (None: stop watching). False where the connection offers no such watch: a task must
        then read ``receive`` for the ``http.disconnect``."""
        watch = self._watch_gone
        if watch is None:
            return False
        if scope is None:
            watch(None)
            return True

        def gone() -> None:
            self.disconnected = True
            scope.cancel()

        watch(gone)
        return True

    def _count(self, body: bytes) -> None:
        """A body message's bytes: the first byte's time, the card's chunks, the total."""
        if self.first_body_s is None:
            self.first_body_s = time.perf_counter() - self.t0
        n = len(body)
        self.sent += n
        card = self.card
        if card is not None:
            if card.first_byte_s is None:
                card.first_byte_s = time.perf_counter()
            card.chunks += 1
            card.bytes_out += n
            if self.answer is not None and card.bytes_out <= _ANSWER_KEEP:
                self.answer.append(body)

    async def client_gone(self) -> None:
        """Return once the client disconnects; keep what arrives before for the route."""
        while True:
            message = await self._watch()
            if message["type"] == "http.disconnect":
                return
            self.early.append(message)

    def record(self) -> RequestRecord:
        """The ledger's record of the request, once it has ended (and its card is closed)."""
        call, card = self.call, self.card
        end = time.perf_counter()
        code, error = call.code, call.error
        if card is not None and code is None:
            if card.failed_code is not None:  # a stream that failed after its 200 head
                code, error = card.failed_code, card.failed_reason
            elif card.ended_by is not None:
                error = card.reason
        return RequestRecord(
            trace_id=call.trace_id,
            started_at=self.started_at,
            method=call.method,
            path=call.path,
            model=call.model,
            status=self.status or 499,  # nothing sent: the client went away first
            duration_ms=(end - self.t0) * 1000,
            ttft_ms=self.first_body_s * 1000 if self.first_body_s is not None else None,
            blazar_code=code,
            bytes_out=self.sent,
            client=call.client,
            dialect=dialect_label(call.path, call.headers),
            key=call.key,
            error=scrub(error) if error else None,
            overhead_ms=card.overhead_ms(card.ended_s or end) if card is not None else None,
            **(card.facts() if card is not None else {}),
        )


def _is_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    """A streamed answer is the one sent with ``X-Accel-Buffering: no`` (``stream_reply``)."""
    return any(name.lower() == b"x-accel-buffering" for name, _ in headers)
