"""A data-plane worker: ``python -m blazar.daemon.worker``, spawned by the daemon (``workers``).

It accepts on the daemon's listening sockets (inherited at spawn) with the daemon's own
listener (``blazar.web.asgi.listen``: connection caps, header and idle limits, TLS) and
forwards each request to the runtime over the channel (``blazar/web/asgi/channel.py``:
msgspec frames on a private Unix socket, opened with the token it was given at spawn).
The runtime does everything a request needs; a
stream it can hand off (``blazar/serve/handoff.py``) comes back as a grant, and the
worker then relays the engine's bytes to its client itself, with the same
``UpstreamStream`` the runtime uses: its own keep-alive pool to each engine, the prompt's
progress events filtered, an abandoned stream closed once the engine starts generating.
It reports how the stream ended, and the runtime records it and frees the slot. Every
other answer is relayed as it comes.

A client that disconnects cancels its request here: the engine connection is reset (the
engine stops at its next write) and its channel connection is closed, which frees the
slot there. A client's WebSocket is carried to the runtime's private HTTP socket instead
(``worker_ws``). The worker exits when its stdin reaches end-of-file, so a
``kill -9`` of the daemon takes it along.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from actors.engines.lifeline import on_parent_exit
from actors.upstream import UpstreamError, UpstreamPool, UpstreamResponse
from blazar.config import Config
from blazar.daemon.serve import freeze_heap
from blazar.daemon.worker_channel import RuntimeChannel
from blazar.daemon.worker_ws import bridge
from blazar.dialects.llamacpp import ProgressFilter
from blazar.errors import Dialect, error_body
from blazar.serve.handoff import GRANT_HEADER, Grant, Report, ReportAnswer
from blazar.serve.relay import UpstreamStream
from blazar.web.asgi.channel import Answered, Body, ChannelClosed, ChannelConnection, Head, Open, Reported
from blazar.web.asgi.direct import DIRECT_BODY, WATCH_GONE, BodyWriter
from blazar.web.asgi.workers import CLIENT_HEADER, SCHEME_HEADER, TOKEN_HEADER

__all__ = [
    "ENV_CHANNEL",
    "ENV_CONFIG",
    "ENV_FDS",
    "ENV_INDEX",
    "ENV_LOG_DIR",
    "ENV_SOCKET",
    "ENV_TOKEN",
    "WorkerApp",
    "main",
]

log = logging.getLogger("blazar.worker")

ENV_TOKEN = "BLAZAR_WORKER_TOKEN"
ENV_SOCKET = "BLAZAR_WORKER_SOCKET"
ENV_CHANNEL = "BLAZAR_WORKER_CHANNEL"
ENV_INDEX = "BLAZAR_WORKER_INDEX"
ENV_FDS = "BLAZAR_WORKER_FDS"
ENV_CONFIG = "BLAZAR_WORKER_CONFIG"
ENV_LOG_DIR = "BLAZAR_WORKER_LOG_DIR"

_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"upgrade", b"te"})
"""Headers about one connection, not the request: each hop sets its own."""
_OWN = _HOP | {b"date", b"server"}
"""What the worker's own server sets on an answer it relays."""
_GRANT = GRANT_HEADER.encode()
_OURS = b"x-blazar-worker"
_ENGINE_JSON = {"content-type": "application/json"}
_DONE = b"data: [DONE]"
_ANSWER_END_S = 5.0
"""How long the runtime has to end its answer once a stream is reported."""
_ABANDONED_WAIT_S = 660.0
"""Past the relay's own wait for an abandoned stream's first token (``close_once_started``)."""


class _RuntimeGone(Exception):
    """The runtime's answer to a forwarded request ended before it was whole."""


class _Lease:
    """A handed-off stream's hold on the engine slot. Released, the runtime's answer may be
    closed; until then it stays open, which keeps the slot taken there."""

    __slots__ = ("released",)

    def __init__(self) -> None:
        self.released = trio.Event()

    def release(self) -> None:
        self.released.set()


async def _close_when_released(lease: _Lease, conn: ChannelConnection) -> None:
    """An abandoned stream waits for the engine's first token to be closed: the runtime's
    answer (its slot) is held until then too."""
    with trio.move_on_after(_ABANDONED_WAIT_S):
        await lease.released.wait()
    conn.close()


async def _next(conn: ChannelConnection) -> Head | Body | Answered:
    """The runtime's next frame for this request; ``_RuntimeGone`` where it ends instead."""
    try:
        frame = await conn.read()
    except ChannelClosed as exc:
        raise _RuntimeGone from exc
    if not isinstance(frame, Head | Body | Answered):
        raise _RuntimeGone
    return frame


class WorkerApp:
    """The worker's ASGI app: forward to the runtime, relay the engine's bytes where granted."""

    def __init__(
        self, runtime_socket: str, channel_socket: str, token: str, index: int, max_body: int
    ) -> None:
        self._channel = RuntimeChannel(channel_socket, token)
        self._socket = runtime_socket
        self._token = token.encode()
        self._index = str(index).encode()
        self._max_body = max_body
        self._engines: dict[tuple[str, int], UpstreamPool] = {}
        self._background: trio.Nursery | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":  # carried to the runtime, which serves it (``worker_ws``)
            await bridge(self._socket, scope, receive, send, self._added(scope))

    async def _lifespan(self, receive: Any, send: Any) -> None:
        async with trio.open_nursery() as nursery:
            self._background = nursery
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    freeze_heap()  # the start is over: full collections walk only what requests make
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    nursery.cancel_scope.cancel()
                    self._channel.close()
                    for pool in self._engines.values():
                        await pool.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    # -- a request --------------------------------------------------------------------

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await self._read_body(receive)
        if body is None:
            return  # the client left before its request was whole
        watch = (scope.get("extensions") or {}).get(WATCH_GONE)
        if watch is not None:  # told by the connection: no task of the request's own
            watched = trio.CancelScope()
            watch(watched.cancel)
            try:
                with watched:
                    await self._forward(scope, body, send)
            finally:
                watch(None)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_disconnect, receive, nursery.cancel_scope)
            try:
                await self._forward(scope, body, send)
            finally:
                nursery.cancel_scope.cancel()

    async def _read_body(self, receive: Any) -> bytes | None:
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:  # the runtime refuses it with its own words: send no more
                parts.append(chunk[: self._max_body - size + len(chunk) + 1])
                return b"".join(parts)
            parts.append(chunk)
            if not message.get("more_body"):
                return b"".join(parts)

    @staticmethod
    async def _watch_disconnect(receive: Any, scope: trio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    def _added(self, scope: dict[str, Any]) -> list[tuple[bytes, bytes]]:
        """What the worker tells the runtime of a WebSocket it carries: its token, the
        client's address and the scheme the client used."""
        added = [(TOKEN_HEADER, self._token), (SCHEME_HEADER, scope.get("scheme", "http").encode())]
        if client := scope.get("client"):
            host = client[0]
            added.append(
                (CLIENT_HEADER, (f"[{host}]" if ":" in host else host).encode() + b":%d" % client[1])
            )
        return added

    async def _forward(self, scope: dict[str, Any], body: bytes, send: Any) -> None:
        # A client's own x-blazar-worker-* headers are dropped: only the channel says who sent it.
        headers = [(k, v) for k, v in scope["headers"] if k not in _HOP and not k.startswith(_OURS)]
        headers.append((b"content-length", b"%d" % len(body)))
        client, server = scope.get("client"), scope.get("server")
        request = Open(
            method=scope["method"],
            path=scope["path"],
            raw_path=scope.get("raw_path") or scope["path"].encode(),
            query=scope.get("query_string", b""),
            headers=headers,
            body=body,
            client=None if client is None else (client[0], client[1]),
            server=None if server is None else (server[0], server[1] or 0),
            scheme=scope.get("scheme", "http"),
            http_version=scope.get("http_version", "1.1"),
        )
        try:
            conn = await self._channel.open(request)
        except ChannelClosed:
            await self._refuse(send, 503, "UNAVAILABLE", "the daemon's runtime is not answering: try again")
            return
        done = handed = False
        try:
            try:
                head = await _next(conn)
            except _RuntimeGone:
                await self._refuse(
                    send, 503, "UNAVAILABLE", "the daemon's runtime ended the request: try again"
                )
                return
            if not isinstance(head, Head):
                return
            if _GRANT in (k for k, _ in head.headers):
                handed = True  # the stream's relay keeps or closes the connection
                await self._handed(conn, head, send, (scope.get("extensions") or {}).get(DIRECT_BODY))
                return
            try:
                done = await self._relay(conn, head, send)
            except _RuntimeGone:
                pass  # whatever was sent is all the client gets: its connection ends short
        finally:
            if done:
                self._channel.keep(conn)
            elif not handed:
                conn.close()

    def _head(self, head: Head) -> list[tuple[bytes, bytes]]:
        kept = [(k, v) for k, v in head.headers if k not in _OWN and k != _GRANT]
        kept.append((b"x-blazar-worker", self._index))
        return kept

    async def _relay(self, conn: ChannelConnection, head: Head, send: Any) -> bool:
        """Relay the runtime's answer as it comes; True once it is whole."""
        kept = self._head(head)
        if (length := next((v for k, v in head.headers if k == b"content-length"), None)) is not None:
            kept.append((b"content-length", length))
        await send({"type": "http.response.start", "status": head.status, "headers": kept})
        while True:
            frame = await _next(conn)
            if not isinstance(frame, Body):
                raise _RuntimeGone
            if not frame.more:
                await send({"type": "http.response.body", "body": frame.data})
                return True
            if frame.data:
                await send({"type": "http.response.body", "body": frame.data, "more_body": True})

    async def _refuse(self, send: Any, status: int, code: str, message: str) -> None:
        body = msgspec.json.encode(error_body(Dialect.OPENAI, code, message))
        head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})

    # -- a handed-off stream ----------------------------------------------------------

    async def _handed(
        self, conn: ChannelConnection, head: Head, send: Any, direct: BodyWriter | None
    ) -> None:
        """Relay a granted stream. The connection is kept for the next request once the
        runtime has answered the report and ended its answer; else it is closed, at once
        or, for an abandoned stream waiting for its first token, once the engine slot is
        free (the runtime holds the slot until then)."""
        lease = _Lease()
        ended = _Ended()
        try:
            await self._handed_relay(conn, head, send, lease, direct, ended)
        except _RuntimeGone:
            pass
        finally:
            if ended.reported and ended.whole:
                self._channel.keep(conn)
            elif lease.released.is_set() or ended.whole or self._background is None:
                conn.close()
            else:
                self._background.start_soon(_close_when_released, lease, conn)

    async def _handed_relay(
        self,
        conn: ChannelConnection,
        head: Head,
        send: Any,
        lease: _Lease,
        direct: BodyWriter | None,
        ended: _Ended,
    ) -> None:
        frame = await _next(conn)
        if not isinstance(frame, Body):
            raise _RuntimeGone
        grant = msgspec.json.decode(frame.data, type=Grant)
        engine = self._engine(grant)
        try:
            upstream = await engine.request("POST", grant.path, body=grant.body, headers=_ENGINE_JSON)
        except UpstreamError as exc:
            lease.release()
            said = await self._report(conn, Report(error=repr(exc)), ended)
            await send({"type": "http.response.start", "status": 200, "headers": self._head(head)})
            await send({"type": "http.response.body", "body": said.body})
            return
        if upstream.status_code != 200:
            lease.release()
            try:
                content = await upstream.aread()
            except UpstreamError:
                content = b""
            finally:
                await upstream.aclose()
            said = await self._report(conn, Report(status=upstream.status_code, body=content), ended)
            kept = [
                (b"content-type", said.content_type.encode()),
                (b"content-length", b"%d" % len(said.body)),
            ]
            await send({"type": "http.response.start", "status": said.status or 502, "headers": kept})
            await send({"type": "http.response.body", "body": said.body})
            return
        tail = b""

        def on_end(last: bytes) -> None:
            nonlocal tail
            tail = last

        sent = [0, 0]  # chunks, bytes
        first: float | None = None

        def report(**more: Any) -> Report:
            ago = None if first is None else time.perf_counter() - first
            return Report(tail=tail, chunks=sent[0], bytes_out=sent[1], first_byte_ago_s=ago, **more)

        watch = _RuntimeEnd(conn, ended)

        async def on_error(exc: Exception) -> bytes:
            await watch.stop()  # the report's answer is read on the connection it watches
            return (await self._report(conn, report(error=repr(exc)), ended)).body

        stream = UpstreamStream(
            upstream,
            lease,
            on_error,
            background=self._start_background,
            progress=ProgressFilter() if grant.progress else None,
            on_end=on_end,
        )
        await send({"type": "http.response.start", "status": 200, "headers": self._head(head)})
        whole = False
        last = b""

        async def pipe(source: UpstreamResponse, on_chunk: Callable[[bytes], None]) -> bool:
            """The rest through the pump, as the gateway relays it, counted here too."""

            def chunk(data: bytes) -> None:
                nonlocal last
                on_chunk(data)
                sent[0] += 1
                sent[1] += len(data)
                last = data

            return direct is not None and await direct.pipe(source, chunk)

        piped = direct is None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch.run, nursery.cancel_scope)
                async for chunk in stream:
                    if first is None:
                        first = time.perf_counter()
                    sent[0] += 1
                    sent[1] += len(chunk)
                    if direct is not None:  # straight to the socket, as the gateway writes
                        await direct.write(chunk)
                    else:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    last = chunk
                    if not piped:
                        piped = await stream.pipe_into(pipe)
                whole = True
                nursery.cancel_scope.cancel()
        finally:
            await stream.aclose()
            # A client may hang up once it has read the last event (the OpenAI SDK does, at
            # `[DONE]`), before the engine's end of body: it has its whole answer all the same.
            if (whole or last.rstrip().endswith(_DONE)) and not ended.reported and not ended.whole:
                # All relayed: shielded from the client's going.
                with trio.CancelScope(shield=True):
                    await self._report(conn, report(), ended)
        # Not reported: the runtime ended it (a cancel, a deadline), its last event sent ahead.
        await send({"type": "http.response.body", "body": b"" if ended.reported else ended.last})

    def _start_background(self, fn: Any) -> None:
        if self._background is not None:
            self._background.start_soon(fn)

    def _engine(self, grant: Grant) -> UpstreamPool:
        key = (grant.host, grant.port)
        pool = self._engines.get(key)
        if pool is None or pool.headers != grant.headers or pool.max_idle != grant.keep:
            if pool is not None:  # the engine was started again (a new key): its old pool goes
                self._start_background(pool.aclose)
            pool = self._engines[key] = UpstreamPool(
                grant.host, grant.port, headers=grant.headers, max_idle=grant.keep, idle_expiry_s=grant.keep_s
            )
        return pool

    async def _report(self, conn: ChannelConnection, report: Report, ended: _Ended) -> ReportAnswer:
        """Tell the runtime how the stream ended; its answer, once its own answer has ended
        too (the connection is then free for the next request)."""
        ended.reported = True
        said = ReportAnswer()
        with trio.CancelScope(shield=True), trio.move_on_after(_ANSWER_END_S):
            try:
                await conn.write(Reported(report))
                answered = False
                while not (answered and ended.whole):
                    frame = await _next(conn)
                    if isinstance(frame, Answered):
                        said, answered = frame.answer, True
                    elif isinstance(frame, Body):
                        ended.whole = not frame.more
                return said
            except (ChannelClosed, _RuntimeGone) as exc:
                log.warning("could not report a handed-off stream to the runtime: %s", exc)
        ended.whole = False  # not known to be done: the connection is not kept
        return said


class _RuntimeEnd:
    """Watches the runtime's answer while a handed-off stream is relayed: the runtime sends
    more, or ends its answer, before the report only to stop the stream (a cancel, a
    deadline, a drain), and what it sends is the stream's last event."""

    def __init__(self, conn: ChannelConnection, ended: _Ended) -> None:
        self._conn = conn
        self._ended = ended
        self._scope = trio.CancelScope()
        self._done = trio.Event()

    async def run(self, relay: trio.CancelScope) -> None:
        try:
            with self._scope:
                try:
                    while not self._ended.whole:
                        frame = await _next(self._conn)
                        if isinstance(frame, Body):
                            self._ended.last += frame.data
                            self._ended.whole = not frame.more
                except _RuntimeGone:
                    pass
                relay.cancel()
        finally:
            self._done.set()

    async def stop(self) -> None:
        """Stop watching, and return once the connection is no longer read here."""
        self._scope.cancel()
        await self._done.wait()


class _Ended:
    """What the worker learnt of the runtime's answer to a handed-off stream."""

    __slots__ = ("last", "reported", "whole")

    def __init__(self) -> None:
        self.reported = False
        """The report was sent."""
        self.whole = False
        """The runtime's answer has ended."""
        self.last = b""
        """What it sent after the grant: the stream's last event, where it ended it."""


# -- the process ---------------------------------------------------------------------


async def _run(config: Config, app: WorkerApp, fds: list[int]) -> None:
    from blazar.web.asgi.listen import hypercorn_config, serve

    shutdown = trio.Event()
    hconfig = hypercorn_config(config)
    hconfig.bind = [f"fd://{fd}" for fd in fds]
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    shutdown.set()
                    return

            nursery.start_soon(stop_on_signal)
            await serve(app, config, hconfig, shutdown_trigger=shutdown.wait)
            nursery.cancel_scope.cancel()


def _log_to(folder: str | None, index: int, config: Config) -> None:
    """``worker-N.log`` beside the daemon's log, scrubbed as that one is; else stderr."""
    from blazar.daemon.serve import LogFile
    from blazar.telemetry.scrub import ScrubFilter

    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if folder:
        path = os.path.join(folder, f"worker-{index}.log")
        size = int(config.log_max_mb * 1024 * 1024)
        handler = LogFile(path, max_bytes=size, backups=1, shown=f"worker-{index}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(ScrubFilter())
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    for noisy in ("hypercorn.access", "hypercorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _address(name: str) -> str:
    """A Unix socket's name from the environment, where a Linux abstract name's NUL is an @."""
    return "\0" + name[1:] if name.startswith("@") else name


def main() -> int:
    on_parent_exit(lambda: os._exit(0))  # the daemon is gone (even by kill -9): so are we
    config = msgspec.json.decode(os.environ[ENV_CONFIG].encode(), type=Config)
    index = int(os.environ[ENV_INDEX])
    _log_to(os.environ.get(ENV_LOG_DIR), index, config)
    fds = [int(fd) for fd in os.environ[ENV_FDS].split(",") if fd]
    runtime_socket, channel_socket = (_address(os.environ[name]) for name in (ENV_SOCKET, ENV_CHANNEL))
    max_body = int(config.max_body_mb * 1024 * 1024)
    app = WorkerApp(runtime_socket, channel_socket, os.environ[ENV_TOKEN], index, max_body)
    trio.run(_run, config, app, fds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
