"""A streamed answer's body chunks written straight to the client's socket.

A relayed stream sends one body message per read from the engine. Through the server,
each such message is an ASGI dict, then hypercorn's own event, then an h11 event framed
into bytes, then the connection's send lock and a socket write, with two cancel scopes,
a handful of context managers and two trips through trio's scheduler on the way: several
times what relaying the chunk costs the gateway itself. On a plain (not TLS) HTTP/1.1
connection, ``BodyWriter`` does what that path does for a chunk in one step: it frames the
chunk as h11 frames this response's body (it asks h11 for the first chunk, and frames the
next ones itself when h11 chose the chunked coding), checks that the connection's send
lock is free (one request at a time is answered on an HTTP/1.1 connection) and writes the
bytes to the socket at once. Only when the socket cannot take them all does it take the
lock and wait, shielded as hypercorn's own write is, for the rest to go out: a partial
chunk left behind would corrupt the stream.

The head of the answer and its end still go through the server, which keeps its state
(h11 counts nothing per chunk of a chunked body). Whenever the fast path does not apply
(the lock is held, the socket is closed or fails) the chunk goes the ordinary way, and the
server reports a broken connection as it always does. The writer never passes a
checkpoint in the usual case: the stream it writes reaches one per chunk where it reads
the engine (``actors.upstream``).

Once a chunk has shown how the body is framed, ``pipe`` can hand the rest of a stream that
needs nothing done per chunk to the process's pump (``pump.py``): one epoll for all such
streams, so a chunk costs a read and a write and no task wake. It holds the send lock
until the stream ends, as a waiting write does.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio

from blazar.web.asgi.pump import BROKEN, Source, current_pump

__all__ = ["DIRECT_BODY", "WATCH_GONE", "BodyWriter"]

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


class BodyWriter:
    """Writes the body chunks of one answer on one HTTP/1.1 connection (see the module)."""

    __slots__ = ("_chunked", "_h11", "_lock", "_send", "_socket", "_usable", "hold")

    def __init__(
        self,
        socket: trio.socket.SocketType,
        lock: trio.Lock,
        h11_connection: Callable[[], h11.Connection | None],
        send: Callable[[dict[str, Any]], Awaitable[None]],
        hold: Callable[[], None] = lambda: None,
    ) -> None:
        self._socket = socket
        self._lock = lock
        self._h11 = h11_connection
        self._send = send
        """The server's own send: the ordinary way."""
        self.hold = hold
        """Called before the head of a whole answer, whose body follows at once: the
        connection keeps the head and writes it with the body, one write for both."""
        self._chunked = False
        self._usable = True

    async def write(self, data: bytes) -> None:
        """Send ``data`` as the next part of the body (``more_body``); never empty."""
        lock = self._lock
        if not self._usable or lock.locked():
            await self._ordinary(data)
            return
        framed = b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else self._first(data)
        if framed is None:
            await self._ordinary(data)
            return
        # No other task runs from the check of the lock to the end of a write that needs no
        # wait, so only a wait takes the lock.
        fd = self._socket.fileno()
        sent = -1
        if fd >= 0:
            try:
                sent = os.write(fd, framed)
            except BlockingIOError:
                sent = 0
            except OSError:
                sent = -1
        if 0 <= sent < len(framed):
            lock.acquire_nowait()
            try:
                with trio.CancelScope(shield=True):
                    sent = await self._rest(framed, sent)
            finally:
                lock.release()
        if sent < 0:
            # Closed or broken: the server's own write meets the same failure and handles it
            # (the client's disconnect ends the request). Nothing reaches a broken peer, so
            # the bytes that may have gone out before do not matter.
            self._usable = False
            await self._ordinary(data)

    def _first(self, data: bytes) -> bytes | None:
        """The first chunk, framed by h11 itself (which checks that a body may be sent now);
        its framing tells whether the next ones may be framed here."""
        connection = self._h11()
        if connection is None:
            self._usable = False
            return None
        try:
            framed = connection.send(h11.Data(data=data))
        except h11.LocalProtocolError:
            self._usable = False
            return None
        self._chunked = framed == b"%x\r\n%b\r\n" % (len(data), data)
        # Another framing (HTTP/1.0's, to the connection's end) stays h11's for every chunk.
        self._usable = self._chunked
        return framed

    async def _rest(self, framed: bytes, sent: int) -> int:
        """Write what the socket did not take at once; -1 when it fails."""
        view = memoryview(framed)
        try:
            while sent < len(framed):
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
        ``on_chunk`` first. False when it cannot (the body's framing is not known yet or is
        not chunked, the lock is held, the connection failed): write chunk by chunk then.
        True once the flow has ended: at the body's end, or when the source failed (its next
        read says why) or the client's socket did (handled as ``write`` handles it)."""
        lock = self._lock
        if not (self._usable and self._chunked) or lock.locked() or (fd := self._socket.fileno()) < 0:
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
                        self._usable = False
                        with contextlib.suppress(OSError):
                            self._socket.shutdown(socket.SHUT_RDWR)
        finally:
            lock.release()
        if flow.outcome == BROKEN:
            self._usable = False
            await self._ordinary(flow.unsent)
        return True

    async def _ordinary(self, data: bytes) -> None:
        with trio.CancelScope(shield=True):
            await self._send({"type": "http.response.body", "body": data, "more_body": True})
