"""A real MCP server with forty tools, the size of an agent's toolbox, for compact catalogs.

Run as ``python tests/mcp_servers/many_server.py [AREAS]`` (stdio; ``AREAS``, 1 to 10, keeps
that many areas' four tools each, for a smaller catalog: the default is all forty). Each tool
has a description and an argument schema of the length real servers give (a few sentences,
three or four typed arguments), so the full catalog costs the thousands of prompt tokens a
small local model cannot spare. Every tool answers at once with what it was asked
(``NAME: {arguments}``), so a test sees which tool ran and with what; ``echo`` answers
``echo: TEXT`` like the other test server's.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

_AREAS = [
    ("calendar", "events in the user's calendar", ["title", "start", "end", "attendees"]),
    ("contacts", "people in the user's address book", ["name", "email", "phone", "company"]),
    ("files", "files in the user's workspace", ["path", "pattern", "encoding", "recursive"]),
    ("issues", "issues in the project's tracker", ["project", "title", "labels", "assignee"]),
    ("mail", "messages in the user's mailbox", ["folder", "subject", "sender", "limit"]),
    ("notes", "the user's notes", ["notebook", "title", "body", "tags"]),
    ("tasks", "items on the user's to-do list", ["list_name", "title", "due", "priority"]),
    ("weather", "weather reports for places", ["city", "country", "units", "days"]),
    ("stocks", "stock market quotes", ["symbol", "exchange", "currency", "period"]),
    ("translate", "text in other languages", ["text", "source", "target", "formality"]),
]
_ACTIONS = [
    ("list", "List", "Returns a page of results, newest first, with each item's id and a short summary."),
    (
        "get",
        "Read one of the",
        "Returns every field of the item with that id, or an error if it is gone.",
    ),
    ("create", "Create one of the", "Returns the new item's id; fields not given take their usual defaults."),
    ("search", "Search", "Matches the query against every text field and returns the best matches first."),
]
_TYPES: dict[str, dict[str, Any]] = {
    "attendees": {"type": "array", "items": {"type": "string"}},
    "recursive": {"type": "boolean"},
    "limit": {"type": "integer", "minimum": 1, "maximum": 100},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "units": {"type": "string", "enum": ["metric", "imperial"]},
    "priority": {"type": "string", "enum": ["low", "normal", "high"]},
    "tags": {"type": "array", "items": {"type": "string"}},
    "labels": {"type": "array", "items": {"type": "string"}},
}


def _schema(fields: list[str], required: list[str]) -> dict[str, Any]:
    props = {
        f: {**_TYPES.get(f, {"type": "string"}), "description": f"The {f.replace('_', ' ')} to use."}
        for f in fields
    }
    return {"type": "object", "properties": props, "required": required}


def _tools(areas: int) -> list[types.Tool]:
    tools = []
    for area, what, fields in _AREAS[:areas]:
        for action, verb, detail in _ACTIONS:
            if area == "translate" and action == "search":
                continue  # the fortieth is echo
            tools.append(
                types.Tool(
                    name=f"{area}_{action}",
                    description=f"{verb} {what}. {detail} Use it for anything about {area}.",
                    input_schema=_schema(fields, [fields[0]] if action != "list" else []),
                )
            )
    tools.append(
        types.Tool(
            name="echo",
            description="Say the text back, exactly as given: the simplest way to repeat a word.",
            input_schema=_schema(["text"], ["text"]),
        )
    )
    return tools


TOOLS = _tools(int(sys.argv[1]) if len(sys.argv) > 1 else len(_AREAS))


async def _list(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def _call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    if params.name not in {t.name for t in TOOLS}:
        text, error = f"no tool named {params.name!r}", True
    elif params.name == "echo":
        text, error = f"echo: {arguments.get('text', '')}", False
    else:
        text, error = f"{params.name}: {json.dumps(arguments, sort_keys=True)}", False
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)


server: Server[Any] = Server("blazar-test-many", on_list_tools=_list, on_call_tool=_call)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
