"""A worker's WebSocket bridge: a client's WebSocket (``/v1/realtime``) carried to the runtime.

The runtime serves WebSockets as it serves every route, on its private HTTP socket; a worker
opens a WebSocket of its own to it there for each client that asks, with the client's
headers (its key, origin and subprotocols), the worker's token, the client's address and
scheme, then passes messages both ways as they come. The runtime decides everything: the
host guard, the key, the session. Its refusal before the upgrade (a 403 or 404 with its
JSON error) is sent to the client as it came, where the worker's server can send an HTTP
answer to a WebSocket (ASGI's ``websocket.http.response``), else as a close. A close from
either side closes the other, with its code; a client that vanishes closes the runtime's
side, which ends the session there as a client's close would.

Sans the HTTP client: the protocol is ``wsproto``'s (the server's own WebSocket library),
the transport a trio Unix socket stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
import wsproto
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from blazar.daemon.worker_channel import connect_unix

__all__ = ["bridge"]

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_READ = 65536
_NOT_FORWARDED = frozenset(
    {
        b"host",
        b"connection",
        b"upgrade",
        b"sec-websocket-key",
        b"sec-websocket-version",
        b"sec-websocket-extensions",
        b"sec-websocket-protocol",
        b"content-length",
        b"transfer-encoding",
    }
)
"""What ``wsproto`` sets itself for the worker's own handshake (the subprotocols are passed
as its argument)."""
_SERVERS_OWN = frozenset({b"content-length", b"transfer-encoding", b"connection", b"date", b"server"})
"""What the worker's own server sets on the refusal it sends."""
_GONE = 1011
"""The close code a client gets when the runtime cannot be reached or breaks."""


async def bridge(
    path: str, scope: dict[str, Any], receive: Receive, send: Send, extra: list[tuple[bytes, bytes]]
) -> None:
    """Carry the client's WebSocket in ``scope`` to the runtime listening on ``path``;
    ``extra``: the headers the worker adds (its token, the client's address and scheme)."""
    if (await receive())["type"] != "websocket.connect":
        return
    try:
        stream = trio.SocketStream(await connect_unix(path))
    except OSError:
        await send(
            {"type": "websocket.close", "code": _GONE, "reason": "the daemon's runtime is not answering"}
        )
        return
    async with stream:
        ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        headers = [
            (k, v)
            for k, v in scope["headers"]
            if k not in _NOT_FORWARDED and not k.startswith(b"x-blazar-worker")
        ]
        host = next((v for k, v in scope["headers"] if k == b"host"), b"localhost")
        request = Request(
            host=host.decode("latin-1"),  # the client's: the runtime's host guard reads it
            target=target.decode("latin-1"),
            extra_headers=headers + extra,
            subprotocols=list(scope.get("subprotocols") or []),
        )
        await stream.send_all(ws.send(request))
        if not await _handshake(ws, stream, scope, send):
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_to_runtime, ws, stream, receive, nursery.cancel_scope)
            await _to_client(ws, stream, send)
            nursery.cancel_scope.cancel()


async def _handshake(
    ws: wsproto.WSConnection, stream: trio.SocketStream, scope: dict[str, Any], send: Send
) -> bool:
    """The runtime's answer to the upgrade, passed to the client; True once accepted."""
    rejected: RejectConnection | None = None
    body: list[bytes] = []
    while True:
        data = await stream.receive_some(_READ)
        ws.receive_data(data or None)
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                accept: dict[str, Any] = {"type": "websocket.accept", "subprotocol": event.subprotocol}
                if event.extra_headers:
                    accept["headers"] = list(event.extra_headers)
                await send(accept)
                return True
            if isinstance(event, RejectConnection):
                rejected = event
                if not event.has_body:
                    return await _refuse(scope, send, rejected, b"")
            elif isinstance(event, RejectData):
                body.append(event.data)
                if event.body_finished and rejected is not None:
                    return await _refuse(scope, send, rejected, b"".join(body))
        if not data:
            if rejected is not None:
                return await _refuse(scope, send, rejected, b"".join(body))
            await send({"type": "websocket.close", "code": _GONE, "reason": "the daemon's runtime closed"})
            return False


async def _refuse(scope: dict[str, Any], send: Send, rejected: RejectConnection, body: bytes) -> bool:
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008})
        return False
    headers = [
        (k, v)
        for k, v in rejected.headers
        if k.lower() not in (b"content-length", b"transfer-encoding", b"connection")
    ]
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "websocket.http.response.start", "status": rejected.status_code, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
    return False


async def _to_runtime(
    ws: wsproto.WSConnection, stream: trio.SocketStream, receive: Receive, done: trio.CancelScope
) -> None:
    """The client's messages to the runtime, until the client closes or leaves."""
    while True:
        message = await receive()
        if message["type"] == "websocket.receive":
            text = message.get("text")
            event: Message[Any] = (
                TextMessage(data=text) if text is not None else BytesMessage(data=message.get("bytes") or b"")
            )
            await stream.send_all(ws.send(event))
        elif message["type"] == "websocket.disconnect":
            if ws.state is wsproto.connection.ConnectionState.OPEN:
                code = message.get("code") or 1000
                with trio.move_on_after(2), trio.CancelScope(shield=True):
                    await stream.send_all(ws.send(CloseConnection(code=code)))
            done.cancel()
            return


async def _to_client(ws: wsproto.WSConnection, stream: trio.SocketStream, send: Send) -> None:
    """The runtime's messages to the client, until the runtime closes (the events that came
    with the handshake's answer first)."""
    parts: list[Any] = []
    while True:
        for event in ws.events():
            if isinstance(event, TextMessage | BytesMessage):
                parts.append(event.data)
                if not event.message_finished:
                    continue
                whole = "".join(parts) if isinstance(event, TextMessage) else b"".join(parts)
                parts = []
                key = "text" if isinstance(whole, str) else "bytes"
                await send({"type": "websocket.send", key: whole})
            elif isinstance(event, Ping):
                await stream.send_all(ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                if ws.state is not wsproto.connection.ConnectionState.CLOSED:
                    await stream.send_all(ws.send(event.response()))
                await send({"type": "websocket.close", "code": event.code, "reason": event.reason or ""})
                return
        data = await stream.receive_some(_READ)
        if not data:
            await send({"type": "websocket.close", "code": _GONE, "reason": "the daemon's runtime closed"})
            return
        ws.receive_data(data)
