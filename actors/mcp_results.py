"""What the MCP actors hand out: tools under their offered names, and call results as text.

Pure functions and plain structs (no I/O, no trio), so the gateway's loop and the tests
use them without a server: ``qualified_name``/``split_qualified`` for the
``mcp__<server>__<tool>`` names, ``tools_of`` for a server's listing, ``result_text``
for a ``tools/call`` result, ``cap_text`` for the size cap.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    import mcp.types as mt  # imported where a result is read: see actors/mcp.py

__all__ = [
    "PREFIX",
    "McpCallResult",
    "McpServerStatus",
    "McpTool",
    "McpToolList",
    "cap_text",
    "error_result",
    "qualified_name",
    "result_text",
    "split_qualified",
    "tools_of",
]

PREFIX = "mcp__"


class McpTool(msgspec.Struct, frozen=True, kw_only=True):
    """One tool as the gateway offers it: the neutral tool spec's fields, and where it lives."""

    server: str
    name: str
    """The tool's own name on its server."""
    qualified: str
    """``mcp__<server>__<tool>``: the name the model sees and calls."""
    description: str | None = None
    input_schema: dict[str, Any] = {}
    """A JSON schema for the arguments object."""


class McpToolList(msgspec.Struct, frozen=True, kw_only=True):
    """A server's tools, or why there are none (it could not start, or listing failed)."""

    server: str
    tools: list[McpTool] = []
    error: str | None = None
    blazar_code: str | None = None
    """A stable code for ``error`` where there is one (``MCP_PROTOCOL_UNSUPPORTED``)."""


class McpCallResult(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call's outcome as text the loop feeds back to the model. Failure is a result
    too: ``is_error`` is set and ``text`` says what happened (and what the model may do)."""

    server: str
    tool: str
    qualified: str
    text: str
    is_error: bool = False
    why: str | None = None
    """For an error made here, not by the tool: ``timeout``, ``unavailable``, ``disconnected``,
    ``unknown_tool``, ``unknown_server``, ``protocol``; None for the tool's own answer."""
    truncated_bytes: int = 0
    """Bytes cut from the text by the size cap (0: whole)."""
    elapsed_s: float = 0.0


class McpServerStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One configured server as ``GET /api/mcp`` shows it (reading it starts nothing)."""

    name: str
    transport: str
    """``stdio`` or ``http``."""
    target: str
    """The command line (stdio) or the URL (http)."""
    state: str
    """``stopped`` (never started, or stopped), ``starting``, ``ready``, ``failed``."""
    started: bool
    tools: list[McpTool] | None = None
    """The cached tools while ready; None otherwise."""
    starts: int = 0
    failures: int = 0
    """Failed starts in a row (reset by a good start); they set the backoff."""
    retry_after_s: float | None = None
    """After a failed start: seconds until the next use may try again."""
    last_error: str | None = None
    last_error_code: str | None = None
    """A stable code for ``last_error`` where there is one (``MCP_PROTOCOL_UNSUPPORTED``)."""
    server_info: str | None = None
    """The server's own name and version, once it has started."""
    protocol_version: str | None = None
    """The MCP protocol revision the session speaks (``2026-07-28``, ``2025-11-25`` or
    ``2025-06-18``), once started; the last one while stopped or failed."""
    stderr_tail: str = ""
    """The last lines a stdio server wrote to stderr."""


def qualified_name(server: str, tool: str) -> str:
    return f"{PREFIX}{server}__{tool}"


def split_qualified(name: str) -> tuple[str, str] | None:
    """``(server, tool)`` of an offered name, None for a name that is not an MCP tool's.
    Server names never contain ``__`` (config validation), so the first one splits."""
    if not name.startswith(PREFIX):
        return None
    server, sep, tool = name[len(PREFIX) :].partition("__")
    if not sep or not server or not tool:
        return None
    return server, tool


def tools_of(server: str, listed: list[mt.Tool]) -> list[McpTool]:
    return [
        McpTool(
            server=server,
            name=tool.name,
            qualified=qualified_name(server, tool.name),
            description=tool.description,
            input_schema=dict(tool.input_schema or {"type": "object"}),
        )
        for tool in listed
    ]


def _block_text(block: Any) -> str:
    import mcp.types as mt

    if isinstance(block, mt.TextContent):
        return block.text
    if isinstance(block, mt.ImageContent | mt.AudioContent):
        kind = "image" if isinstance(block, mt.ImageContent) else "audio"
        return f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4} bytes, not shown]"
    if isinstance(block, mt.ResourceLink):
        return f"[resource {block.uri}]"
    if isinstance(block, mt.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mt.TextResourceContents):
            return resource.text
        return f"[resource {resource.uri}, binary, not shown]"
    return f"[{getattr(block, 'type', 'unknown')} content, not shown]"


def result_text(result: mt.CallToolResult) -> str:
    """The content blocks joined by newlines; the structured content (as JSON) when the
    result has no blocks."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False)]
    return "\n".join(parts)


def cap_text(text: str, limit: int) -> tuple[str, int]:
    """``text`` cut to at most ``limit`` UTF-8 bytes (at a character boundary) with a note
    saying how much was cut; returns the text and the bytes cut (0: whole)."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, 0
    kept = data[:limit].decode("utf-8", "ignore")
    cut = len(data) - len(kept.encode("utf-8"))
    note = f"\n[output truncated: {cut} of {len(data)} bytes cut (the limit is {limit} bytes)]"
    return kept + note, cut


def error_result(server: str, tool: str, why: str, text: str, *, elapsed_s: float = 0.0) -> McpCallResult:
    return McpCallResult(
        server=server,
        tool=tool,
        qualified=qualified_name(server, tool),
        text=text,
        is_error=True,
        why=why,
        elapsed_s=elapsed_s,
    )
