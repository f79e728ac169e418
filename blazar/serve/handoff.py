"""The runtime's half of a stream handed to a data-plane worker (``workers`` above 1).

A worker forwards each request to the runtime, which does everything it always does
(auth, key limits, admission, the claim, the card, the ledger record). Where the answer
is the engine's own stream, relayed untouched (OpenAI chat and completions), the runtime
then answers the worker with a ``Grant`` instead of the bytes: where the engine is, what
to send it. The worker opens that connection itself and relays the engine's bytes to its
client, so they never cross into this process. The runtime's answer to the worker stays
open meanwhile, holding the lease: it ends when the worker reports how the stream ended
(``HandoffSlot.report``), or when its connection to the worker closes (the client went
away, or the worker died), which releases the lease as a client's disconnect does. A
cancel from here (``POST /v1/requests/{id}/cancel``, a deadline, a drain) ends that
answer with the stream's last event, which the worker writes after stopping the engine.

The wire between the two is the workers' channel (``blazar/web/asgi/channel.py``): the
grant is one JSON line, the answer's first body frame; the report is a frame of its own
(``Report``), and its answer the bytes the worker sends last, if any.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import trio

from actors.upstream import UpstreamBrokenError
from blazar.serve.cards import Card
from blazar.serve.relay import Releasable

__all__ = ["GRANT_HEADER", "Grant", "HandedOff", "HandoffSlot", "Report", "ReportAnswer"]

GRANT_HEADER = "x-blazar-handoff"
"""Marks the runtime's answer to a worker as a grant: its body starts with the grant line."""


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    host: str
    port: int
    headers: dict[str, str]
    """What goes with every request to the engine (its API key)."""
    keep: int
    keep_s: float
    """How many idle connections to the engine the runtime's own pool keeps, and how long:
    a worker keeps as many, or it would open one per stream past them."""
    path: str
    body: bytes
    progress: bool
    """The runtime asked the engine for prompt-progress events: the worker filters them out."""


class Report(msgspec.Struct, frozen=True, kw_only=True):
    """How a handed-off relay ended, from the worker."""

    tail: bytes = b""
    """The stream's last bytes (the engine's usage and timings are in its final event)."""
    status: int = 200
    """The engine's status: not 200, ``body`` is its whole answer and nothing was sent yet."""
    body: bytes = b""
    error: str | None = None
    """The engine connection broke midway (what broke it)."""
    chunks: int = 0
    bytes_out: int = 0
    first_byte_ago_s: float | None = None
    """How long before the report the first chunk went to the client."""


class ReportAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """What the worker sends last: a refusal's whole answer (``status``), or a stream's end."""

    status: int | None = None
    body: bytes = b""
    content_type: str = "application/json"


OnReport = Callable[[Report], Awaitable[ReportAnswer]]


class HandoffSlot:
    """One request that a worker forwarded and may take over: it waits for the report.
    Its ``id`` names the stream in the grant and the logs."""

    __slots__ = ("_answered", "_handler", "_reported", "id")

    def __init__(self) -> None:
        self.id = secrets.token_hex(8)
        self._reported = trio.Event()
        self._handler: OnReport | None = None
        self._answered: ReportAnswer | None = None

    def granted(self, handler: OnReport) -> None:
        self._handler = handler

    async def report(self, report: Report) -> ReportAnswer:
        """The worker's report; what it sends its client last."""
        if self._handler is None or self._reported.is_set():
            return ReportAnswer()
        try:
            answer = await self._handler(report)
        finally:
            self._reported.set()
        return answer

    async def wait(self) -> None:
        await self._reported.wait()


class HandedOff:
    """The runtime's answer to the worker for a handed-off stream: the grant line, then
    nothing until the worker reports (or the connection closes); the lease is held so long."""

    def __init__(
        self,
        slot: HandoffSlot,
        grant: Grant,
        lease: Releasable,
        *,
        on_end: Callable[[bytes], None] | None,
        on_error: Callable[[Exception], Awaitable[bytes]],
        on_refusal: Callable[[int, bytes], ReportAnswer],
        card: Card | None = None,
    ) -> None:
        self._slot = slot
        self._card = card
        self._grant: bytes | None = msgspec.json.encode(grant) + b"\n"
        self._lease = lease
        self._on_end = on_end
        self._on_error = on_error
        self._on_refusal = on_refusal
        self._released = False
        slot.granted(self._reported)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if (grant := self._grant) is not None:
            self._grant = None
            return grant
        await self._slot.wait()
        self._release()
        raise StopAsyncIteration

    async def _reported(self, report: Report) -> ReportAnswer:
        if (card := self._card) is not None:  # what the worker sent, not the grant line
            card.chunks, card.bytes_out = report.chunks, report.bytes_out
            if report.first_byte_ago_s is not None:
                card.first_byte_s = time.perf_counter() - report.first_byte_ago_s
        if report.status != 200:
            self._release()
            return self._on_refusal(report.status, report.body)
        if (on_end := self._on_end) is not None:
            self._on_end = None
            on_end(report.tail)
        if report.error is not None:
            last = await self._on_error(UpstreamBrokenError(report.error))
            self._release()
            return ReportAnswer(body=last)
        self._release()
        return ReportAnswer()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._lease.release()

    async def aclose(self) -> None:
        """The worker's connection ended (its client left, or it died), or the request is done."""
        self._release()
