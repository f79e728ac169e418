"""A small HTTP/1.1 client for the hot path from the gateway to an engine child.

Every relayed inference request crosses this client, so it does as little as
it can: ``actors.http1`` frames the bytes, trio moves them, and the pool is a deque of idle
keep-alive connections (LIFO, so the freshest is reused and the stalest
expire first). A connection carries one request at a time; while in use it
is out of the deque, so every pool operation is O(1) however many requests
are in flight. General-purpose clients (httpx) stay for the cold calls.

Closing a response before its end resets the socket: that is how a client
disconnect reaches llama.cpp, which stops generating when a write to its
connection fails. A reset makes the engine's very next write fail; after a
graceful close one more write would succeed (the reset only comes back in
answer to it), and the engine would read a whole further prompt step or
generate one more token for nobody. A connection goes back to the pool only after a complete response,
that left no stray bytes behind and did not ask for the connection's end.
"""

from __future__ import annotations

import os
import socket
import struct
import time
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import trio

from actors.http1 import Body, ProtocolError, ResponseHead, body_for, parse_head, request_head

__all__ = [
    "UpstreamBrokenError",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "nothing_received",
    "pool_for_url",
]

_READ_SIZE = 64 * 1024
_IO_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ProtocolError)


class UpstreamError(Exception):
    """A request to the upstream failed; the message says where and why."""


class UpstreamConnectError(UpstreamError):
    """No connection could be opened: nothing was sent."""


class UpstreamBrokenError(UpstreamError):
    """The connection broke or the upstream broke the protocol during the exchange."""


class _Unanswered(UpstreamBrokenError):
    """The connection failed before any byte of the response arrived."""


class _NoResponse(_Unanswered):
    """A kept connection failed before any byte of the response arrived, or closed without
    one: nothing was processed (the pool tries a new connection)."""


def nothing_received(exc: UpstreamError) -> bool:
    """Whether a request failed before the upstream answered anything: no connection could
    be opened, or the connection failed before the first byte of the response."""
    return isinstance(exc, (UpstreamConnectError, _Unanswered))


class _Connection:
    __slots__ = ("buf", "closing", "idle_since", "reused", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()  # received, not yet parsed
        self.idle_since = 0.0
        self.reused = False
        self.closing: Callable[[], None] | None = None
        """Told before the socket closes, by whoever waits on it outside trio (``watch_close``)."""

    async def receive(self) -> bytes:
        """What has arrived on the socket (``b""`` at its end), at most ``_READ_SIZE`` bytes,
        once it is readable.

        trio's ``receive_some`` tries a read first and takes its layers of context managers
        each time, which costs more than the read on a relayed stream; an engine's next
        event has seldom arrived yet when the last one has been relayed, so this waits
        first (a checkpoint) and then reads."""
        sock = self.stream.socket
        while True:
            await trio.lowlevel.wait_readable(sock)
            if (fd := sock.fileno()) < 0:
                raise trio.ClosedResourceError("the upstream connection was closed")
            try:
                return os.read(fd, _READ_SIZE)
            except BlockingIOError:
                pass

    def close(self) -> None:
        # A socket closes synchronously (a task blocked on it is woken with
        # ClosedResourceError), so this works in any state, cancelled or not.
        self._tell_closing()
        self.stream.socket.close()

    def reset(self) -> None:
        """Close with a TCP reset (no linger), so the peer's next write fails."""
        self._tell_closing()
        try:
            self.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _NO_LINGER)
        except OSError:
            pass
        self.stream.socket.close()

    def _tell_closing(self) -> None:
        closing, self.closing = self.closing, None
        if closing is not None:
            closing()


_NO_LINGER = struct.pack("ii", 1, 0)


async def _send(conn: _Connection, head: bytes, body: bytes) -> None:
    """Write a request: its head and body in one write when the body is small (the usual
    request), else one after the other. The socket takes a usual request whole at once;
    only what it does not take goes through trio's ``send_all``, whose layers cost more
    than the write itself."""
    data, rest = (head + body, b"") if len(body) <= _READ_SIZE else (head, body)
    stream = conn.stream
    sent = 0
    if (fd := stream.socket.fileno()) >= 0:
        try:
            sent = os.write(fd, data)
        except BlockingIOError:
            pass
    if sent < len(data):
        await stream.send_all(memoryview(data)[sent:])
    if rest:
        await stream.send_all(rest)


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to one ``host:port``, for one engine child.

    ``headers`` go with every request (the child's API key). At most
    ``max_idle`` idle connections are kept, none longer than ``idle_expiry_s``:
    llama.cpp drops idle keep-alive connections after about 5 s, so expiring
    ours first avoids most reuses of a socket it is closing; the rest are
    retried once on a fresh connection (see ``request``).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        headers: Mapping[str, str],
        max_idle: int,
        idle_expiry_s: float,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port
        self.max_idle = max_idle
        self.idle_expiry_s = idle_expiry_s
        self.connect_timeout_s = connect_timeout_s
        self.headers = dict(headers)
        """What goes with every request (the child's API key)."""
        self._headers: list[tuple[bytes, bytes]] = [(b"host", f"{host}:{port}".encode())]
        self._headers += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self._idle: deque[_Connection] = deque()
        self._active: set[_Connection] = set()
        self._closed = False
        self.connects = 0

    def __repr__(self) -> str:
        return (
            f"<UpstreamPool {self.host}:{self.port} idle={len(self._idle)} active={len(self._active)}"
            f" connects={self.connects}{' closed' if self._closed else ''}>"
        )

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        raw_headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> UpstreamResponse:
        """Send one request and return once the response head has arrived.

        A reused connection that fails before any byte of the response arrives
        was closed by the server while idle, so the request never reached it:
        it is sent once more on a fresh connection. The caller must ``aclose``
        the response (or read it to its end).
        """
        if self._closed:
            raise UpstreamError(f"the client for {self.host}:{self.port} is closed")
        head = self._headers.copy()
        if headers:
            head += [(k.encode(), v.encode()) for k, v in headers.items()]
        head += raw_headers
        head.append((b"content-length", b"%d" % len(body)))
        try:
            request = request_head(method, path, head)
        except ProtocolError as exc:
            raise UpstreamError(f"invalid request for {self.host}:{self.port}: {exc}") from exc
        conn = self._take_idle()
        if conn is not None:
            try:
                return await self._exchange(conn, method, request, body)
            except _NoResponse:
                pass
        return await self._exchange(await self._connect(), method, request, body)

    async def aclose(self) -> None:
        """Close every connection, idle or in use; later requests fail."""
        self._closed = True
        conns = [*self._idle, *self._active]
        self._idle.clear()
        self._active.clear()
        for conn in conns:
            conn.close()
        await trio.lowlevel.checkpoint()

    # -- internals --------------------------------------------------------

    def _take_idle(self) -> _Connection | None:
        idle = self._idle
        if not idle:
            return None
        conn = idle.pop()
        if time.monotonic() - conn.idle_since < self.idle_expiry_s:
            return conn
        # The freshest one has expired, so all the older ones have too.
        conn.close()
        while idle:
            idle.pop().close()
        return None

    def _release(self, conn: _Connection, reusable: bool) -> None:
        """A response ended: keep its connection for the next request if it can take one."""
        self._active.discard(conn)
        if self._closed or self.max_idle <= 0 or not reusable or conn.buf:
            conn.close()
            return
        conn.reused = True
        conn.idle_since = time.monotonic()
        if len(self._idle) >= self.max_idle:
            self._idle.popleft().close()
        self._idle.append(conn)

    def _discard(self, conn: _Connection) -> None:
        self._active.discard(conn)
        conn.close()

    async def _connect(self) -> _Connection:
        try:
            with trio.fail_after(self.connect_timeout_s):
                stream = await trio.open_tcp_stream(self.host, self.port)
        except trio.TooSlowError as exc:
            raise UpstreamConnectError(
                f"connecting to {self.host}:{self.port} timed out after {self.connect_timeout_s:g} s"
            ) from exc
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self.connects += 1
        if self._closed:  # closed while connecting
            stream.socket.close()
            raise UpstreamError(f"the client for {self.host}:{self.port} is closed")
        return _Connection(stream)  # trio's SocketStream sets TCP_NODELAY

    async def _exchange(
        self, conn: _Connection, method: str, request: bytes, body: bytes
    ) -> UpstreamResponse:
        self._active.add(conn)
        received = False
        try:
            await _send(conn, request, body)
            while (head := parse_head(conn.buf)) is None:
                data = await conn.receive()
                if not data:
                    if not received:
                        raise _NoResponse(self._broken("closed the connection without a response"))
                    raise ProtocolError("the connection closed inside the response head")
                received = True
                conn.buf += data
            return UpstreamResponse(self, conn, head, body_for(head, method))
        except _IO_ERRORS as exc:
            self._discard(conn)
            if received:
                raise UpstreamBrokenError(self._broken(f"broke the response head: {exc!r}")) from exc
            if conn.reused:
                raise _NoResponse(self._broken(f"failed before responding: {exc!r}")) from exc
            raise _Unanswered(self._broken(f"failed before responding: {exc!r}")) from exc
        except BaseException:
            self._discard(conn)
            raise

    def _broken(self, what: str) -> str:
        return f"the upstream at {self.host}:{self.port} {what}"


def pool_for_url(
    url: str, *, headers: Mapping[str, str], max_idle: int, idle_expiry_s: float, connect_timeout_s: float
) -> tuple[UpstreamPool, str] | None:
    """A pool for a plain ``http://`` base URL, and the URL's path prefix (to put before each
    request's path); None for any other URL (TLS, an IPv6 literal), which stays with httpx."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname
    if parts.scheme != "http" or not host or ":" in host:
        return None
    pool = UpstreamPool(
        host,
        parts.port or 80,
        headers=headers,
        max_idle=max_idle,
        idle_expiry_s=idle_expiry_s,
        connect_timeout_s=connect_timeout_s,
    )
    return pool, parts.path.rstrip("/")


class UpstreamResponse:
    """The status and head of one response; its body is read with ``aiter_raw`` or ``aread``.

    ``headers`` are (lower-case name, value) byte pairs. Reading to the end
    returns the connection to the pool; ``aclose`` before the end closes it.
    """

    __slots__ = (
        "_body",
        "_closed",
        "_complete",
        "_conn",
        "_error",
        "_head",
        "_pool",
        "headers",
        "status_code",
    )

    def __init__(self, pool: UpstreamPool, conn: _Connection, head: ResponseHead, body: Body) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._head = head
        self._body = body
        self.status_code = head.status_code
        self.headers: Sequence[tuple[bytes, bytes]] = head.headers
        self._complete = False
        self._closed = False
        self._error: UpstreamError | None = None
        """Why the body broke midway: said again to a later read."""

    def __repr__(self) -> str:
        state = "complete" if self._complete else "closed" if self._closed else "open"
        return f"<UpstreamResponse {self.status_code} {state}>"

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower case), if present."""
        return self._head.get(name)

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body bytes as they arrive (whatever is buffered is joined into one chunk)."""
        return _RawBody(self)

    async def aread(self) -> bytes:
        parts: list[bytes] = []
        while chunk := await self.receive_some():
            parts.append(chunk)
        return b"".join(parts)

    async def receive_some(self) -> bytes:
        """The next body bytes that have arrived, waiting for some if none have; ``b""`` at the end.

        What is buffered comes first; else it waits, then reads: a relayed engine's next event
        has seldom arrived yet when the last one has been relayed, so a read tried first
        would mostly fail."""
        data = self.read_nowait(read=False)
        while data is None:
            await self._wait()
            data = self.read_nowait()
        return data

    def read_nowait(self, *, read: bool = True) -> bytes | None:
        """The next body bytes without waiting: ``None`` while none have arrived, ``b""`` at
        the end. For a caller that waits for the socket (``fileno``) itself: one epoll over
        many streams (``blazar.web.asgi.pump``). At the end the connection goes back to the
        pool at once, within this call. ``read=False``: only what is buffered."""
        conn = self._conn
        if conn is None:
            if self._complete:
                return b""
            raise self._error or UpstreamError("the upstream response was closed before its end")
        body = self._body
        try:
            if not (data := body.decode(conn.buf)) and not body.done:
                if not read:
                    return None
                if (fd := conn.stream.socket.fileno()) < 0:
                    raise trio.ClosedResourceError("the upstream connection was closed")
                try:
                    received = os.read(fd, _READ_SIZE)
                except BlockingIOError:
                    return None
                if received:
                    conn.buf += received
                    if not (data := body.decode(conn.buf)) and not body.done:
                        return None
                else:
                    body.eof()
        except _IO_ERRORS as exc:
            self._conn = None
            self._error = UpstreamBrokenError(self._pool._broken(f"broke the response midway: {exc!r}"))
            self._pool._discard(conn)
            raise self._error from exc
        if body.done:
            self._complete = True
            self._conn = None
            self._pool._release(conn, reusable=self._head.keep_alive and not body.until_eof)
        return data

    async def _wait(self) -> None:
        conn = self._conn
        if conn is None or conn.stream.socket.fileno() < 0:
            await trio.lowlevel.checkpoint()  # the next read says why
            return
        try:
            await trio.lowlevel.wait_readable(conn.stream.socket)
        except trio.ClosedResourceError:
            pass  # the next read says so

    def fileno(self) -> int:
        """The connection's socket, while the body is being read; -1 after."""
        conn = self._conn
        return -1 if conn is None else conn.stream.socket.fileno()

    def watch_close(self, closing: Callable[[], None] | None) -> None:
        """Have ``closing`` called (once) before the connection is closed by anyone but the
        reader: a pool closed while an epoll outside trio waits on its socket. None: stop."""
        if self._conn is not None:
            self._conn.closing = closing

    async def aclose(self) -> None:
        """Idempotent. Before the end of the body this closes the connection, even when cancelled."""
        self.reset()

    def reset(self) -> None:
        """``aclose`` without waiting: for code that cannot await (a lease's release)."""
        if self._closed:
            return
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._active.discard(conn)
            conn.reset()


class _RawBody:
    __slots__ = ("_response",)

    def __init__(self, response: UpstreamResponse) -> None:
        self._response = response

    def __aiter__(self) -> _RawBody:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._response.receive_some()
        if not chunk:
            raise StopAsyncIteration
        return chunk
