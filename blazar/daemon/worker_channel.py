"""A data-plane worker's connections to the runtime's channel (``blazar/web/asgi/channel.py``).

Each connection carries one request at a time and is kept for the next once its answer
(and a handed-off stream's report) is done. One that is cut off midway (its client left,
the relay was cancelled) is closed instead: the runtime reads that as the client's
disconnect and frees what the request held.
"""

from __future__ import annotations

import socket as stdlib_socket

import trio

from blazar.web.asgi.channel import ChannelClosed, ChannelConnection, Hello, Open

__all__ = ["RuntimeChannel", "connect_unix"]

_MAX_FRAME = 2**32 - 1
_CONNECT_S = 10.0
"""How long a new connection may wait for room in the runtime's backlog."""


async def connect_unix(path: str, wait_s: float = _CONNECT_S) -> trio.socket.SocketType:
    """A connected Unix stream socket to ``path`` (a Linux abstract name starts with NUL).

    A Unix socket's connect does not wait: it is done at once, or refused with EAGAIN while
    the listener's backlog is full (a burst of new streams), tried again here shortly after,
    for up to ``wait_s``. (trio's own connect takes EAGAIN for "in progress" and hands back
    a socket that is not connected.) Raises ``OSError`` otherwise."""
    deadline = trio.current_time() + wait_s
    delay = 0.001
    while True:
        raw = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
        raw.setblocking(False)
        try:
            raw.connect(path)
            return trio.socket.from_stdlib_socket(raw)
        except BlockingIOError:
            raw.close()
            if trio.current_time() + delay > deadline:
                raise
            await trio.sleep(delay)
            delay = min(delay * 2, 0.05)
        except BaseException:
            raw.close()
            raise


class RuntimeChannel:
    """The worker's pool of channel connections to the runtime."""

    def __init__(self, path: str, token: str, max_idle: int = 256) -> None:
        self._path = path
        self._token = token
        self._max_idle = max_idle
        self._idle: list[ChannelConnection] = []

    async def open(self, request: Open) -> ChannelConnection:
        """Send ``request`` on a kept connection, or a new one; ``ChannelClosed`` where the
        runtime cannot be reached. A kept connection the runtime has closed has read
        nothing of the request: it is sent again on a new one."""
        while self._idle:
            conn = self._idle.pop()
            try:
                await conn.write(request)
                return conn
            except ChannelClosed:
                conn.close()
        conn = await self._connect()
        try:
            await conn.write(request)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _connect(self) -> ChannelConnection:
        try:
            sock = await connect_unix(self._path)
        except OSError as exc:
            raise ChannelClosed(f"the runtime's channel does not answer: {exc}") from exc
        conn = ChannelConnection(sock, _MAX_FRAME)
        try:
            await conn.write(Hello(self._token))
        except BaseException:
            conn.close()
            raise
        return conn

    def keep(self, conn: ChannelConnection) -> None:
        """A connection whose request is done, for the next one."""
        if len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
