"""The runtime's HTTP listener for its data-plane workers' WebSockets (``workers`` above 1).

A worker forwards each HTTP request over the channel (``channel.py``); a client's
WebSocket it carries here instead, to the runtime's private HTTP socket, as it came,
adding three headers: the token the runtime gave it at spawn (anything without it is
refused), the client's address and the scheme it used. This wrapper checks the token and
puts the client's address and scheme back where the gateway reads them. Plain HTTP
requests are not served here: a worker sends them over the channel.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from blazar.errors import Dialect, error_body

__all__ = ["CLIENT_HEADER", "SCHEME_HEADER", "TOKEN_HEADER", "WorkerSide"]

TOKEN_HEADER = b"x-blazar-worker-token"
CLIENT_HEADER = b"x-blazar-worker-client"
"""``host:port`` of the worker's client (an IPv6 host in brackets)."""
SCHEME_HEADER = b"x-blazar-worker-scheme"

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _client(value: bytes) -> tuple[str, int] | None:
    host, _, port = value.decode("latin-1").rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _json(code: str, message: str) -> bytes:
    return msgspec.json.encode(error_body(Dialect.OPENAI, code, message))


async def _answer(send: Send, status: int, body: bytes, content_type: bytes = b"application/json") -> None:
    headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class WorkerSide:
    """The ASGI app on the runtime's private HTTP socket: the gateway's WebSockets, behind
    the token check."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        token = client = scheme = None
        kept = []
        for name, value in scope["headers"]:
            if name == TOKEN_HEADER:
                token = value
            elif name == CLIENT_HEADER:
                client = _client(value)
            elif name == SCHEME_HEADER:
                scheme = value.decode("latin-1")
            else:
                kept.append((name, value))
        if token is None or not secrets.compare_digest(token, self._token):
            said = "this socket is the daemon's own, for its workers: send requests to its port"
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": said})
            else:
                await _answer(send, 401, _json("UNAUTHORIZED", said))
            return
        if scope["type"] != "websocket":
            said = "the daemon's workers send HTTP requests over their channel, not this socket"
            await _answer(send, 404, _json("NOT_FOUND", said))
            return
        # a client's WebSocket, carried by a worker (``worker_ws``)
        inner = {**scope, "headers": kept, "client": client}
        if scheme in ("ws", "wss", "http", "https"):
            inner["scheme"] = {"http": "ws", "https": "wss"}.get(scheme, scheme)
        await self.app(inner, receive, send)
