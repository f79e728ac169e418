"""Resumable streams: a streamed answer kept in memory, so that a client whose connection
dropped reads what it missed and follows the rest (``GET /v1/stream``) instead of paying
for the generation again.

A request opts in (``X-Blazar-Resumable: on``, or ``[streams] resumable``); its route hands
the answer's byte stream to the store (``StreamStore.adopt``), which runs it to its end in
a task of its own (the pump) and numbers its SSE events (``id: N``). Each reader (the
request that made it, then each resume) is sent the kept events after a number and then
follows live. While nobody reads, the generation goes on for ``grace_s``; if no reader
comes back within it, the stream is cancelled as a disconnect cancels a plain stream (the
engine stops, its slot is freed) and ends with a ``STREAM_CANCELLED`` event. A finished
stream is kept ``keep_s``; the number of streams and each one's bytes are bounded. A stream
belongs to the key that made it: to any other key it does not exist.

One store per daemon (``open_streams``, from the gateway's construction); routes find it
with ``streams_of(runtime)``. Plain streams never come here and pay nothing.
"""

from __future__ import annotations

import bisect
import enum
import logging
import math
import secrets
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import msgspec
import trio

from actors.runtime import Runtime
from blazar.config import StreamsConfig
from blazar.errors import BlazarError
from blazar.serve.context import Cleanup

__all__ = [
    "RESUMABLE_HEADER",
    "STREAM_ID_HEADER",
    "Ender",
    "StreamInfo",
    "StreamReader",
    "StreamState",
    "StreamStore",
    "event_number",
    "open_streams",
    "streams_of",
]

log = logging.getLogger("blazar.serve")

RESUMABLE_HEADER = "x-blazar-resumable"
"""Where a request opts in (``on``) or out (``off``) of a resumable stream."""
STREAM_ID_HEADER = "X-Blazar-Stream-Id"
"""The answer's header that names a resumable stream."""

Ender = Callable[[str, str], bytes]
"""The event (in the stream's dialect) that ends a stream cut short: ``(code, message)``."""

_ON = frozenset({"on", "1", "true", "yes"})
_OFF = frozenset({"off", "0", "false", "no"})
_CLEANUP_S = 5.0


class StreamState(enum.StrEnum):
    LIVE = "live"
    """Still generating."""
    DONE = "done"
    """Ended as the engine ended it (its last event may be an engine error)."""
    CANCELLED = "cancelled"
    """Cut short: nobody read it within its grace, it was deleted, or the daemon stopped."""
    FAILED = "failed"
    """The gateway's own stream failed (a bug: the daemon's log has it)."""


class StreamInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A stream as ``POST /v1/streams/lookup`` and ``DELETE /v1/stream`` describe it."""

    id: str
    object: str = "blazar.stream"
    state: StreamState
    model: str | None
    created_at: float
    ended_at: float | None
    last_event_id: int
    """The number of its newest event (0: none yet)."""
    first_event_id: int
    """The oldest event still kept (events before it were dropped for its size limit)."""
    bytes: int
    readers: int
    expires_at: float | None
    """When a finished stream is dropped (a live one is kept while it runs)."""


def event_number(raw: str, name: str) -> int:
    """The event number a client sent (``Last-Event-ID`` or ``last_event_id``): what it has
    read up to. Anything but a non-negative integer is refused, naming ``name``."""
    value = raw.strip()
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise BlazarError(
            "BAD_REQUEST",
            f"invalid {name}: {raw[:40]!r} is not an event id — send the number of the last `id:` "
            "line read (0 or none for the whole stream)",
            param=name,
        )
    return int(value)


def _is_keepalive(event: bytes) -> bool:
    """An event only there to keep the connection open (an SSE comment, Anthropic's ``ping``):
    kept but not numbered, so each event a client's SDK hands on has the next number."""
    return event.startswith(b"event: ping\n") or all(line.startswith(b":") for line in event.split(b"\n"))


class _Stream:
    """One kept stream: its framed events and who reads it. Owned by the store; fed by its pump."""

    def __init__(self, stream_id: str, *, owner: str | None, model: str | None, ender: Ender) -> None:
        self.id = stream_id
        self.owner = owner
        self.model = model
        self.ender = ender
        self.created_at = time.time()
        self.ended_at: float | None = None
        self.ended_t: float | None = None
        self.state = StreamState.LIVE
        self.reason: str | None = None
        """Why it was cancelled, when something asked for it (a delete)."""
        self.events: list[bytes] = []
        """Each kept event, framed as sent (``id: N`` first; a keep-alive has no number)."""
        self.numbers: list[int] = []
        """The number of each kept event (a keep-alive: that of the event before it)."""
        self.base = 0
        """How many events were dropped from the front (the position of ``events[0]``)."""
        self.dropped = 0
        """The highest event number no longer kept."""
        self.last = 0
        self.size = 0
        self.readers = 0
        self.scope = trio.CancelScope()
        self.changed = trio.Event()
        self._partial = b""

    # -- fed by the pump -------------------------------------------------------------------

    def feed(self, chunk: bytes, max_bytes: int) -> None:
        data = self._partial + chunk if self._partial else chunk
        *complete, self._partial = data.split(b"\n\n")
        kept = False
        for event in complete:
            if event.strip(b"\n"):
                self._keep(event.strip(b"\n"), max_bytes)
                kept = True
        if kept:
            self._wake()

    def _keep(self, event: bytes, max_bytes: int) -> None:
        if _is_keepalive(event):
            framed = event + b"\n\n"
        else:
            self.last += 1
            framed = b"id: %d\n%b\n\n" % (self.last, event)
        self.events.append(framed)
        self.numbers.append(self.last)
        self.size += len(framed)
        while self.size > max_bytes and len(self.events) > 1:
            self.size -= len(self.events.pop(0))
            self.dropped = max(self.dropped, self.numbers.pop(0))
            self.base += 1

    def end(self, state: StreamState, tail: bytes, max_bytes: int) -> None:
        if self._partial.strip():
            self._keep(self._partial.strip(b"\n"), max_bytes)
        self._partial = b""
        if tail:
            self._keep(tail.strip(b"\n"), max_bytes)
        self.state = state
        self.ended_at, self.ended_t = time.time(), trio.current_time()
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    # -- readers ------------------------------------------------------------------------------

    def attach(self) -> None:
        self.readers += 1
        self.scope.deadline = math.inf

    def detach(self, grace_s: float) -> None:
        self.readers -= 1
        if self.readers == 0 and self.state is StreamState.LIVE:
            self.scope.deadline = trio.current_time() + grace_s

    def info(self, keep_s: float) -> StreamInfo:
        return StreamInfo(
            id=self.id,
            state=self.state,
            model=self.model,
            created_at=self.created_at,
            ended_at=self.ended_at,
            last_event_id=self.last,
            first_event_id=self.dropped + 1,
            bytes=self.size,
            readers=self.readers,
            expires_at=self.ended_at + keep_s if self.ended_at is not None else None,
        )


class StreamReader:
    """The events of one stream after a number, then live ones until its end. Closing it
    (the gateway does, however the client's connection ends) lets the stream's grace begin
    once nobody else reads it."""

    def __init__(self, stream: _Stream, after: int, grace_s: float) -> None:
        self._stream = stream
        self._grace_s = grace_s
        self._pos = stream.base + bisect.bisect_right(stream.numbers, after)
        self._closed = False
        stream.attach()

    def __aiter__(self) -> StreamReader:
        return self

    async def __anext__(self) -> bytes:
        s = self._stream
        while not self._closed:
            at = self._pos - s.base
            if at < 0:  # this reader fell behind what the stream keeps
                self._pos = s.base
                message = f"stream {s.id} dropped events this reader had not been sent (its size limit)"
                self.close()
                return s.ender("STREAM_EVENTS_GONE", message)
            if at < len(s.events):
                self._pos = s.base + len(s.events)
                return b"".join(s.events[at:])
            if s.state is not StreamState.LIVE:
                break
            await s.changed.wait()
        self.close()
        raise StopAsyncIteration

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._stream.detach(self._grace_s)

    async def aclose(self) -> None:
        self.close()


_STORES: weakref.WeakKeyDictionary[Runtime, StreamStore] = weakref.WeakKeyDictionary()


def open_streams(runtime: Runtime, config: StreamsConfig) -> StreamStore:
    """The daemon's one store of resumable streams, its sweeper started in the runtime."""
    store = StreamStore(config, runtime.start_soon)
    _STORES[runtime] = store
    runtime.start_soon(store.sweep_forever)
    return store


def streams_of(runtime: Runtime) -> StreamStore | None:
    """The store ``open_streams`` made for ``runtime``; None where none was (an embedder)."""
    return _STORES.get(runtime)


class StreamStore:
    """Every resumable stream of the daemon, by id (oldest first): the sole owner of their
    buffers. Pumps run in ``background`` (the runtime's nursery), outliving their requests."""

    def __init__(
        self, config: StreamsConfig, background: Callable[[Callable[[], Awaitable[object]]], None]
    ) -> None:
        self.config = config
        self._background = background
        self._max_bytes = config.max_stream_kb * 1024
        self._streams: dict[str, _Stream] = {}

    def wants(self, header: str | None) -> bool:
        """Whether a streamed answer is to be resumable: its request's header, else the config."""
        if header is None:
            return self.config.resumable
        value = header.strip().lower()
        if value in _ON:
            return True
        if value in _OFF:
            return False
        raise BlazarError(
            "BAD_REQUEST",
            f"invalid X-Blazar-Resumable header: {header[:40]!r} — write `on` or `off`",
            param="X-Blazar-Resumable",
        )

    def adopt(
        self,
        inner: AsyncIterator[bytes],
        *,
        owner: str | None,
        model: str | None,
        ender: Ender,
        cleanups: Sequence[Cleanup] = (),
    ) -> tuple[str, StreamReader]:
        """Keep ``inner`` (an SSE byte stream) as a new stream of ``owner``: its pump runs it to
        the end, then closes it and runs ``cleanups``. Returns its id and a reader from its
        first event, for the request that made it."""
        self.sweep()
        if len(self._streams) >= self.config.max_streams:
            finished = next((s for s in self._streams.values() if s.state is not StreamState.LIVE), None)
            if finished is None:
                raise BlazarError(
                    "STREAM_STORE_FULL",
                    f"{len(self._streams)} resumable streams are live, the most `[streams] max_streams` "
                    "allows — retry later, or stream without `X-Blazar-Resumable`",
                    retry_after_s=self.config.grace_s,
                )
            del self._streams[finished.id]
        stream = _Stream("strm_" + secrets.token_urlsafe(18), owner=owner, model=model, ender=ender)
        self._streams[stream.id] = stream
        reader = StreamReader(stream, 0, self.config.grace_s)

        async def pump() -> None:
            await self._pump(stream, inner, cleanups)

        self._background(pump)
        return stream.id, reader

    async def _pump(self, s: _Stream, inner: AsyncIterator[bytes], cleanups: Sequence[Cleanup]) -> None:
        completed = failed = False
        try:
            with s.scope:
                async for chunk in inner:
                    if chunk:
                        s.feed(chunk, self._max_bytes)
                completed = True
        except Exception:
            log.exception("resumable stream %s failed", s.id)
            failed = True
        finally:
            with trio.CancelScope(shield=True):
                aclose = getattr(inner, "aclose", None)
                if aclose is not None:
                    with trio.move_on_after(_CLEANUP_S):
                        await aclose()
                for fn in reversed(cleanups):
                    with trio.move_on_after(_CLEANUP_S):
                        await fn()
            if completed:
                s.end(StreamState.DONE, b"", self._max_bytes)
            elif failed:
                tail = s.ender("INTERNAL", f"resumable stream {s.id} failed; see the daemon's log")
                s.end(StreamState.FAILED, tail, self._max_bytes)
            else:
                reason = s.reason or (
                    f"nobody read it for {self.config.grace_s:g} s"
                    if s.scope.cancelled_caught
                    else "the daemon stopped"
                )
                tail = s.ender("STREAM_CANCELLED", f"stream {s.id} was cancelled: {reason}")
                s.end(StreamState.CANCELLED, tail, self._max_bytes)

    def _get(self, stream_id: str, owner: str | None) -> _Stream:
        self.sweep()
        s = self._streams.get(stream_id)
        if s is None or s.owner != owner:  # another key's stream: as if it did not exist
            raise BlazarError(
                "STREAM_NOT_FOUND",
                f"no resumable stream {stream_id[:64]!r} for this key — a stream is kept "
                f"{self.config.keep_s:g} s after its end and only for the key that made it; "
                "POST /v1/streams/lookup lists yours",
            )
        return s

    def read(self, stream_id: str, owner: str | None, after: int) -> StreamReader:
        """A reader of ``owner``'s stream from the event after ``after`` (what was read)."""
        s = self._get(stream_id, owner)
        if after > s.last:
            raise BlazarError(
                "BAD_REQUEST",
                f"invalid Last-Event-ID: {after} is past stream {s.id}'s newest event ({s.last})",
                param="Last-Event-ID",
            )
        if after < s.dropped:
            raise BlazarError(
                "STREAM_EVENTS_GONE",
                f"stream {s.id} no longer keeps the events after {after}: its oldest kept event is "
                f"{s.dropped + 1} (`[streams] max_stream_kb`) — send the request again",
            )
        return StreamReader(s, after, self.config.grace_s)

    def delete(self, stream_id: str, owner: str | None) -> StreamInfo:
        """Drop ``owner``'s stream; a live one's generation is cancelled (its readers get
        its ``STREAM_CANCELLED`` event)."""
        s = self._get(stream_id, owner)
        del self._streams[s.id]
        if s.state is StreamState.LIVE:
            s.reason = "it was deleted"
            s.scope.cancel()
        return s.info(self.config.keep_s)

    def cancel(self, stream_id: str, reason: str) -> None:
        """Cancel a live stream's generation (its request was cancelled from outside)."""
        s = self._streams.get(stream_id)
        if s is not None and s.state is StreamState.LIVE:
            s.reason = reason
            s.scope.cancel()

    def lookup(
        self,
        owner: str | None,
        *,
        ids: Sequence[str] | None = None,
        state: StreamState | None = None,
        limit: int = 100,
    ) -> list[StreamInfo]:
        """``owner``'s streams, newest first: those of ``ids`` (others' and unknown ones left
        out), in ``state``, at most ``limit``."""
        self.sweep()
        if ids is not None:
            wanted = set(ids)
            found = [s for s in self._streams.values() if s.id in wanted]
        else:
            found = list(self._streams.values())
        found = [s for s in found if s.owner == owner and (state is None or s.state is state)]
        return [s.info(self.config.keep_s) for s in reversed(found)][:limit]

    def sweep(self) -> None:
        """Drop the finished streams past their ``keep_s``."""
        now = trio.current_time()
        keep = self.config.keep_s
        gone = [i for i, s in self._streams.items() if s.ended_t is not None and now - s.ended_t >= keep]
        for stream_id in gone:
            del self._streams[stream_id]

    async def sweep_forever(self) -> None:
        period = min(max(self.config.keep_s / 2, 0.05), 30.0)
        while True:
            await trio.sleep(period)
            self.sweep()

    def __len__(self) -> int:
        return len(self._streams)
