"""MCP routes: the configured servers and, for operators, their tools by hand.

``GET /api/mcp`` lists every ``[[mcp]]`` server (name, transport, state, and its cached
tools once started) and never starts one. ``POST /api/mcp/{name}/tools`` lists a server's
tools, starting it; ``POST /api/mcp/{name}/call`` with ``{"tool": T, "arguments": {...}}``
calls one. Both need an admin key (``/api/mcp/`` is an admin prefix). A server that fails
is still a 200: the answer's ``error`` (tools) or ``is_error`` (call) says what happened.
"""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Response
from quart_trio import QuartTrio

from blazar.errors import BlazarError
from blazar.web.asgi.replies import app_runtime, json_response, read_body

__all__ = ["register"]


class _CallBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tool: str
    arguments: dict[str, Any] = {}


def _known(name: str) -> None:
    runtime = app_runtime()
    if name not in runtime.mcp.configs:
        known = ", ".join(runtime.mcp.names()) or "none is configured"
        raise BlazarError(
            "MCP_SERVER_NOT_FOUND",
            f"no MCP server named '{name}' (configured: {known}) — add an [[mcp]] entry to config.toml",
        )


async def servers() -> Response:
    runtime = app_runtime()
    return json_response({"servers": runtime.mcp.servers(), "default": runtime.mcp.default})


async def tools(name: str) -> Response:
    _known(name)
    return json_response(await app_runtime().mcp.list_tools(name))


async def call(name: str) -> Response:
    _known(name)
    try:
        body = msgspec.json.decode(await read_body(), type=_CallBody)
    except msgspec.ValidationError as exc:
        raise BlazarError("BAD_REQUEST", f"invalid body for /api/mcp/{name}/call: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BlazarError("INVALID_JSON", f"the body is not valid JSON: {exc}") from None
    return json_response(await app_runtime().mcp.call_tool(name, body.tool, body.arguments))


def register(app: QuartTrio) -> None:
    """``GET /api/mcp``, ``POST /api/mcp/<name>/tools``, ``POST /api/mcp/<name>/call``."""
    app.get("/api/mcp")(servers)
    app.post("/api/mcp/<name>/tools")(tools)
    app.post("/api/mcp/<name>/call")(call)
