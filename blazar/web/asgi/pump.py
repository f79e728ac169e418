"""One epoll for every relayed stream in the process: an engine's chunk to the client
without a trio task wake.

A relayed stream read through trio costs, per chunk, a task parked on the engine's
socket, an ``epoll_ctl`` to arm it again, a trip through the scheduler to wake the task,
and the layers of the iterator that hands the chunk on; the read and the write
themselves are a small part of it. At hundreds of streams that is most of what the daemon
does. Here a stream that needs nothing done per chunk (the engine speaks the client's
dialect, nothing renames or filters it: ``UpstreamStream.pipe_into``) is handed over
whole: its engine socket joins one epoll set of the pump's own, and one trio task waits
on that epoll's descriptor. When it wakes, every stream with bytes waiting is served in
turn, each with a read, its body decoded, the chunk framed and written to the client's
socket, and counted; the request's task sleeps until its stream ends.

Backpressure is the socket's: a chunk the client's socket does not take whole is kept,
the engine's socket leaves the set and the client's joins it for writability, so nothing
more is read from the engine until the client has taken the rest (the engine then waits
in its own write, as it would for a slow client of its own). A partial chunk is never
left behind: a request cancelled while one is pending still writes it out first, as the
direct writer's own wait does.

The flow ends when the body ends (the connection is back in its pool before the set lets
go of it, in the same step), when the engine's connection breaks (the error goes back to
the request, which answers it in its dialect), when the client's socket fails, or when
the request is cancelled (a client disconnect, a deadline): then the sockets leave the
set before anyone closes them. One flow's fault ends that flow alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
from collections.abc import Callable
from typing import Protocol

import trio

__all__ = ["BROKEN", "END", "FAILED", "Flow", "Pump", "Source", "current_pump"]

log = logging.getLogger("blazar.pump")

END = "end"
"""The body ended whole."""
BROKEN = "broken"
"""The client's socket failed: the caller's connection takes its client as gone."""
FAILED = "failed"
"""The source failed (its connection broke or was closed): its next read says why."""

_IN = select.EPOLLIN | select.EPOLLRDHUP
_OUT = select.EPOLLOUT


class Source(Protocol):
    """A response body read without waiting (``actors.upstream.UpstreamResponse``)."""

    def fileno(self) -> int: ...

    def read_nowait(self, *, read: bool = True) -> bytes | None: ...

    def watch_close(self, closing: Callable[[], None] | None) -> None: ...


class Flow:
    """One stream handed to the pump: from ``source`` to the client's socket ``out``,
    each chunk given to ``on_chunk`` and framed as an HTTP/1.1 chunk."""

    __slots__ = (
        "_in",
        "_on_chunk",
        "_out",
        "_pending",
        "_pump",
        "_source",
        "_source_done",
        "_stopped",
        "ended",
        "outcome",
    )

    def __init__(self, pump: Pump, source: Source, out: int, on_chunk: Callable[[bytes], None]) -> None:
        self._pump = pump
        self._source = source
        self._in = source.fileno()
        self._out = out
        self._on_chunk = on_chunk
        self._pending: memoryview | None = None
        """What the client's socket has yet to take of a framed chunk."""
        self._source_done = False
        """Nothing more is read from the source (its body ended, or the request stops)."""
        self._stopped = False
        self.ended = trio.Event()
        self.outcome: str | None = None
        """``END``, ``BROKEN`` or ``FAILED``; None while it runs (or once stopped)."""

    @property
    def pending(self) -> bool:
        """Whether part of a chunk is still to be written."""
        return self._pending is not None

    def readable(self) -> None:
        """The source's socket has something (bytes, its end or an error)."""
        try:
            data = self._source.read_nowait()
        except Exception:  # the source keeps its error for the request's next read
            self._finish(FAILED)
            return
        if data is None:
            return
        if not data:
            self._finish(END)
            return
        if self._source.fileno() < 0:
            # The body ended with this chunk and its connection went back to the pool (or
            # closed): the set lets go of it before anyone else can wait on it.
            self._source_done = True
            self._pump.unwatch(self._in, self)
        self._on_chunk(data)
        self._write(b"%x\r\n%b\r\n" % (len(data), data))
        if self._source_done and self._pending is None:
            self._finish(END)

    def writable(self) -> None:
        """The client's socket takes bytes again."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._write(pending)
        if self._pending is None and not self.ended.is_set():
            if self._source_done:
                self._finish(None if self._stopped else END)
            else:
                self._pump.unwatch(self._out, self)
                self._pump.watch(self._in, _IN, self)

    def _write(self, data: bytes | memoryview) -> None:
        """Write ``data`` (a framed chunk, or what is left of it); keep what the socket does
        not take, and wait for it to take more."""
        try:
            sent = os.write(self._out, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._finish(BROKEN)
            return
        if sent < len(data):
            self._pending = memoryview(data)[sent:]
            if not self._source_done:
                self._pump.unwatch(self._in, self)
            self._pump.watch(self._out, _OUT, self)

    def stop_reading(self) -> None:
        """Read no more from the source (the request is being cancelled); a partial chunk
        is still written out, and the flow ends then."""
        self._source_done = self._stopped = True
        self._pump.unwatch(self._in, self)
        self._source.watch_close(None)
        if self._pending is None:
            self._finish(None)

    def abandon(self) -> None:
        """End the flow with a partial chunk still unwritten: the caller ends the connection."""
        self._finish(None)

    def source_closing(self) -> None:
        """The source's connection is being closed under the flow (its pool was closed)."""
        self._finish(FAILED)

    def _finish(self, outcome: str | None) -> None:
        if self.ended.is_set():
            return
        self._pump.unwatch(self._in, self)
        self._pump.unwatch(self._out, self)
        self._source.watch_close(None)
        self.outcome = outcome
        self.ended.set()

    def fail(self, exc: BaseException) -> None:
        """A fault of the flow's own code: it ends, and the others go on."""
        log.error("a relayed stream failed in the pump", exc_info=exc)
        self._finish(FAILED)


class Pump:
    """The epoll set and the one task that serves it (``current_pump``)."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._flows: dict[int, Flow] = {}
        self._running = False

    def start(self, source: Source, out: int, on_chunk: Callable[[bytes], None]) -> Flow:
        """Hand over a stream; ``Flow.ended`` is set when it ends."""
        if not self._running:
            trio.lowlevel.spawn_system_task(self._run, name="blazar.pump")
            self._running = True
        flow = Flow(self, source, out, on_chunk)
        if flow._in < 0:  # the body has ended already (or broke): the iteration sees which
            flow._finish(END)
            return flow
        source.watch_close(flow.source_closing)
        self.watch(flow._in, _IN, flow)
        # Bytes may have arrived before the handover, after the last wait: look now.
        flow.readable()
        return flow

    def watch(self, fd: int, events: int, flow: Flow) -> None:
        held = self._flows.get(fd)
        self._flows[fd] = flow
        if held is None:
            try:
                self._epoll.register(fd, events)
            except FileExistsError:  # a stale entry: its socket closed and the number came back
                self._epoll.modify(fd, events)
        else:
            self._epoll.modify(fd, events)

    def unwatch(self, fd: int, flow: Flow) -> None:
        """Take ``fd`` out of the set, where ``flow`` still holds it."""
        if self._flows.get(fd) is not flow:
            return
        del self._flows[fd]
        with contextlib.suppress(OSError):  # already closed: the kernel dropped it
            self._epoll.unregister(fd)

    async def _run(self) -> None:
        epoll, flows = self._epoll, self._flows
        while True:
            await trio.lowlevel.wait_readable(epoll)
            for fd, _events in epoll.poll(0):
                flow = flows.get(fd)
                if flow is None:
                    continue
                try:
                    if fd == flow._out:
                        flow.writable()
                    else:
                        flow.readable()
                except Exception as exc:
                    flow.fail(exc)


_PUMP: trio.lowlevel.RunVar[Pump] = trio.lowlevel.RunVar("blazar_pump")


def current_pump() -> Pump:
    """This trio run's pump, made at first use."""
    try:
        return _PUMP.get()
    except LookupError:
        pump = Pump()
        _PUMP.set(pump)
        return pump
