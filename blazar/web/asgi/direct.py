"""An HTTP/1.1 answer's bytes written straight to the client's socket.

``BodyWriter`` is the writing half of the daemon's own HTTP/1.1 connection (``h1.py``):
the head, a whole answer and each chunk of a streamed one go to the socket in one
``os.write`` where the socket takes them at once, which it nearly always does. Only when
it cannot take them all does the writer take the connection's send lock and wait,
shielded, for the rest to go out: a partial chunk left behind would corrupt the stream,
and a second write must not slip in between. A failed write is the client's going: the
connection is told (``broken``), and what is written after it goes nowhere.

The gateway reaches the writer through the ``DIRECT_BODY`` scope extension: a stream's
chunks (``write``, framed as the connection chose) go out with no ASGI message at all,
and ``pipe`` hands the rest of a stream that needs nothing done per chunk to the
process's pump (``pump.py``): one epoll for all such streams, so a chunk costs a read and
a write and no task wake. It holds the send lock until the stream ends, as a waiting
write does.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable

import trio

from blazar.web.asgi.pump import BROKEN, Source, current_pump

__all__ = ["CHUNKED", "DIRECT_BODY", "NO_BODY", "RAW", "WATCH_GONE", "BodyWriter"]

_DRAIN_S = 5.0
"""How long a cancelled pipe waits for the client to take a partial chunk before it ends
the connection instead."""

DIRECT_BODY = "blazar.direct_body"
"""The ASGI scope extension under which a connection offers its ``BodyWriter``."""

WATCH_GONE = "blazar.watch_gone"
"""The ASGI scope extension under which a connection offers to tell the request when its
client goes: a callable taking a callable, called once then (at once if the client has
gone already), or None to stop. It is what a task of the request's own reading
``http.disconnect`` would learn, without the task (which costs more than many a request).
Offered where one connection carries one request at a time: HTTP/1.1 (the listener's) and
the workers' channel; not HTTP/2, whose streams end without their connection."""

NO_BODY, RAW, CHUNKED = 0, 1, 2
"""How the answer's body goes out: not at all (``HEAD``, ``204``, ``304``), as it is
(a declared length, or to the connection's end), or in HTTP/1.1 chunks."""


def _nothing() -> None:
    pass


class BodyWriter:
    """Writes one HTTP/1.1 connection's bytes (see the module)."""

    __slots__ = ("_broken", "_lock", "_socket", "dead", "framing", "hold")

    def __init__(
        self,
        sock: trio.socket.SocketType,
        lock: trio.Lock,
        broken: Callable[[], None] = _nothing,
        hold: Callable[[], None] = _nothing,
    ) -> None:
        self._socket = sock
        self._lock = lock
        self._broken = broken
        self.hold = hold
        """Called before the head of a whole answer, whose body follows at once: the
        connection keeps the head and writes it with the body, one write for both."""
        self.framing = CHUNKED
        """The answer's body framing (``NO_BODY``, ``RAW``, ``CHUNKED``), set with its head."""
        self.dead = False
        """A write failed: the client is gone."""

    async def write(self, data: bytes) -> None:
        """Send ``data`` as the next part of the body (``more_body``); never empty."""
        framing = self.framing
        if framing == CHUNKED:
            await self.send(b"%x\r\n%b\r\n" % (len(data), data))
        elif framing == RAW:
            await self.send(data)

    async def send(self, data: bytes) -> bool:
        """Write ``data`` whole; False where the client is gone (the connection is told)."""
        if self.dead:
            return False
        lock = self._lock
        if lock.locked():  # another write waits for the socket: after it
            with trio.CancelScope(shield=True):
                async with lock:
                    sent = await self._rest(data, 0)
        else:
            # No other task runs from the check of the lock to the end of a write that needs
            # no wait, so only a wait takes the lock.
            sent = -1
            if (fd := self._socket.fileno()) >= 0:
                try:
                    sent = os.write(fd, data)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    sent = -1
            if 0 <= sent < len(data):
                lock.acquire_nowait()
                try:
                    with trio.CancelScope(shield=True):
                        sent = await self._rest(data, sent)
                finally:
                    lock.release()
        if sent < 0:
            self._fail()
            return False
        return True

    def _fail(self) -> None:
        if not self.dead:
            self.dead = True
            self._broken()

    async def _rest(self, data: bytes, sent: int) -> int:
        """Write what the socket did not take at once; -1 when it fails."""
        view = memoryview(data)
        try:
            while sent < len(data):
                await trio.lowlevel.wait_writable(self._socket)
                fd = self._socket.fileno()
                if fd < 0:
                    return -1
                try:
                    sent += os.write(fd, view[sent:])
                except BlockingIOError:
                    pass
        except (OSError, trio.ClosedResourceError):
            return -1
        return sent

    async def pipe(self, source: Source, on_chunk: Callable[[bytes], None]) -> bool:
        """Relay the rest of ``source``'s body through the pump, each chunk given to
        ``on_chunk`` first. False when it cannot (the body is not chunked, the lock is
        held, the connection failed): write chunk by chunk then. True once the flow has
        ended: at the body's end, or when the source failed (its next read says why) or
        the client's socket did (the connection is told, as ``send`` tells it)."""
        lock = self._lock
        if self.dead or self.framing != CHUNKED or lock.locked() or (fd := self._socket.fileno()) < 0:
            return False
        lock.acquire_nowait()
        try:
            flow = current_pump().start(source, fd, on_chunk)
            try:
                await flow.ended.wait()
            finally:
                if not flow.ended.is_set():  # cancelled
                    flow.stop_reading()
                    if flow.pending:  # a partial chunk would corrupt the stream
                        with trio.CancelScope(shield=True), trio.move_on_after(_DRAIN_S):
                            await flow.ended.wait()
                    if not flow.ended.is_set():
                        # The client takes nothing (it stopped reading, or half-closed): the
                        # connection cannot carry another answer, and is ended.
                        flow.abandon()
                        self._fail()
                        with contextlib.suppress(OSError):
                            self._socket.shutdown(socket.SHUT_RDWR)
        finally:
            lock.release()
        if flow.outcome == BROKEN:
            self._fail()
        return True
