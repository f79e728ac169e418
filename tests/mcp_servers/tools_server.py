"""A real MCP server for the tests, on the SDK's server side.

Run as ``python tests/mcp_servers/tools_server.py`` (stdio) or with ``--http PORT``
(Streamable HTTP on 127.0.0.1:PORT/mcp). Its tools cover what a client must survive:
one that works, one that raises, one that hangs, one that returns a megabyte, one that
adds a tool at run time (and says so with ``notifications/tools/list_changed``), and
one that tells its own pid (for ``kill -9``).
"""

from __future__ import annotations

import argparse
import os

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("blazar-test-tools")


@server.tool()
def echo(text: str) -> str:
    """Say ``text`` back."""
    return f"echo: {text}"


@server.tool()
def fail(message: str = "boom") -> str:
    """Always raises."""
    raise ValueError(message)


@server.tool()
async def hang(marker: str = "") -> str:
    """Never answers; writes ``running`` to the file ``marker`` (if given) once it runs, and
    ``cancelled`` when it is cancelled."""
    if marker:
        await anyio.Path(marker).write_text("running")
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        if marker:
            with anyio.CancelScope(shield=True):
                await anyio.Path(marker).write_text("cancelled")
        raise
    return "unreachable"


@server.tool()
def big(size: int = 1 << 20) -> str:
    """``size`` characters of text (a megabyte by default)."""
    return "x" * size


@server.tool()
def pid() -> str:
    """The server's own process id."""
    return str(os.getpid())


def added(n: int = 1) -> str:
    """A tool that exists only once ``grow`` has run."""
    return f"added {n}"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the ``added`` tool and tell the client that the tool list changed: on the
    session (2025 revisions), and on ``subscriptions/listen`` streams (2026-07-28)."""
    if "added" not in {t.name for t in await server.list_tools()}:
        server.add_tool(added)
    await ctx.session.send_tool_list_changed()
    await ctx.notify_tools_changed()
    return "grown"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve Streamable HTTP on this port")
    args = parser.parse_args()
    if args.http is None:
        server.run("stdio")
    else:
        server.settings.log_level = "WARNING"
        anyio.run(lambda: server.run_streamable_http_async(host="127.0.0.1", port=args.http))


if __name__ == "__main__":
    main()
