"""The compact catalog: three meta-tools in place of every MCP tool's schema.

A model with a small context (or a slow prefill) cannot read forty tool schemas on every
turn. For servers whose catalog is ``compact`` (their ``catalog``, ``mcp_catalog``, or the
request's ``x-blazar-mcp-catalog``) the model is offered instead:

- ``mcp_find_tools {"query"}``: the tools that best match some keywords, each as its
  signature and first sentence (``actors.mcp_catalog.rank``);
- ``mcp_tool_schema {"name"}``: one tool's description and argument schema;
- ``mcp_call_tool {"name", "arguments"}``: run that tool.

The gateway answers the first two itself, as tool results, and turns the third into the
real tool's call, which then runs like any other (key scopes, approval, timeouts). The
prompt keeps the same three tools every round, so the engine's prompt cache still holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from actors.mcp_catalog import rank, resolve, summary
from actors.mcp_results import McpCallResult, McpTool
from blazar.dialects.neutral import ToolCall, ToolSpec
from blazar.errors import BlazarError

__all__ = ["CALL", "CATALOG_HEADER", "FIND", "META", "SCHEMA", "Compact", "Lookup", "parse_catalog"]

CATALOG_HEADER = "x-blazar-mcp-catalog"
"""Where a request chooses the catalog of every server it uses: ``compact`` or ``full``."""
FIND = "mcp_find_tools"
SCHEMA = "mcp_tool_schema"
CALL = "mcp_call_tool"
META = frozenset({FIND, SCHEMA, CALL})
_FOUND = 5
"""Tools one search answers with."""


def parse_catalog(raw: str | None) -> Literal["full", "compact"] | None:
    """An ``x-blazar-mcp-catalog`` value (None: the servers' own choice)."""
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in ("full", "compact"):
        return value  # type: ignore[return-value]
    raise BlazarError(
        "BAD_REQUEST",
        f"X-Blazar-Mcp-Catalog must be `compact` or `full`, got {raw[:40]!r}",
        param=CATALOG_HEADER,
    )


@dataclass(frozen=True, slots=True)
class Lookup:
    """A meta-call the gateway answered itself: its text goes back to the model."""

    text: str
    ok: bool


def _arguments(call: ToolCall) -> dict[str, Any] | None:
    try:
        parsed = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


class Compact:
    """One request's compact catalog: the tools behind the meta-tools (those its key may use)."""

    def __init__(self, tools: list[McpTool], servers: list[str]) -> None:
        self.tools = tools
        self.servers = servers

    def specs(self) -> list[ToolSpec]:
        """The three meta-tools, as the model sees them."""
        count, where = len(self.tools), ", ".join(self.servers)
        name = {"type": "string", "description": "the tool's name, as mcp_find_tools gives it"}
        return [
            ToolSpec(
                name=FIND,
                description=f"Search {count} tools (MCP servers: {where}) by keywords; "
                "gives the best matching tool names with their arguments.",
                parameters={
                    "type": "object",
                    "properties": {"query": {"type": "string", "description": "a few keywords"}},
                    "required": ["query"],
                },
            ),
            ToolSpec(
                name=SCHEMA,
                description="Read one tool's description and the JSON schema of its arguments.",
                parameters={"type": "object", "properties": {"name": name}, "required": ["name"]},
            ),
            ToolSpec(
                name=CALL,
                description="Call a tool by name with its arguments.",
                parameters={
                    "type": "object",
                    "properties": {
                        "name": name,
                        "arguments": {"type": "object", "description": "the tool's arguments"},
                    },
                    "required": ["name", "arguments"],
                },
            ),
        ]

    def spec_of(self, name: str) -> ToolSpec | None:
        """The full spec of a catalog tool, by its offered name (a client's forced choice)."""
        for t in self.tools:
            if t.qualified == name:
                return ToolSpec(name=t.qualified, description=t.description, parameters=t.input_schema)
        return None

    def answer(self, call: ToolCall) -> Lookup | ToolCall:
        """What a meta-call means: a lookup's text, or the real tool's call to run (same id)."""
        args = _arguments(call)
        if args is None:
            return Lookup(f"error: the arguments of {call.name} must be a JSON object", ok=False)
        if call.name == FIND:
            return self._find(str(args.get("query") or ""))
        name = args.get("name")
        if not isinstance(name, str) or not name.strip():
            return Lookup(f'error: {call.name} needs "name", a tool name from {FIND}', ok=False)
        tool, near = resolve(self.tools, name)
        if tool is None:
            return Lookup(self._unknown(name, near), ok=False)
        if call.name == SCHEMA:
            return Lookup(self._schema(tool), ok=True)
        arguments = args.get("arguments", {})
        if isinstance(arguments, str):  # a model that wrote the object as a string
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                pass
        if not isinstance(arguments, dict):
            return Lookup(f'error: "arguments" of {CALL} must be an object; see {SCHEMA}', ok=False)
        return ToolCall(id=call.id, name=tool.qualified, arguments=json.dumps(arguments))

    def _find(self, query: str) -> Lookup:
        found = rank(self.tools, query, _FOUND)
        if not found:
            names = ", ".join(t.qualified for t in self.tools[:40])
            more = f" (and {len(self.tools) - 40} more)" if len(self.tools) > 40 else ""
            return Lookup(f"no tool matches {query!r}; the tools are: {names}{more}", ok=False)
        lines = "\n".join(f"- {summary(t)}" for t in found)
        return Lookup(f"{lines}\nCall one with {CALL}; its arguments' schema is given by {SCHEMA}.", ok=True)

    @staticmethod
    def _schema(tool: McpTool) -> str:
        schema = json.dumps(tool.input_schema or {"type": "object"}, separators=(",", ":"))
        doc = " ".join((tool.description or "").split())
        return f"{tool.qualified}: {doc}\narguments (JSON schema): {schema}"

    @staticmethod
    def _unknown(name: str, near: list[McpTool]) -> str:
        if not near:
            return f"error: no tool named {name!r}; search with {FIND}"
        return f"error: no single tool named {name!r}; did you mean: " + ", ".join(t.qualified for t in near)


def lookup_result(call: ToolCall, lookup: Lookup) -> McpCallResult:
    """A lookup as a call result, for the loop's bookkeeping (never shown as an MCP call)."""
    return McpCallResult(
        server="", tool=call.name, qualified=call.name, text=lookup.text, is_error=not lookup.ok
    )
