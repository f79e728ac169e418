"""The test tools (tools_server.py) served over Streamable HTTP at one MCP protocol revision.

Run as ``python tests/mcp_servers/versioned_server.py --http PORT --protocol VERSION``, or
with ``--fd N`` to serve on a listening socket it inherits (``launch.py``: no port to race for).

The SDK's server (mcp 2.3) speaks every revision at once: 2026-07-28 when a request
carries that version's envelope, else the ``initialize`` handshake. To test how a client
finds the newest revision a server speaks, each run here speaks exactly one:

- ``2026-07-28``: stateless only. A request must name that revision in its
  ``MCP-Protocol-Version`` header; the handshake (no header, or a 2025 one) is refused with
  the SDK's own -32022 rejection naming the versions served, and a request that carries an
  ``Mcp-Session-Id`` is refused (the revision has no sessions).
- a handshake revision (``2025-11-25``, ``2025-06-18``, ``2025-03-26``): the SDK's
  handshake answers with that revision (its negotiation table is narrowed to it), and a
  request whose ``MCP-Protocol-Version`` header names another revision gets the 400 that
  the 2025 specifications require of a server for an unsupported version (so
  ``server/discover`` at 2026-07-28 is refused as a server of that year refuses it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tools_server import server

MODERN = "2026-07-28"
Scope = dict[str, Any]


def _header(scope: Scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


async def _refuse(send: Any, status: int, code: int, message: str, data: Any = None) -> None:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": body})


def one_revision(app: Any, version: str) -> Any:
    """``app`` (the SDK's Streamable HTTP app) answering only at ``version``."""
    from mcp.shared.inbound import unsupported_protocol_version_rejection

    async def serve(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        asked = _header(scope, b"mcp-protocol-version")
        if version == MODERN:
            if _header(scope, b"mcp-session-id") is not None:
                await _refuse(send, 400, -32600, f"Bad Request: {MODERN} has no sessions")
                return
            rejection = unsupported_protocol_version_rejection(asked or "", [MODERN])
            if rejection is not None:
                await _refuse(send, 400, rejection.code, rejection.message, rejection.data)
                return
        elif asked is not None and asked != version:
            message = f"Bad Request: Unsupported protocol version: {asked}. Supported versions: {version}"
            await _refuse(send, 400, -32600, message)
            return
        await app(scope, receive, send)

    return serve


def main() -> None:
    parser = argparse.ArgumentParser()
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--http", type=int, help="serve Streamable HTTP on this port")
    where.add_argument("--fd", type=int, help="... on this inherited listening socket")
    parser.add_argument("--protocol", required=True, help="the one MCP protocol revision to speak")
    args = parser.parse_args()
    if args.protocol != MODERN:
        from mcp.server import runner

        # The handshake picks the client's offer when it is in this table, else the
        # table's newest: with the one revision in it, every handshake settles on it.
        runner.HANDSHAKE_PROTOCOL_VERSIONS = (args.protocol,)  # type: ignore[misc]
        runner.LATEST_HANDSHAKE_VERSION = args.protocol  # type: ignore[misc]
    import uvicorn

    server.settings.log_level = "WARNING"

    app = server.streamable_http_app(stateless_http=args.protocol == MODERN)
    served = one_revision(app, args.protocol)
    if args.fd is not None:
        import socket

        config = uvicorn.Config(served, log_level="warning")
        anyio.run(uvicorn.Server(config).serve, [socket.socket(fileno=args.fd)])
        return
    config = uvicorn.Config(served, host="127.0.0.1", port=args.http, log_level="warning")
    anyio.run(uvicorn.Server(config).serve)


if __name__ == "__main__":
    main()
