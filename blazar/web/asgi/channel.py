"""The channel between the runtime and its data-plane workers (``workers`` above 1).

A worker forwards each HTTP request to the runtime, and reports how a stream it relayed
ended, as msgspec frames on a private Unix socket: no HTTP is parsed or framed on the way.
A frame is a 4-byte big-endian length and a MessagePack array, its first item the frame's
tag. On a connection the worker first says ``Hello`` with the token the runtime gave it
at spawn (a wrong one, and the connection is closed); then one request at a time:

    worker → runtime   Open      method, target, headers, body, client, scheme
    runtime → worker   Head      status, headers
                       Body      data, more        (as many as the answer has; the last has more=False)
    worker → runtime   Reported  a handed-off stream's end (``blazar/serve/handoff.py``)
    runtime → worker   Answered  what the worker sends its client last

The runtime answers an ``Open`` by running its app as for a request of its own, with the
request's handoff slot in its scope: a stream the worker can relay itself is answered with
a grant (the first ``Body``), and its answer stays open, holding the engine slot, until the
worker's ``Reported`` comes or the connection closes. A connection that closes is the
client's disconnect: the app's ``receive`` says so, as the server's does, and the slot is
freed. A worker keeps its connections for its next requests.

``serve_channel`` is the runtime's side; ``ChannelConnection`` is what both sides read and
write frames with.
"""

from __future__ import annotations

import logging
import secrets
import socket as stdlib_socket
import struct
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from blazar.errors import Dialect, error_body
from blazar.serve.handoff import HandoffSlot, Report, ReportAnswer
from blazar.web.asgi.call import HANDOFF_EXTENSION
from blazar.web.asgi.direct import WATCH_GONE

__all__ = [
    "Answered",
    "Body",
    "ChannelClosed",
    "ChannelConnection",
    "Head",
    "Hello",
    "Open",
    "Reported",
    "serve_channel",
]

log = logging.getLogger("blazar.workers")

Headers = list[tuple[bytes, bytes]]


class Hello(msgspec.Struct, tag="hello", array_like=True):
    token: str


class Open(msgspec.Struct, tag="open", array_like=True):
    method: str
    path: str
    raw_path: bytes
    query: bytes
    headers: Headers
    body: bytes
    client: tuple[str, int] | None
    server: tuple[str, int] | None
    scheme: str
    http_version: str


class Head(msgspec.Struct, tag="head", array_like=True):
    status: int
    headers: Headers


class Body(msgspec.Struct, tag="body", array_like=True):
    data: bytes
    more: bool


class Reported(msgspec.Struct, tag="reported", array_like=True):
    report: Report


class Answered(msgspec.Struct, tag="answered", array_like=True):
    answer: ReportAnswer


Frame = Hello | Open | Head | Body | Reported | Answered

_LENGTH = struct.Struct(">I")
_BACKLOG = 4096
"""Connections not yet accepted (the kernel caps it at ``net.core.somaxconn``): a burst of new
streams opens that many at once. Past it a worker's connect is told to try again."""
_JSON = [(b"content-type", b"application/json")]
_READ = 256 * 1024
_MAX_FRAME = 2**32 - 1


class ChannelClosed(Exception):
    """The other side closed the connection, or broke the framing."""


class ChannelConnection:
    """One connection of the channel: frames written whole (under a lock: a request's
    answer and the reply to a report may be written by two tasks) and read one at a time.
    A read that is cancelled loses nothing: what arrived is kept for the next one."""

    __slots__ = ("_buffer", "_decoder", "_encoder", "_lock", "_max", "sock")

    def __init__(self, sock: trio.socket.SocketType, max_frame: int = _MAX_FRAME) -> None:
        self.sock = sock
        self._buffer = bytearray()
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Frame)
        self._lock = trio.Lock()
        self._max = max_frame

    async def write(self, *frames: Frame) -> None:
        """Write ``frames`` in one go; ``ChannelClosed`` where the other side is gone."""
        data = bytearray()
        for frame in frames:
            start = len(data)
            data += b"\0\0\0\0"
            self._encoder.encode_into(frame, data, len(data))
            _LENGTH.pack_into(data, start, len(data) - start - _LENGTH.size)
        view = memoryview(data)
        async with self._lock:
            try:
                while view:
                    view = view[await self.sock.send(view) :]
            except (OSError, trio.ClosedResourceError) as exc:
                raise ChannelClosed(str(exc)) from exc

    async def read(self) -> Frame | None:
        """The next frame; None at the end of the connection (between frames)."""
        buffer = self._buffer
        while True:
            if len(buffer) >= _LENGTH.size:
                (size,) = _LENGTH.unpack_from(buffer)
                if size > self._max:
                    raise ChannelClosed(f"a frame of {size} bytes, over the limit of {self._max}")
                end = _LENGTH.size + size
                if len(buffer) >= end:
                    try:
                        frame = self._decoder.decode(memoryview(buffer)[_LENGTH.size : end])
                    except msgspec.DecodeError as exc:
                        raise ChannelClosed(f"a malformed frame: {exc}") from exc
                    del buffer[:end]
                    return frame
            try:
                data = await self.sock.recv(_READ)
            except (OSError, trio.ClosedResourceError) as exc:
                raise ChannelClosed(str(exc)) from exc
            if not data:
                if buffer:
                    raise ChannelClosed("the connection ended inside a frame")
                return None
            buffer += data

    def close(self) -> None:
        """End the connection; the other side reads its end."""
        try:
            self.sock.shutdown(stdlib_socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# -- the runtime's side ---------------------------------------------------------------


class _Request:
    """One forwarded request, run by the app as if its server had read it."""

    __slots__ = ("_body", "_conn", "_gone", "_head", "_on_gone", "ended", "slot", "started")

    def __init__(self, conn: ChannelConnection, body: bytes) -> None:
        self._conn = conn
        self._body: bytes | None = body
        self._gone = trio.Event()
        self._on_gone: Callable[[], None] | None = None
        self.started = self.ended = False
        """The answer's head was sent, and its last body frame written."""
        self._head: Head | None = None
        self.slot = HandoffSlot()

    def gone(self) -> None:
        self._gone.set()
        on_gone, self._on_gone = self._on_gone, None
        if on_gone is not None:
            on_gone()

    def cut(self) -> None:
        """End an answer that never finished: the connection closes, and the worker's client
        sees its answer end short."""
        self.gone()
        self._conn.close()

    def watch_gone(self, on_gone: Callable[[], None] | None) -> None:
        """``blazar.web.asgi.direct.WATCH_GONE``: ``on_gone`` once the worker's client goes."""
        if on_gone is not None and self._gone.is_set():
            on_gone()
        else:
            self._on_gone = on_gone

    async def receive(self) -> dict[str, Any]:
        if (body := self._body) is not None:
            self._body = None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        # What is sent once the worker's connection is gone goes nowhere, as a server's does.
        if self._gone.is_set() or self.ended:
            return
        kind = message["type"]
        if kind == "http.response.start":  # written with the first body frame, in one go
            self._head = Head(message["status"], list(message.get("headers", ())))
            self.started = True
            return
        if kind != "http.response.body":
            return
        more = bool(message.get("more_body", False))
        frames: tuple[Frame, ...] = (Body(message.get("body", b""), more),)
        if (head := self._head) is not None:
            self._head = None
            frames = (head, *frames)
        self.ended = not more
        # Shielded as the server's own send is: a frame cut short would break the channel.
        with trio.CancelScope(shield=True):
            try:
                await self._conn.write(*frames)
            except ChannelClosed:
                self.gone()


def _scope(opened: Open, request: _Request) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": opened.http_version,
        "method": opened.method,
        "scheme": opened.scheme,
        "path": opened.path,
        "raw_path": opened.raw_path,
        "query_string": opened.query,
        "root_path": "",
        "headers": opened.headers,
        "client": opened.client,
        "server": opened.server,
        "extensions": {HANDOFF_EXTENSION: request.slot, WATCH_GONE: request.watch_gone},
    }


class _Side:
    def __init__(self, app: Any, token: str, max_frame: int) -> None:
        self.app = app
        self._token = token.encode()
        self._max_frame = max_frame

    async def connection(self, sock: trio.socket.SocketType) -> None:
        conn = ChannelConnection(sock, self._max_frame)
        try:
            hello = await conn.read()
            if not isinstance(hello, Hello) or not secrets.compare_digest(hello.token.encode(), self._token):
                log.warning("a connection to the workers' channel did not give the token: closed")
                return
            async with trio.open_nursery() as nursery:
                await self._requests(conn, nursery)
        except ChannelClosed as exc:
            log.warning("a worker's channel connection broke: %s", exc)
        except Exception:  # one connection's bug must not end the channel for every worker
            log.exception("a worker's channel connection failed")
        finally:
            conn.close()

    async def _requests(self, conn: ChannelConnection, nursery: trio.Nursery) -> None:
        """Read the connection's frames until it ends (a worker that dies mid-frame, too:
        for its request, that is its client's disconnect)."""
        current: _Request | None = None
        try:
            while (frame := await conn.read()) is not None:
                if isinstance(frame, Open):
                    if current is not None:
                        current.gone()  # a worker sends the next only once the last has ended
                    current = _Request(conn, frame.body)
                    nursery.start_soon(self._run, current, _scope(frame, current))
                elif isinstance(frame, Reported):
                    answer = ReportAnswer()
                    if current is not None:
                        answer = await _report(current.slot, frame.report)
                    await conn.write(Answered(answer))
                else:
                    raise ChannelClosed(f"a {type(frame).__name__} frame from a worker")
        except ChannelClosed as exc:
            log.warning("a worker's channel connection broke: %s", exc)
        finally:
            if current is not None:
                current.gone()  # the worker's client went away, or the worker did

    async def _run(self, request: _Request, scope: dict[str, Any]) -> None:
        try:
            await self.app(scope, request.receive, request.send)
        except Exception:
            log.exception("a request forwarded by a worker failed")
            if not request.started:  # what a server answers for an app that failed
                body = msgspec.json.encode(
                    error_body(Dialect.OPENAI, "INTERNAL", "the request failed: see the log")
                )
                await request.send({"type": "http.response.start", "status": 500, "headers": _JSON})
                await request.send({"type": "http.response.body", "body": body})
        if not request.ended:
            request.cut()


async def _report(slot: HandoffSlot, report: Report) -> ReportAnswer:
    try:
        return await slot.report(report)
    except Exception:  # a bug: the worker sends its client nothing more, the log says why
        log.exception("the report of handed-off stream %s failed", slot.id)
        return ReportAnswer()


async def serve_channel(
    app: Any,
    token: str,
    listener: stdlib_socket.socket,
    *,
    max_frame: int = _MAX_FRAME,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` to the workers on ``listener`` (a bound Unix socket) until cancelled."""
    side = _Side(app, token, max_frame)
    sock = trio.socket.from_stdlib_socket(listener)
    sock.listen(_BACKLOG)
    with sock:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                accepted, _ = await sock.accept()
                nursery.start_soon(side.connection, accepted)
