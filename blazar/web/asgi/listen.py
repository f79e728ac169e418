"""The daemon's listener: its own HTTP/1.1 server on plain connections, hypercorn for
TLS, with limits on connections neither has.

A plain connection is served by ``h1.H1Connection`` (a request there costs a fraction of
what it does through hypercorn, BENCHMARK.md); one that changes protocols (a WebSocket,
HTTP/2 by upgrade or preface) is handed to hypercorn with what was read of it, and so is
every TLS connection, where HTTP/2 may be chosen by ALPN. What neither server does is
bound what slow or idle clients hold. Here each accepted connection is counted (in all
and per client address) before it is served. Past a cap, a place is first taken from a
connection that holds one without using it (``conn_limits.py``): the oldest that has not
yet sent a whole request head, else the one idle longest between requests on keep-alive,
of that address for the per-address cap and of any address for the total cap. It is
closed unanswered and the newcomer is served, so idle sockets cannot lock working
clients out. Only when every place holds a request in flight is the newcomer refused: an
immediate ``503`` with ``Connection: close`` (a plain-HTTP connection) or closed (TLS,
where an answer would first cost a handshake). A new connection that has not sent a
whole request head within ``header_timeout_s`` is closed; an idle keep-alive one after
``keep_alive_timeout_s``. A head larger than ``max_header_kb`` is answered ``431`` with
a message: here while it is still incomplete, and by the gateway once parsed
(``web/middleware/head_limit.py``), since the parsers bound only an incomplete head. The
serving loop is ``hypercorn.trio.run.worker_serve`` without QUIC and worker recycling,
with ``TCPServer`` subclassed to add the above (tests/e2e/test_connections.py,
tests/e2e/test_transport.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Event, RawData, Updated
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState, LifespanState
from hypercorn.utils import ShutdownError, raise_shutdown, repr_socket_addr, wrap_app

from blazar.config import Config
from blazar.errors import Dialect, error_body
from blazar.web.asgi.conn_limits import ConnectionLimits, Refused
from blazar.web.asgi.direct import WATCH_GONE
from blazar.web.asgi.h1 import H1Connection, Upgrade
from blazar.web.asgi.protocols import load_http2

__all__ = ["ConnectionLimits", "hypercorn_config", "serve"]

log = logging.getLogger("blazar.listen")

_REFUSAL_DRAIN_S = 1.0
"""How long a refused plain connection is read (and dropped) so the client sees the 503."""


def hypercorn_config(config: Config) -> HypercornConfig:
    """hypercorn's settings for the daemon's config: bind, TLS, header and keep-alive limits."""
    hconfig = HypercornConfig()
    host = config.host
    hconfig.bind = [f"[{host}]:{config.port}" if ":" in host else f"{host}:{config.port}"]
    hconfig.graceful_timeout = config.drain_grace_s
    hconfig.accesslog = None
    hconfig.errorlog = logging.getLogger("hypercorn.error")
    hconfig.keep_alive_timeout = config.keep_alive_timeout_s
    hconfig.h11_max_incomplete_size = config.max_header_kb * 1024
    hconfig.h2_max_header_list_size = config.max_header_kb * 1024
    hconfig.ssl_handshake_timeout = config.header_timeout_s
    hconfig.backlog = max(hconfig.backlog, min(config.max_connections, 4096))
    if config.tls_cert is not None and config.tls_key is not None:
        hconfig.certfile = str(Path(config.tls_cert).expanduser())
        hconfig.keyfile = str(Path(config.tls_key).expanduser())
    return hconfig


def _refusal_bytes(status: int, code: str, message: str) -> bytes:
    body = msgspec.json.encode(error_body(Dialect.OPENAI, code, message))
    reason = {400: b"Bad Request", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n"
    extra = b"retry-after: 1\r\n" if status == 503 else b""
    return head % (status, reason.get(status, b"Error"), len(body)) + extra + b"\r\n" + body


def _head_refusal(config: Config, status: int) -> bytes:
    """The worded answer to a head the parser could not take: too large (431), or not HTTP."""
    if status == 431:
        message = (
            f"the request head is larger than {config.max_header_kb} KiB (max_header_kb): "
            "send fewer or shorter headers"
        )
        return _refusal_bytes(431, "HEADERS_TOO_LARGE", message)
    return _refusal_bytes(
        400, "BAD_REQUEST", "the request is not valid HTTP/1.1: check the request line and headers"
    )


def _admitted(limits: ConnectionLimits[Any], key: Any, client: str) -> str | None:
    """Take a place for a new connection, shedding unused ones where a cap is reached;
    the reason it is refused, or None."""
    decision = limits.admit(key, client)
    if isinstance(decision, Refused):
        if _worth_logging(limits.refused):
            log.warning(
                "refused a connection from %s: %s (%d refused so far)",
                client,
                decision.reason,
                limits.refused,
            )
        return decision.reason
    for victim in decision.shed:
        victim.shed()
    if decision.shed and _worth_logging(shed := limits.shed_fresh + limits.shed_idle):
        fresh, idle = limits.sheddable()
        log.warning(
            "closed an unused connection to admit one from %s: the connection caps are reached "
            "(%d closed so far: %d before their first request, %d idle between requests; "
            "%d and %d such connections open now)",
            client,
            shed,
            limits.shed_fresh,
            limits.shed_idle,
            fresh,
            idle,
        )
    return None


async def _refuse(stream: trio.abc.Stream, tls: bool, reason: str) -> None:
    """Refuse a connection over the caps: a plain one is answered 503, a TLS one closed."""
    try:
        if not tls:
            message = f"connection refused: {reason}; retry shortly, or ask for higher caps"
            await stream.send_all(_refusal_bytes(503, "TOO_MANY_CONNECTIONS", message))
            assert isinstance(stream, trio.SocketStream)
            await stream.send_eof()
            with trio.move_on_after(_REFUSAL_DRAIN_S):  # read what it sent, so no reset hides the 503
                while await stream.receive_some(65536):
                    pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


def _client_of(sock: trio.socket.SocketType) -> str | None:
    try:
        peer = sock.getpeername()
    except OSError:
        return None  # gone before it was seen
    return str(peer[0]) if sock.family in (socket.AF_INET, socket.AF_INET6) else "local"


class _Replayed(trio.abc.HalfCloseableStream):
    """A plain connection handed to hypercorn (``h1.Upgrade``): what was read of it first."""

    def __init__(self, stream: trio.SocketStream, data: bytes) -> None:
        self._stream = stream
        self._data = data
        self.socket = stream.socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if data := self._data:
            self._data = b""
            await trio.lowlevel.checkpoint()
            return data
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


class _Connection(TCPServer):
    """A connection hypercorn serves (TLS, where HTTP/2 may be chosen, or a plain one that
    changed protocols): counted, with a deadline for its first request head, and a worded
    answer where hypercorn would send an empty 400 or 431."""

    def __init__(
        self,
        limits: ConnectionLimits[Any],
        config: Config,
        app: AppWrapper,
        hconfig: HypercornConfig,
        *a: Any,
    ) -> None:
        super().__init__(partial(self._app, app), hconfig, *a)
        self._limits = limits
        self._blazar = config
        self._busy = False  # a request is being answered
        self._served = False  # a request head arrived
        self._gone = False  # the client closed its side (or the read failed)
        self._socket: trio.socket.SocketType | None = None
        self._idle_scope: trio.CancelScope | None = None
        """The idle watcher's scope: its deadline is moved as requests start and end."""
        self._idle_again: trio.Event | None = None
        """Set when a request ends while the server stops (the watcher then closes)."""
        self._on_gone: Callable[[], None] | None = None
        """Called once when the client goes (``direct.WATCH_GONE``)."""

    async def _app(
        self, app: AppWrapper, scope: Any, receive: Any, send: Any, sync_spawn: Any, call_soon: Any
    ) -> None:
        """The app, offered on HTTP/1.1 the watch for its client's going."""
        if not (scope["type"] == "http" and scope["http_version"] != "2"):
            await app(scope, receive, send, sync_spawn, call_soon)
            return
        extensions = scope["extensions"]
        extensions[WATCH_GONE] = self._watch_gone
        try:
            await app(scope, receive, send, sync_spawn, call_soon)
        finally:
            # The watch holds this connection: a cycle each request would leave to the
            # garbage collector.
            extensions.pop(WATCH_GONE, None)
            self._on_gone = None

    def _watch_gone(self, on_gone: Callable[[], None] | None) -> None:
        if on_gone is not None and self._gone:
            on_gone()
        else:
            self._on_gone = on_gone

    async def run(self) -> None:
        tls = not isinstance(self.stream, trio.SocketStream)
        sock = self.stream.transport_stream.socket if tls else self.stream.socket
        client = _client_of(sock)
        if client is None:
            return
        self._socket = sock
        if (refused := _admitted(self._limits, self, client)) is not None:
            await _refuse(self.stream, tls, refused)
            return
        try:
            await super().run()
        finally:
            self._limits.release(self)

    async def run_changed(self) -> None:
        """Serve a plain connection whose place is held by the one it changed from."""
        self._socket = self.stream.socket
        self._served = True
        await super().run()

    def shed(self) -> None:
        """End this connection now, from another connection's task, to free its place.

        It holds no request (only fresh or idle connections are picked), so there is nothing
        to answer. Its socket's receiving side is shut: this connection's own task, blocked
        reading it (or in a TLS handshake), reads an end of stream at once, and hypercorn's
        loop ends as for a client that hung up; ``run`` then closes the socket and releases
        nothing, the place having been given back already. The socket is not closed from
        here: a TLS stream whose transport vanished underneath it fails its own close."""
        self._gone = True
        if self._socket is not None:
            with contextlib.suppress(OSError):  # already disconnected
                self._socket.shutdown(socket.SHUT_RD)

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            # Synchronously, before any checkpoint: no other connection's admission can pick
            # this one between its head arriving and its leaving the sheddable set.
            self._busy = not event.idle
            self._served = self._served or not event.idle
            if event.idle:
                self._limits.idle(self)
            else:
                self._limits.busy(self)
            if (scope := self._idle_scope) is not None:
                # One watcher for the connection's life, its deadline moved here: hypercorn
                # would start a new task at every request's end and cancel it at the next
                # one's start, a task and two scheduler trips per request.
                scope.deadline = (
                    trio.current_time() + self._blazar.keep_alive_timeout_s if event.idle else math.inf
                )
                if event.idle and self._idle_again is not None:
                    self._idle_again.set()
                return
        elif isinstance(event, RawData) and not self._busy and event.data.startswith(b"HTTP/1.1 4"):
            # Only a head hypercorn could not parse is answered outside a request: say why.
            event = RawData(data=_head_refusal(self._blazar, 431 if event.data[9:12] == b"431" else 400))
        await super().protocol_send(event)

    async def _read_data(self) -> None:
        await super()._read_data()
        # The client is gone. hypercorn would still wait out the idle timer before closing its
        # side, leaving the socket in CLOSE-WAIT for keep_alive_timeout_s after every client
        # that hangs up between requests: end the timer now.
        self._gone = True
        if (on_gone := self._on_gone) is not None:
            self._on_gone = None
            on_gone()
        await self.idle_task.stop()

    async def _idle_timeout(self) -> None:
        """Close the connection when it has been idle too long (``protocol_send`` moves the
        deadline: none while a request runs), or once the server stops and no request runs."""
        if self._gone:
            timeout = 0.0
        elif self._served:
            timeout = self._blazar.keep_alive_timeout_s
        else:
            timeout = self._blazar.header_timeout_s
        with trio.CancelScope(deadline=trio.current_time() + timeout) as scope:
            self._idle_scope = scope
            await self.context.terminated.wait()
            while self._busy:  # the server stops: a request in flight ends first
                self._idle_again = trio.Event()
                await self._idle_again.wait()
        self._idle_scope = None
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()


class _Plain:
    """The plain connections: served by ``h1.H1Connection``, handed to hypercorn where
    they change protocols."""

    def __init__(
        self,
        app: Any,
        config: Config,
        limits: ConnectionLimits[Any],
        hypercorn: Callable[[trio.abc.Stream], _Connection],
        state: LifespanState,
    ) -> None:
        self._app = app
        self._config = config
        self._limits = limits
        self._hypercorn = hypercorn
        self._state = state
        self._live: set[H1Connection] = set()
        self._refusal = partial(_head_refusal, config)

    async def __call__(self, stream: trio.SocketStream) -> None:
        sock = stream.socket
        client = _client_of(sock)
        if client is None:
            await trio.aclose_forcefully(stream)
            return
        limits, config = self._limits, self._config
        connection = H1Connection(
            sock,
            self._app,
            header_timeout_s=config.header_timeout_s,
            keep_alive_timeout_s=config.keep_alive_timeout_s,
            max_head=config.max_header_kb * 1024,
            refusal=self._refusal,
            state=dict(self._state),
            on_busy=lambda busy: limits.busy(connection) if busy else limits.idle(connection),
        )
        if (refused := _admitted(limits, connection, client)) is not None:
            await _refuse(stream, False, refused)
            return
        self._live.add(connection)
        try:
            await connection.run()
        except Upgrade as upgrade:
            limits.busy(connection)  # held by the other protocol for its life
            await self._hypercorn(_Replayed(stream, upgrade.data)).run_changed()
        except Exception:  # a fault of one connection's must not end the listener
            log.exception("a connection from %s failed", client)
            with contextlib.suppress(OSError):
                sock.close()
        finally:
            self._live.discard(connection)
            limits.release(connection)

    def stop(self) -> None:
        for connection in list(self._live):
            connection.stop()


def _worth_logging(count: int) -> bool:
    """The 1st, 10th, 100th and every 1000th of a kind of event: a flood logs a few lines."""
    return count in (1, 10, 100) or count % 1000 == 0


async def serve(
    app: Any,
    config: Config,
    hconfig: HypercornConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until ``shutdown_trigger`` returns; ``task_status`` gets the bound URLs."""
    hconfig.set_statsd_logger_class(StatsdLogger)
    wrapped = wrap_app(app, hconfig.wsgi_max_body_size, "asgi")
    limits: ConnectionLimits[_Connection] = ConnectionLimits(
        config.max_connections, config.max_connections_per_client
    )
    state: LifespanState = {}
    lifespan = Lifespan(wrapped, hconfig, state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            sockets = hconfig.create_sockets()
            ssl_context = hconfig.create_ssl_context()
            if ssl_context is not None:
                load_http2()  # TLS clients ask for HTTP/2 (ALPN): not at the first one's expense
            listeners: list[trio.abc.Listener[Any]] = []
            binds = []
            for sock, secure in [(s, True) for s in sockets.secure_sockets] + [
                (s, False) for s in sockets.insecure_sockets
            ]:
                sock.listen(hconfig.backlog)
                listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                if secure:
                    assert ssl_context is not None
                    listeners.append(trio.SSLListener(listener, ssl_context, https_compatible=True))
                else:
                    listeners.append(listener)
                scheme = "https" if secure else "http"
                binds.append(f"{scheme}://{repr_socket_addr(sock.family, sock.getsockname())}")
            task_status.started(binds)
            hypercorn = partial(
                _Connection, limits, config, wrapped, hconfig, context, ConnectionState(state.copy())
            )
            plain = _Plain(app, config, limits, hypercorn, state)

            async def handler(stream: trio.abc.Stream) -> None:
                if isinstance(stream, trio.SocketStream):
                    await plain(stream)
                else:
                    await hypercorn(stream).run()

            try:
                async with trio.open_nursery(strict_exception_groups=True) as nursery:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(
                        partial(trio.serve_listeners, handler, listeners, handler_nursery=server_nursery)
                    )
                    await trio.sleep_forever()
            except BaseExceptionGroup as error:
                _, others = error.split((ShutdownError, KeyboardInterrupt))
                if others is not None:
                    raise others from None
            finally:
                await context.terminated.set()
                plain.stop()
                server_nursery.cancel_scope.deadline = trio.current_time() + hconfig.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
