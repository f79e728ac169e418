"""The MCP actors against real MCP servers (tests/mcp_servers/tools_server.py, on the SDK's
server side): over stdio, and over Streamable HTTP in a subprocess on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import mcp.types as mt
import msgspec
import pytest
import trio

from actors.config import McpServer, RuntimeConfig
from actors.mcp import McpServers, McpServerUnknown
from actors.mcp_results import cap_text, qualified_name, result_text, split_qualified
from actors.runtime_open import open_runtime
from tests.support import pid_alive

SERVER = Path(__file__).resolve().parent.parent / "mcp_servers" / "tools_server.py"


def stdio(name: str = "local", **settings: object) -> McpServer:
    return McpServer(name=name, command=[sys.executable, str(SERVER)], **settings)  # type: ignore[arg-type]


@asynccontextmanager
async def open_servers(*configs: McpServer, default: str = "none") -> AsyncIterator[McpServers]:
    servers = McpServers(list(configs), default)
    async with trio.open_nursery() as nursery:
        await nursery.start(servers.run)
        try:
            yield servers
        finally:
            nursery.cancel_scope.cancel()


# -- pure parts (no server) ------------------------------------------------------------


def test_names_split_back() -> None:
    assert qualified_name("fs", "read_file") == "mcp__fs__read_file"
    assert split_qualified("mcp__fs__read_file") == ("fs", "read_file")
    assert split_qualified("mcp__fs__a__b") == ("fs", "a__b")  # server names never hold "__"
    assert split_qualified("get_weather") is None
    assert split_qualified("mcp__fs") is None


def test_cap_cuts_at_a_character_and_says_how_much() -> None:
    assert cap_text("short", 1024) == ("short", 0)
    text, cut = cap_text("é" * 1000, 1025)  # 2000 bytes; 1025 would split a character
    assert text.startswith("é" * 512) and not text.startswith("é" * 513)
    assert cut == 2000 - 1024
    assert f"{cut} of 2000 bytes cut" in text


def test_result_text_joins_blocks_and_falls_back_to_structured() -> None:
    result = mt.CallToolResult(
        content=[mt.TextContent(type="text", text="a"), mt.TextContent(type="text", text="b")]
    )
    assert result_text(result) == "a\nb"
    assert result_text(mt.CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'


def test_config_is_strict() -> None:
    for bad in (
        {"name": "x"},  # neither command nor url
        {"name": "x", "command": ["a"], "url": "http://h/mcp"},
        {"name": "X", "command": ["a"]},
        {"name": "a__b", "command": ["a"]},
        {"name": "x", "url": "http://h/mcp", "env": {"A": "1"}},
        {"name": "x", "command": ["a"], "headers": {"A": "1"}},
        {"name": "x", "command": ["a"], "colour": "red"},
    ):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, McpServer)
    twice = [{"name": "a", "command": ["x"]}, {"name": "a", "url": "http://h/mcp"}]
    with pytest.raises(msgspec.ValidationError, match="unique"):
        msgspec.convert({"home": "/h", "run_dir": "/r", "cache_dir": "/c", "mcp": twice}, RuntimeConfig)
    with pytest.raises(msgspec.ValidationError, match="mcp_default"):
        msgspec.convert({"home": "/h", "run_dir": "/r", "cache_dir": "/c", "mcp_default": "b"}, RuntimeConfig)


async def test_select_resolves_names_default_all_none() -> None:
    servers = McpServers([stdio("a"), stdio("b")], ["b"])
    assert servers.select(None) == ["b"]
    assert servers.select("all") == ["a", "b"]
    assert servers.select("none") == []
    assert servers.select(["a", "a"]) == ["a"]
    with pytest.raises(McpServerUnknown, match="'c'"):
        servers.select("c")
    assert servers.max_rounds(["a"]) == 8


# -- a real server over stdio ----------------------------------------------------------


@pytest.mark.slow
async def test_stdio_lazy_start_tools_errors_truncation() -> None:
    async with open_servers(stdio(max_output_bytes=4096)) as servers:
        with trio.fail_after(60):
            (status,) = servers.servers()
            assert status.state == "stopped" and not status.started and status.tools is None
            assert status.transport == "stdio"

            (listing,) = await servers.tools(["local"])
            assert listing.error is None
            names = {t.qualified for t in listing.tools}
            assert {"mcp__local__echo", "mcp__local__fail", "mcp__local__big"} <= names
            echo = next(t for t in listing.tools if t.name == "echo")
            assert echo.input_schema["properties"]["text"]["type"] == "string"
            assert servers.servers()[0].started

            ok = await servers.call("mcp__local__echo", {"text": "hi"})
            assert ok.text == "echo: hi" and not ok.is_error and ok.why is None

            failed = await servers.call("mcp__local__fail", {"message": "nope"})
            assert failed.is_error and failed.why is None  # the tool's own error result

            big = await servers.call("mcp__local__big", {"size": 1 << 20})
            assert not big.is_error and big.truncated_bytes == (1 << 20) - 4096
            assert len(big.text.encode()) < 4096 + 200 and "bytes cut" in big.text

            unknown = await servers.call("mcp__local__nothing", {})
            assert unknown.is_error

            other = await servers.call("mcp__elsewhere__echo", {})
            assert other.is_error and other.why == "unknown_server"


@pytest.mark.slow
async def test_stdio_hang_is_a_timeout_result() -> None:
    async with open_servers(stdio(timeout_s=1.0)) as servers:
        with trio.fail_after(60):
            await servers.list_tools("local")  # started: the timeout bounds the call alone
            hung = await servers.call("mcp__local__hang", {})
            assert hung.is_error and hung.why == "timeout"
            assert "within 1 s" in hung.text
            after = await servers.call("mcp__local__echo", {"text": "still here"})
            assert after.text == "echo: still here"  # the session survives a cancelled call


@pytest.mark.slow
async def test_stdio_list_changed_refreshes_the_cache() -> None:
    async with open_servers(stdio()) as servers:
        with trio.fail_after(60):
            before = await servers.list_tools("local")
            assert "added" not in {t.name for t in before.tools}
            grown = await servers.call("mcp__local__grow", {})
            assert grown.text == "grown"
            after = await servers.list_tools("local")
            assert "mcp__local__added" in {t.qualified for t in after.tools}
            assert "mcp__local__added" in {t.qualified for t in servers.servers()[0].tools or []}
            used = await servers.call("mcp__local__added", {"n": 3})
            assert used.text == "added 3"


@pytest.mark.slow
async def test_missing_program_is_an_error_result_with_backoff() -> None:
    missing = McpServer(name="ghost", command=["/nonexistent/mcp-server-nowhere"])
    async with open_servers(missing) as servers:
        with trio.fail_after(30):
            first = await servers.call("mcp__ghost__anything", {})
            assert first.is_error and first.why == "unavailable"
            assert "could not start" in first.text and "not found" in first.text
            second = await servers.call("mcp__ghost__anything", {})
            assert second.is_error and "next try" in second.text  # backoff: no new spawn
            (status,) = servers.servers()
            assert status.state == "failed" and status.failures == 1 and status.starts == 1
            assert status.retry_after_s is not None
            (listing,) = await servers.tools(["ghost"])
            assert listing.tools == [] and listing.error


@pytest.mark.slow
async def test_killed_server_restarts_on_next_use() -> None:
    async with open_servers(stdio()) as servers:
        with trio.fail_after(60):
            first_pid = int((await servers.call("mcp__local__pid", {})).text)
            os.kill(first_pid, signal.SIGKILL)
            # The death is seen when the pipe closes; a call that races it is an error
            # result naming it, and the use after that starts a new server.
            for _ in range(2):
                again = await servers.call("mcp__local__pid", {})
                if not again.is_error:
                    break
                assert again.why in ("disconnected", "unavailable"), again
            assert not again.is_error, again
            assert int(again.text) != first_pid
            assert servers.servers()[0].starts == 2


@pytest.mark.slow
async def test_runtime_stops_its_servers(tmp_path: Path) -> None:
    config = RuntimeConfig.in_home(str(tmp_path), mcp=[stdio()], mcp_default="all")
    async with open_runtime(config) as rt:
        with trio.fail_after(60):
            assert rt.mcp.select(None) == ["local"]
            pid = int((await rt.mcp.call("mcp__local__pid", {})).text)
            assert pid_alive(pid)
    assert not pid_alive(pid)  # stdin closed, then TERM: gone once the runtime is


# -- a real server over Streamable HTTP ------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = 60.0
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "the HTTP MCP server exited"
                deadline -= 0.05
                assert deadline > 0, "the HTTP MCP server did not listen"
                time.sleep(0.05)  # another process's port: a synchronous fixture, outside trio
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
async def test_http_server_tools_errors_timeout(http_server: str) -> None:
    config = McpServer(name="web", url=http_server, headers={"Authorization": "Bearer t"}, timeout_s=1.0)
    async with open_servers(config) as servers:
        with trio.fail_after(60):
            (status,) = servers.servers()
            assert status.transport == "http" and not status.started
            listing = await servers.list_tools("web")
            assert "mcp__web__echo" in {t.qualified for t in listing.tools}
            assert (await servers.call("mcp__web__echo", {"text": "x"})).text == "echo: x"
            assert (await servers.call("mcp__web__fail", {})).is_error
            hung = await servers.call("mcp__web__hang", {})
            assert hung.is_error and hung.why == "timeout"
            big = await servers.call("mcp__web__big", {})
            assert big.truncated_bytes == (1 << 20) - 64 * 1024
            assert (await servers.call("mcp__web__echo", {"text": "y"})).text == "echo: y"
