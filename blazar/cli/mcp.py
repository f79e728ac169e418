"""``blazar mcp``: the MCP servers of config.toml, their tools, and a tool call by hand.

With a daemon running each command asks it (``GET /api/mcp``, ``POST /api/mcp/NAME/tools``,
``POST /api/mcp/NAME/call``), so a server it has started is reused; without one, ``tools``
and ``call`` start the server here for the one command and stop it after.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import cyclopts
from cyclopts import Parameter
from rich.table import Table

from blazar.cli import app
from blazar.cli._common import Json, load_setup, out, print_json
from blazar.daemon.client import CliError, find_daemon

__all__ = ["mcp"]

mcp = cyclopts.App(name="mcp", help="MCP servers (config.toml [[mcp]]): list them, their tools, call one.")
app.command(mcp)

_EXAMPLE = '{"path": "a.txt"}'


def _here(servers: list[Any], default: Any, name: str | None, work: Any) -> Any:
    """Run ``work(McpServers)`` on a runtime-less set of the configured servers, here."""
    import msgspec
    import trio

    from actors.mcp import McpServers

    if name is not None and name not in {s.name for s in servers}:
        known = ", ".join(s.name for s in servers) or "none is configured"
        raise CliError(
            f"no MCP server named '{name}' (configured: {known}) — add an [[mcp]] entry to config.toml"
        )

    async def main() -> Any:
        group = McpServers(servers, default)
        async with trio.open_nursery() as nursery:
            await nursery.start(group.run)
            try:
                return msgspec.to_builtins(await work(group))
            finally:
                nursery.cancel_scope.cancel()

    return trio.run(main)


@mcp.command(name="list")
def list_(*, json_: Json = False) -> None:
    """The configured servers: transport, what runs them, whether they are started, their tools."""
    import msgspec

    from actors.mcp import McpServers

    paths, config = load_setup()
    daemon = find_daemon(paths)
    if daemon is not None:
        doc = daemon.get("/api/mcp")
    else:
        group = McpServers(config.mcp, config.mcp_default)
        doc = {"servers": msgspec.to_builtins(group.servers()), "default": config.mcp_default}
    if json_:
        print_json(doc)
        return
    if not doc["servers"]:
        out.print("no MCP servers are configured: add [[mcp]] entries to config.toml (docs/mcp.md)")
        return
    table = Table("NAME", "TRANSPORT", "TARGET", "STATE", "PROTOCOL", "TOOLS", box=None)
    for s in doc["servers"]:
        tools = "-" if s["tools"] is None else str(len(s["tools"]))
        protocol = s.get("protocol_version") or "-"
        table.add_row(s["name"], s["transport"], s["target"], s["state"], protocol, tools)
    out.print(table)
    if daemon is None:
        out.print("(no daemon runs: nothing is started)")


@mcp.command
def tools(name: str, *, json_: Json = False) -> None:
    """NAME's tools with the names the model sees (starts the server if need be)."""
    paths, config = load_setup()
    daemon = find_daemon(paths)
    if daemon is not None:
        doc = daemon.post(f"/api/mcp/{name}/tools")
    else:
        doc = _here(config.mcp, config.mcp_default, name, lambda group: group.list_tools(name))
    if json_:
        print_json(doc)
        return
    if doc.get("error"):
        raise CliError(doc["error"])
    table = Table("TOOL", "OFFERED AS", "DESCRIPTION", box=None)
    for t in doc["tools"]:
        table.add_row(t["name"], t["qualified"], (t.get("description") or "").split("\n")[0])
    out.print(table)


@mcp.command
def call(
    name: str,
    tool: str,
    arguments: Annotated[str, Parameter(help="The tool's arguments as a JSON object.")] = "{}",
    *,
    json_: Json = False,
) -> None:
    """Call TOOL on server NAME with ARGUMENTS (JSON) and print its result text."""
    try:
        args = json.loads(arguments)
    except ValueError as exc:
        raise CliError(f"ARGUMENTS is not JSON ({exc}): give an object, e.g. '{_EXAMPLE}'") from None
    if not isinstance(args, dict):
        raise CliError(f"ARGUMENTS must be a JSON object, e.g. '{_EXAMPLE}'")
    paths, config = load_setup()
    daemon = find_daemon(paths)
    if daemon is not None:
        doc = daemon.post(f"/api/mcp/{name}/call", {"tool": tool, "arguments": args})
    else:
        doc = _here(config.mcp, config.mcp_default, name, lambda group: group.call_tool(name, tool, args))
    if json_:
        print_json(doc)
        return
    out.print(doc["text"], highlight=False, markup=False)
    if doc["is_error"]:
        raise SystemExit(1)
