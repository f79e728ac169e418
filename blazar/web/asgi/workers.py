"""The runtime's listener for its data-plane workers (``workers`` above 1).

With workers, the runtime serves its whole app on a private Unix socket, and only its
workers speak to it there. A worker forwards each client request as it came, adding three
headers: the token the runtime gave it at spawn (anything without it is refused), the
client's address and the scheme it used. This wrapper checks the token, puts the client's
address and scheme back where the gateway reads them (a WebSocket a worker carries here
too), and gives every HTTP request a handoff slot (``blazar/serve/handoff.py``) in its
scope: a stream the worker can relay itself is answered with a grant. The worker's report
of how such a stream ended comes to ``POST /.blazar-worker/handoff/{id}``, which only this
listener serves.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from blazar.errors import Dialect, error_body
from blazar.serve.handoff import Handoffs, Report
from blazar.web.asgi.call import HANDOFF_EXTENSION

__all__ = ["CLIENT_HEADER", "REPORT_PATH", "SCHEME_HEADER", "TOKEN_HEADER", "WorkerSide"]

TOKEN_HEADER = b"x-blazar-worker-token"
CLIENT_HEADER = b"x-blazar-worker-client"
"""``host:port`` of the worker's client (an IPv6 host in brackets)."""
SCHEME_HEADER = b"x-blazar-worker-scheme"
REPORT_PATH = "/.blazar-worker/handoff/"

log = logging.getLogger("blazar.workers")

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
    """The ASGI app on the runtime's worker socket: the gateway, behind the token check."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._token = token.encode()
        self.handoffs = Handoffs()

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
        if scope["type"] == "websocket":  # a client's WebSocket, carried by a worker (``worker_ws``)
            inner = {**scope, "headers": kept, "client": client}
            if scheme in ("ws", "wss", "http", "https"):
                inner["scheme"] = {"http": "ws", "https": "wss"}.get(scheme, scheme)
            await self.app(inner, receive, send)
            return
        if scope["path"].startswith(REPORT_PATH) and scope["method"] == "POST":
            await self._report(scope["path"].removeprefix(REPORT_PATH), receive, send)
            return
        slot = self.handoffs.open()
        extensions = {**(scope.get("extensions") or {}), HANDOFF_EXTENSION: slot}
        inner = {**scope, "headers": kept, "client": client, "extensions": extensions}
        if scheme in ("http", "https"):
            inner["scheme"] = scheme
        try:
            await self.app(inner, receive, send)
        finally:
            self.handoffs.close(slot)

    async def _report(self, id: str, receive: Receive, send: Send) -> None:
        parts = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        slot = self.handoffs.get(id)
        if slot is None:  # its request already ended (the connection closed first)
            await _answer(send, 404, _json("NOT_FOUND", f"no handed-off stream {id!r}"))
            return
        try:
            report = msgspec.json.decode(b"".join(parts), type=Report)
        except msgspec.DecodeError as exc:
            await _answer(send, 400, _json("BAD_REQUEST", f"a malformed report: {exc}"))
            return
        try:
            answer = await slot.report(report)
        except Exception:  # a bug: the worker sends its client nothing more, the log says why
            log.exception("the report of handed-off stream %s failed", id)
            await _answer(send, 500, _json("INTERNAL", "the report of a handed-off stream failed"))
            return
        await _answer(send, 200, msgspec.json.encode(answer))
