"""Request cards: what every inference request is doing, live, and how it ended.

The gateway's ASGI layer opens a card for each inference request and runs the
request inside the card's cancel scope, so ``POST /v1/requests/{id}/cancel``
(or ``/interrupt``) from another connection ends it exactly like a client
disconnect would: the upstream connection closes, the slot is released.
Finished cards stay in a bounded ring for inspection.

Only routes that generate (or embed) have cards: counting tokens
(``/v1/messages/count_tokens``, ``/v1/responses/input_tokens``) and reading stored
answers are not inference. A background response (``background: true``) is a job:
the card of the request that created it covers the creation and any stream that
follows it, and cancelling that card closes that stream only, never the job
(``POST /v1/responses/{id}/cancel`` does); the job gets a card of its own, not
listed among the live requests, whose facts are recorded when it ends.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import trio

from actors.mcp_results import McpCallResult
from blazar.dialects.engine_usage import EngineUsage

__all__ = ["Card", "CardState", "CardView", "Cards", "StreamEnders", "set_stream_enders"]

INFERENCE_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/messages",
        "/v1/responses",
        "/api/chat",
        "/api/generate",
        "/api/embed",
        "/api/embeddings",
        "/v1/rerank",
        "/v1/reranking",
        "/rerank",
        "/reranking",
        "/api/rerank",
        "/v1/systemone",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/v1/audio/speech",
        "/v1/images/generations",
        "/v1/images/edits",
        "/v1/images/variations",
        "/v1/images/upscale",
    }
)


class CardState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    DISCONNECTED = "disconnected"


@dataclass
class StreamEnders:
    """Final bytes for a stream ended from outside, in the stream's own dialect."""

    cancelled: Callable[[str, str], bytes]
    """The dialect's error event for a ``blazar_code`` and message."""
    interrupted: Callable[[], bytes]


class CardView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    trace_id: str
    path: str
    model: str | None
    engine: str | None
    state: str
    queue_position: int | None
    chunks: int
    bytes_out: int
    status: int | None
    created_at: float
    ttft_ms: float | None
    elapsed_ms: float
    reason: str | None
    code: str | None
    """The ``blazar_code`` it ended with, when it failed or was ended from outside."""
    request_class: str | None = msgspec.field(default=None, name="class")
    """Its admission class (docs/scheduling.md), once its claim was asked for."""
    preempted: int = 0
    """Times it gave its slot to an interactive request and queued again."""
    queue_ms: float | None = None
    """Its wait for an admission slot so far (summed over its claims)."""
    overhead_ms: float | None = None
    """Once it ended: the gateway's own time, the whole figure (docs/observability.md); a
    stream's head could only say the part before the engine."""


@dataclass
class Card:
    trace_id: str
    path: str
    created_s: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    model: str | None = None
    engine: str | None = None
    state: CardState = CardState.QUEUED
    waiter_id: int | None = None
    first_byte_s: float | None = None
    ended_s: float | None = None
    chunks: int = 0
    bytes_out: int = 0
    status: int | None = None
    reason: str | None = None
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    enders: StreamEnders | None = None
    ended_by: CardState | None = None
    """Set when the request is cancelled or interrupted from another connection, or
    cancelled by its deadline."""
    end_code: str = "CLIENT_CLOSED_REQUEST"
    """The ``blazar_code`` a request ended from outside answers with."""
    # What the request cost and where its time went: filled in as it runs, read by
    # /metrics, the audit log, `blazar why` and per-key token limits.
    key: str | None = None
    """The name (never the secret) of the API key it came with."""
    queue_wait_s: float | None = None
    load_s: float | None = None
    """Time spent making the engine ready (0 when it was already loaded)."""
    queue_ahead: int | None = None
    """Requests already waiting for a slot when it asked for one."""
    request_class: str | None = None
    """Its admission class (``interactive``, ``default``, ``batch``, ``background``)."""
    preempted: int = 0
    """Times the request gave its slot to an interactive one and queued again."""
    evicted: tuple[str, ...] = ()
    """Models stopped to make room for its engine."""
    handed_s: float | None = None
    """When its first claim was granted, its engine ready: the gateway hands it to the engine."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    drafted: int | None = None
    """Tokens speculative decoding drafted for it, and how many the model kept."""
    accepted: int | None = None
    failed_code: str | None = None
    """The ``blazar_code`` of a failure after the reply's head was sent (a stream that
    ended with an error event: an engine crash, a lost upstream); the head said 200."""
    failed_reason: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    """The MCP tool calls the gateway ran for it: name, outcome, time."""
    failover: list[str] = field(default_factory=list)
    """A failover chain's walk: each target passed over and why, then the one that served."""
    cache: str | None = None
    """What the semantic cache did for it (``hit (similarity …)``, ``miss (…)``, ``bypass (…)``)."""
    policy: str | None = None
    """What the policy hooks did for it (``X-Blazar-Policy``'s value: ``NAME=allow``, …)."""

    def note_failure(self, code: str, message: str) -> None:
        """The request's stream failed midway; the first failure is the one kept."""
        if self.failed_code is None:
            self.failed_code, self.failed_reason = code, message

    def facts(self) -> dict[str, Any]:
        """What the card learnt as it ran, as ``RequestRecord`` fields: its engine, waits and cost."""
        return {
            "engine": self.engine,
            "queue_ms": self.queue_wait_s * 1000 if self.queue_wait_s is not None else None,
            "load_ms": self.load_s * 1000 if self.load_s is not None else None,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms,
            "tools": msgspec.json.encode(self.tools).decode() if self.tools else None,
        }

    def note_tools(self, results: Sequence[McpCallResult]) -> None:
        """MCP tool calls ran for the request (``blazar why`` tells them)."""
        self.tools.extend(
            {
                "tool": r.qualified,
                "ok": not r.is_error,
                "why": r.why or ("tool_error" if r.is_error else None),
                "ms": round(r.elapsed_s * 1000, 1),
                "truncated_bytes": r.truncated_bytes,
            }
            for r in results
        )

    def note_claim(
        self, queued_s: float, load_ns: int, *, ahead: int = 0, evicted: tuple[str, ...] = ()
    ) -> None:
        """A claim on an engine was granted: its wait and load (summed over a request's claims),
        the requests that waited ahead of it, the models evicted for its engine."""
        if self.handed_s is None:
            self.handed_s = time.perf_counter()
        self.queue_wait_s = (self.queue_wait_s or 0.0) + queued_s
        self.load_s = (self.load_s or 0.0) + load_ns / 1e9
        self.queue_ahead = max(self.queue_ahead or 0, ahead)
        if evicted:
            self.evicted = (*self.evicted, *evicted)

    def overhead_ms(self, now: float | None, *, whole: bool = True) -> float:
        """The gateway's own time in milliseconds (docs/observability.md, "What a request
        cost"): from its arrival to ``now`` (``perf_counter``; None reads the clock), less its
        admission queue and engine load, less the engine's own prompt and decode time (as the
        engine reported it) and the MCP tools' time. Where the engine reported no time of its
        own (embeddings, some lanes), or ``whole`` is False (a stream's head, sent before the
        engine's first byte), it is the time up to the hand-over to the engine instead: what
        came after cannot be told apart from the engine's. Never below 0."""
        waits = (self.queue_wait_s or 0.0) + (self.load_s or 0.0)
        if self.handed_s is not None and (not whole or (self.prefill_ms is None and self.decode_ms is None)):
            return max((self.handed_s - self.t0 - waits) * 1000, 0.0)
        end = time.perf_counter() if now is None else now
        engine = (self.prefill_ms or 0.0) + (self.decode_ms or 0.0) + sum(t["ms"] for t in self.tools)
        return max((end - self.t0 - waits) * 1000 - engine, 0.0)

    def cost_headers(self, *, stream: bool) -> list[tuple[bytes, bytes]]:
        """``X-Blazar-Queue-Ms`` and ``X-Blazar-Overhead-Ms`` for the head of its answer (a
        stream's: the overhead up to the hand-over to the engine)."""
        queue = (self.queue_wait_s or 0.0) * 1000
        overhead = self.overhead_ms(None, whole=not stream)
        return [
            (b"x-blazar-queue-ms", f"{queue:.3f}".encode()),
            (b"x-blazar-overhead-ms", f"{overhead:.3f}".encode()),
        ]

    def note_preempted(self) -> None:
        """The request gave its slot to an interactive one before its first output; it queues
        again (and is shown queued until its next grant)."""
        self.preempted += 1
        self.state = CardState.QUEUED

    def note_usage(self, usage: EngineUsage | None) -> None:
        """What the engine said one of its replies cost (summed over a request's engine calls)."""
        if usage is None:
            return
        self.prompt_tokens = _plus(self.prompt_tokens, usage.prompt_tokens)
        self.completion_tokens = _plus(self.completion_tokens, usage.completion_tokens)
        self.prefill_ms = _plus(self.prefill_ms, usage.prefill_ms)
        self.decode_ms = _plus(self.decode_ms, usage.decode_ms)
        self.drafted = _plus(self.drafted, usage.drafted)
        self.accepted = _plus(self.accepted, usage.accepted)

    def view(self, position: int | None = None) -> CardView:
        end = self.ended_s if self.ended_s is not None else time.perf_counter()
        return CardView(
            id=self.trace_id,
            trace_id=self.trace_id,
            path=self.path,
            model=self.model,
            engine=self.engine,
            state=str(self.state),
            queue_position=position if self.state is CardState.QUEUED else None,
            chunks=self.chunks,
            bytes_out=self.bytes_out,
            status=self.status,
            created_at=self.created_s,
            ttft_ms=(self.first_byte_s - self.t0) * 1000 if self.first_byte_s is not None else None,
            elapsed_ms=(end - self.t0) * 1000,
            reason=self.reason,
            code=self._code(),
            request_class=self.request_class,
            preempted=self.preempted,
            queue_ms=self.queue_wait_s * 1000 if self.queue_wait_s is not None else None,
            overhead_ms=self.overhead_ms(self.ended_s) if self.ended_s is not None else None,
        )

    def _code(self) -> str | None:
        if self.ended_by is not None:
            return self.end_code
        return self.failed_code

    def end_from_outside(self, how: CardState, reason: str) -> bool:
        """Cancel or interrupt; False when the request has already ended."""
        if self.ended_s is not None or self.ended_by is not None:
            return False
        self.ended_by = how
        self.reason = reason
        self.scope.cancel()
        return True

    def run_until(self, deadline_s: float) -> None:
        """End the request at ``deadline_s`` (trio clock) if it still runs then."""
        self.scope.deadline = deadline_s

    def note_expiry(self) -> bool:
        """After the card's scope: True when it was the deadline that ended the request."""
        if self.ended_by is not None or not self.scope.cancelled_caught:
            return False
        self.ended_by = CardState.CANCELLED
        self.end_code = "DEADLINE_EXCEEDED"
        self.reason = "its deadline (X-Blazar-Deadline-Ms) passed while it ran"
        return True


_N = TypeVar("_N", int, float)


def _plus(have: _N | None, more: _N | None) -> _N | None:
    if more is None:
        return have
    return more if have is None else have + more


class Cards:
    def __init__(self, *, keep_finished: int = 1024) -> None:
        self.live: dict[str, Card] = {}
        self.finished: deque[Card] = deque(maxlen=keep_finished)

    def open(self, trace_id: str, path: str) -> Card:
        card = Card(trace_id=trace_id, path=path)
        self.live[trace_id] = card
        return card

    def close(
        self,
        card: Card,
        *,
        status: int,
        disconnected: bool,
        code: str | None = None,
        error: str | None = None,
    ) -> None:
        """The request ended with ``status`` (``code`` and ``error``: its failure, if any);
        a stream that failed after its ``200`` head (``note_failure``) ends ``failed``."""
        card.ended_s = time.perf_counter()
        card.status = status
        if status >= 400 and code is not None:
            card.note_failure(code, error or "")
        if card.ended_by is not None:
            card.state = card.ended_by
        elif disconnected:
            card.state = CardState.DISCONNECTED
        elif status >= 400 or card.failed_code is not None:
            card.state = CardState.FAILED
            card.reason = card.reason or card.failed_reason or None
        else:
            card.state = CardState.DONE
        self.live.pop(card.trace_id, None)
        self.finished.append(card)

    def get(self, card_id: str) -> Card | None:
        return self.live.get(card_id) or next((c for c in self.finished if c.trace_id == card_id), None)

    def all(self) -> list[Card]:
        return [*self.live.values(), *reversed(self.finished)]


def set_stream_enders(
    card: Card | None, cancelled: Callable[[str, str], bytes], interrupted: Callable[[], bytes]
) -> None:
    """How the stream of ``card``'s request ends when cancelled or interrupted from another
    connection."""
    if card is not None:
        card.enders = StreamEnders(cancelled=cancelled, interrupted=interrupted)
