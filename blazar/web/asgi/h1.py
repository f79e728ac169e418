"""The daemon's own HTTP/1.1 server for plain connections: a request for a fraction of
what hypercorn's costs.

Through hypercorn a request's head is parsed by h11 (pure Python, a regex per header),
turned into hypercorn's events, given a task of its own and a memory channel, and its
answer goes back the same way: about a third of a relayed request's CPU. Here a
connection is two tasks for its whole life: a reader that feeds what arrives to
``httptools`` (llhttp, the parser of Node.js; it also decodes chunked request bodies)
and notes the client's going, and the connection's own task, which runs the app for one
request after another. A request costs the parse, one wake of that task and the answer's
writes, straight on the socket (``direct.BodyWriter``).

What it keeps of hypercorn's behaviour (tests/e2e/test_transport.py and
test_connections.py pin it): keep-alive, pipelining and HTTP/1.0; ``Expect:
100-continue``; ``header_timeout_s`` for the first request head and
``keep_alive_timeout_s`` between requests; a head over ``max_header_kb`` while it is
still incomplete answered ``431``, a malformed one ``400``, each in words; the connection
caps (``conn_limits.py``), which count it busy from a whole head to the end of its
answer; a clean stop (an idle connection closes at once, a busy one after its answer). It
offers the gateway the client's going (``direct.WATCH_GONE``) and the body writer
(``direct.DIRECT_BODY``).

A request to change protocols (a WebSocket, or HTTP/2 by ``Upgrade: h2c`` or by its
preface) ends ``run`` with ``Upgrade``: the listener hands the connection, with the bytes
read so far, to hypercorn, which serves the rest of it. TLS connections are hypercorn's
throughout (``listen.py``).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools
import msgspec
import trio

from blazar.errors import Dialect, error_body
from blazar.web.asgi.direct import CHUNKED, DIRECT_BODY, NO_BODY, RAW, WATCH_GONE, BodyWriter

__all__ = ["H1Connection", "Upgrade"]

log = logging.getLogger("blazar.listen")

_READ = 65536
_BODY_BUFFER = 1 << 20
"""Request body bytes held, not yet taken by the app, before the reader waits for it."""
_QUEUED = 2
"""Requests with a whole head held (the one answered and one pipelined behind it) before
the reader waits."""
_PREFACE = b"PRI * HTTP/2.0\r\n"
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_INTERNAL = msgspec.json.encode(
    error_body(Dialect.OPENAI, "INTERNAL", "the request failed inside the daemon: see its log")
)


class Upgrade(Exception):
    """The client asks for another protocol: hypercorn serves the connection from here,
    fed ``data`` first (the request's head, rebuilt, and what followed it)."""

    def __init__(self, data: bytes) -> None:
        super().__init__("protocol upgrade")
        self.data = data


class _Date:
    """The ``date`` header's value, formatted once a second."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.second, cls.value = second, formatdate(second, usegmt=True).encode()
        return cls.value


class _Request:
    """One request as the reader parsed it: its head, and its body as it arrives."""

    __slots__ = (
        "arrived",
        "body",
        "buffered",
        "complete",
        "continue_",
        "delivered",
        "finished",
        "headers",
        "keep_alive",
        "method",
        "target",
        "upgrade",
        "version",
    )

    def __init__(self) -> None:
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.method = "GET"
        self.version = "1.1"
        self.keep_alive = True
        self.upgrade = False
        self.continue_ = False
        """The client waits for ``100 Continue`` before it sends the body."""
        self.body: list[bytes] = []
        self.buffered = 0
        self.complete = False
        """The whole body arrived."""
        self.delivered = False
        """The app has received the end of the body."""
        self.arrived: trio.Event | None = None
        """Set when more of the body arrives (made by a ``receive`` that waits)."""
        self.finished = trio.Event()
        """The answer ended or the client went: ``receive`` says ``http.disconnect``."""

    def more(self) -> None:
        if (arrived := self.arrived) is not None:
            self.arrived = None
            arrived.set()


class _Parser:
    """httptools' callbacks: each whole head into the connection's queue."""

    __slots__ = ("arrive", "head_bytes", "in_head", "parser", "request")

    def __init__(self, arrive: Callable[[_Request], None]) -> None:
        self.arrive = arrive
        self.request: _Request | None = None
        self.in_head = False
        self.head_bytes = 0
        """Bytes read since the head being parsed began (an upper bound)."""
        self.parser = httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self.request = _Request()
        self.in_head = True
        self.head_bytes = 0

    def on_url(self, url: bytes) -> None:
        assert self.request is not None
        self.request.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self.request
        assert request is not None
        name = name.lower()
        request.headers.append((name, value))
        if name == b"expect" and value.lower() == b"100-continue":
            request.continue_ = True

    def on_headers_complete(self) -> None:
        request = self.request
        assert request is not None
        parser = self.parser
        self.in_head = False
        request.method = parser.get_method().decode("ascii")
        request.version = parser.get_http_version()
        request.keep_alive = parser.should_keep_alive()
        request.upgrade = parser.should_upgrade()
        self.arrive(request)

    def on_body(self, body: bytes) -> None:
        request = self.request
        assert request is not None
        request.body.append(body)
        request.buffered += len(body)
        request.more()

    def on_message_complete(self) -> None:
        request = self.request
        assert request is not None
        self.request = None
        request.complete = True
        request.more()


class H1Connection:
    """One plain HTTP/1.1 connection (see the module); ``run`` serves it to its end."""

    def __init__(
        self,
        sock: trio.socket.SocketType,
        app: Callable[..., Awaitable[None]],
        *,
        header_timeout_s: float,
        keep_alive_timeout_s: float,
        max_head: int,
        refusal: Callable[[int], bytes],
        state: dict[str, Any],
        on_busy: Callable[[bool], None],
    ) -> None:
        self.sock = sock
        self._app = app
        self._header_timeout_s = header_timeout_s
        self._keep_alive_timeout_s = keep_alive_timeout_s
        self._max_head = max_head
        self._refusal = refusal
        """The worded answer, with ``connection: close``, for a head the parser refuses."""
        self._state = state
        self._on_busy = on_busy
        """Told when a request's head is whole (True) and when its answer has ended."""
        self._parser = _Parser(self._arrive)
        self._queue: deque[_Request] = deque()
        self._wake: trio.Event | None = None
        """Set for the connection's task waiting for a request: one came, or an end."""
        self._resume: trio.Event | None = None
        """Set for the reader waiting for the app to take what it holds."""
        self._refuse: int | None = None
        """The status of a head the parser refused (400, 431)."""
        self._upgrade: bytes | None = None
        """What followed the head of a request to change protocols (``Upgrade``)."""
        self._writer = BodyWriter(sock, trio.Lock(), self._went, self._hold)
        self._on_gone: Callable[[], None] | None = None
        self._extensions = {DIRECT_BODY: self._writer, WATCH_GONE: self._watch_gone}
        self._client: tuple[str, int] | None = None
        self._server: tuple[str, int] | None = None
        self.gone = False
        """The client closed its side, or the socket failed."""
        self.stopping = False
        self._last = False
        """No request is read after the ones queued."""
        self.served = False
        """A request head has arrived (the keep-alive timeout applies from now on)."""
        # the answer being sent
        self._request: _Request | None = None
        self._started = self._ended = self._close = self._holding = False
        self._held = b""
        self._left = -1
        """Bytes of a declared length still to send; -1 with no length declared."""

    # -- the connection's life --------------------------------------------------------------

    async def run(self) -> None:
        """Serve until the client goes, asks to close, is idle too long, or the server
        stops; ``Upgrade`` where hypercorn takes the connection over."""
        sock = self.sock
        try:
            self._client = _address(sock.getpeername())
            self._server = _address(sock.getsockname())
        except OSError:
            return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read)
                try:
                    await self._requests()
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            if self._upgrade is None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
                sock.close()
        if self._upgrade is not None:
            raise Upgrade(self._upgrade)

    def stop(self) -> None:
        """The server stops: an idle connection closes now, a busy one after its answer."""
        self.stopping = True
        self._wake_up()

    def shed(self) -> None:
        """End this unused connection from another's task, to free its place: its reader
        reads an end at once and it ends as for a client that hung up."""
        self.gone = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RD)
        self._wake_up()

    async def _requests(self) -> None:
        while (request := await self._next()) is not None:
            if request.upgrade:
                self._upgrade = _rebuilt(request) + (self._upgrade or b"")
                return
            self._on_busy(True)
            try:
                keep = await self._serve(request)
            finally:
                self._queue.popleft()
                self._request = None
                self._on_busy(False)
                self._let_read()
            if not keep or self.stopping or self.gone or (self._last and not self._queue):
                return

    async def _next(self) -> _Request | None:
        """The next request whose head is whole; None when the connection is to end (a
        refused head answered first)."""
        timeout = self._keep_alive_timeout_s if self.served else self._header_timeout_s
        with trio.move_on_after(timeout):
            while not self._queue:
                if self._refuse is not None:
                    await self._writer.send(self._refusal(self._refuse))
                    return None
                if self.gone or self.stopping or self._last or self._upgrade is not None:
                    return None
                self._wake = trio.Event()
                await self._wake.wait()
            return self._queue[0]
        return None

    def _arrive(self, request: _Request) -> None:
        self.served = True
        self._queue.append(request)
        self._wake_up()

    def _wake_up(self) -> None:
        if (wake := self._wake) is not None:
            self._wake = None
            wake.set()

    def _let_read(self) -> None:
        if (resume := self._resume) is not None:
            self._resume = None
            resume.set()

    def _went(self) -> None:
        """The client is gone (an end read, a failed read or write)."""
        self.gone = True
        for request in self._queue:
            request.finished.set()
            request.more()
        if (on_gone := self._on_gone) is not None:
            self._on_gone = None
            on_gone()
        self._wake_up()

    # -- the reader -------------------------------------------------------------------------

    async def _read(self) -> None:
        sock, parser = self.sock, self._parser
        first = True
        data = b""
        while True:
            if self._held_back():
                self._resume = trio.Event()
                await self._resume.wait()
                continue
            try:
                data += await sock.recv(_READ)
            except OSError:
                data = b""
            if not data or self.gone:
                self._went()
                return
            if first:
                if _PREFACE.startswith(data[: len(_PREFACE)]) and len(data) < len(_PREFACE):
                    continue  # what came so far may be HTTP/2's preface: wait for the rest
                first = False
                if data.startswith(_PREFACE):  # HTTP/2 with prior knowledge
                    self._upgrade = data
                    self._queue.clear()
                    self._wake_up()
                    return
            try:
                parser.parser.feed_data(data)
            except httptools.HttpParserUpgrade as upgrade:
                self._upgrade = data[upgrade.args[0] :]
                self._wake_up()
                return
            except httptools.HttpParserError:
                self._refused(400)
                return
            if parser.in_head:
                parser.head_bytes += len(data)
                if parser.head_bytes > self._max_head:
                    self._refused(431)
                    return
            data = b""

    def _held_back(self) -> bool:
        """Whether the reader waits: for the app to take the body it holds, or to answer
        the requests before the ones read."""
        queue = self._queue
        return len(queue) >= _QUEUED or (bool(queue) and queue[-1].buffered > _BODY_BUFFER)

    def _refused(self, status: int) -> None:
        """The parser refused a head, or a body: the head is answered where no request
        came before it; a body's request cannot go on, and its client is taken as gone."""
        bad = self._parser.request
        if bad is not None and bad in self._queue:
            self._went()  # its body
        elif self._queue:
            self._last = True  # a head behind a request being answered: the connection ends after it
        else:
            self._refuse = status
        self._wake_up()

    # -- one request ------------------------------------------------------------------------

    async def _serve(self, request: _Request) -> bool:
        """Run the app for ``request``; whether the connection may carry another."""
        self._request = request
        self._started = self._ended = self._close = self._holding = False
        self._held = b""
        target = request.target
        path, _, query = target.partition(b"?")
        if not path.startswith(b"/") and path != b"*":  # absolute form
            with contextlib.suppress(httptools.HttpParserInvalidURLError):
                url = httptools.parse_url(target)
                path, query = url.path or b"/", url.query or b""
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": request.version,
            "method": request.method,
            "scheme": "http",
            "path": unquote(path.decode("latin-1")) if b"%" in path else path.decode("latin-1"),
            "raw_path": path,
            "query_string": query,
            "root_path": "",
            "headers": request.headers,
            "client": self._client,
            "server": self._server,
            "extensions": self._extensions,
            "state": self._state.copy(),
        }
        try:
            await self._app(scope, self._receive, self._send)
        except Exception:
            log.exception("%s %s failed", request.method, path.decode("latin-1"))
            self._close = True
            if not self._started:
                await self._answer_internal()
        else:
            if not self._started:
                log.error("%s %s ended without an answer", request.method, path.decode("latin-1"))
                await self._answer_internal()
        finally:
            self._on_gone = None
            request.finished.set()
        return (
            self._ended
            and not self._close
            and request.keep_alive
            and request.complete
            and not self._writer.dead
        )

    async def _answer_internal(self) -> None:
        await self._send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(_INTERNAL)),
                    (b"connection", b"close"),
                ],
            }
        )
        await self._send({"type": "http.response.body", "body": _INTERNAL})

    def _watch_gone(self, on_gone: Callable[[], None] | None) -> None:
        if on_gone is not None and self.gone:
            on_gone()
        else:
            self._on_gone = on_gone

    def _hold(self) -> None:
        self._holding = True

    async def _receive(self) -> dict[str, Any]:
        request = self._request
        assert request is not None
        while True:
            if request.body:
                body = request.body[0] if len(request.body) == 1 else b"".join(request.body)
                request.body.clear()
                request.buffered = 0
                self._let_read()
                request.delivered = request.complete
                return {"type": "http.request", "body": body, "more_body": not request.complete}
            if request.complete and not request.delivered:
                request.delivered = True
                return {"type": "http.request", "body": b"", "more_body": False}
            if request.delivered or self.gone or request.finished.is_set():
                await request.finished.wait()
                return {"type": "http.disconnect"}
            if request.continue_ and not self._started:
                request.continue_ = False
                await self._writer.send(_CONTINUE)
            request.arrived = arrived = trio.Event()
            await arrived.wait()

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self._started:
                raise RuntimeError("the answer's head was sent already")
            head = self._head(message.get("status", 200), message.get("headers", ()))
            self._started = True
            if self._holding:
                self._held = head
            else:
                await self._writer.send(head)
            return
        if kind != "http.response.body":
            raise RuntimeError(f"an HTTP/1.1 answer cannot send {kind!r}")
        if not self._started:
            raise RuntimeError("an answer's body before its head")
        if self._ended:
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        framing = self._writer.framing
        if framing == CHUNKED:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
        elif framing == RAW:
            data = body
            if self._left >= 0:
                if len(data) > self._left:  # more than it declared: cut, and end the connection
                    data, self._close = data[: self._left], True
                self._left -= len(data)
                if not more and self._left > 0:  # less: the client would wait for the rest
                    self._close = True
        else:
            data = b""
        if held := self._held:
            self._held = b""
            data = held + data
        if not more:
            self._ended = True
            if framing == RAW and self._left < 0:
                self._close = True  # its end is the connection's
        if data:
            await self._writer.send(data)
        if not more and (request := self._request) is not None:
            request.finished.set()

    def _head(self, status: int, headers: Any) -> bytes:
        """The answer's head; sets how its body is framed and whether the connection ends."""
        request = self._request
        assert request is not None
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
        length = None
        chunked = False
        close = not request.keep_alive or self.stopping
        for name, value in headers:
            name = name.lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = True
                continue  # the connection frames the body itself
            elif name == b"connection":
                if b"close" in value.lower():
                    close = True
                continue
            lines.append(b"%s: %s\r\n" % (name, value))
        no_body = request.method == "HEAD" or status in (204, 304) or status < 200
        if no_body:
            framing = NO_BODY
        elif length is not None and not chunked:
            framing = RAW
        elif request.version == "1.1":
            framing = CHUNKED
            lines.append(b"transfer-encoding: chunked\r\n")
        else:  # HTTP/1.0: the body ends with the connection
            framing, close = RAW, True
        if close:
            lines.append(b"connection: close\r\n")
        lines.append(b"date: %s\r\n\r\n" % _Date.now())
        head = b"".join(lines)
        # One CR and one LF per line and the blank one: none inside a name or a value.
        if head.count(b"\n") != len(lines) + 1 or head.count(b"\r") != len(lines) + 1:
            raise ValueError("a header of the answer holds a line break")
        self._writer.framing = framing
        self._left = length if (framing == RAW and length is not None) else -1
        self._close = close
        return head


def _address(address: Any) -> tuple[str, int] | None:
    if isinstance(address, tuple) and len(address) >= 2:
        return str(address[0]), int(address[1])
    return None


def _rebuilt(request: _Request) -> bytes:
    """A request's head as bytes again, for hypercorn (``Upgrade``)."""
    lines = [b"%s %s HTTP/%s\r\n" % (request.method.encode(), request.target, request.version.encode())]
    lines += [b"%s: %s\r\n" % header for header in request.headers]
    return b"".join(lines) + b"\r\n" + b"".join(request.body)
