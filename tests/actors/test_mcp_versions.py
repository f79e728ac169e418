"""MCP protocol revisions: Blazar's client finds the newest one a server speaks, against real
servers (tests/mcp_servers/versioned_server.py: the SDK's server speaking exactly one revision
over Streamable HTTP; tools_server.py over stdio, which speaks them all)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from actors.config import McpServer
from actors.mcp import McpServers
from actors.mcp_protocol import (
    PROTOCOL_VERSIONS,
    after_discover,
    after_discover_error,
    after_handshake,
    unsupported_text,
)
from tests.mcp_servers.launch import versioned_servers

TOOLS = Path(__file__).resolve().parent.parent / "mcp_servers" / "tools_server.py"
SPOKEN = ["2026-07-28", "2025-11-25", "2025-06-18"]


@asynccontextmanager
async def open_servers(*configs: McpServer) -> AsyncIterator[McpServers]:
    servers = McpServers(list(configs))
    async with trio.open_nursery() as nursery:
        await nursery.start(servers.run)
        try:
            yield servers
        finally:
            nursery.cancel_scope.cancel()


# -- the verdicts (no server) -------------------------------------------------------------


def test_versions_newest_first() -> None:
    assert list(PROTOCOL_VERSIONS) == SPOKEN


def test_discover_errors_fall_back_unless_no_version_is_shared() -> None:
    assert after_discover_error(-32601, None) == "initialize"  # method not found: a 2025 server
    assert after_discover_error(-32600, None) == "initialize"  # a 2025 server's 400 for the header
    assert after_discover_error(-32022, None) == "initialize"  # no list: not evidence
    assert after_discover_error(-32022, ["2025-06-18"]) == "initialize"
    assert after_discover_error(-32022, ["2027-01-01"]) == "refuse"
    assert after_discover_error(-32022, ["2025-03-26"]) == "refuse"


def test_discover_and_handshake_answers() -> None:
    assert after_discover(["2025-11-25", "2026-07-28"]) == "adopt"
    assert after_discover(["2025-11-25"]) == "initialize"  # a discover that lists no 2026 revision
    assert after_handshake("2025-11-25") == after_handshake("2025-06-18") == "adopt"
    assert after_handshake("2025-03-26") == after_handshake("2024-11-05") == "refuse"


def test_the_refusal_names_what_was_offered_and_tried() -> None:
    text = unsupported_text(["2025-03-26"], ["server/discover at 2026-07-28: no", "initialize: 2025-03-26"])
    assert "speaks MCP protocol 2025-03-26" in text
    assert "2026-07-28, 2025-11-25, 2025-06-18" in text
    assert "server/discover at 2026-07-28: no; initialize: 2025-03-26" in text


# -- real servers -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    with versioned_servers(*SPOKEN, "2025-03-26") as started:
        yield started


def _name(version: str) -> str:
    return "v" + version.replace("-", "")


@pytest.mark.slow
@pytest.mark.parametrize("version", SPOKEN)
async def test_each_revision_lists_and_calls_tools(urls: dict[str, str], version: str) -> None:
    name = _name(version)
    async with open_servers(McpServer(name=name, url=urls[version], timeout_s=5.0)) as servers:
        with trio.fail_after(60):
            listing = await servers.list_tools(name)
            assert listing.error is None and listing.blazar_code is None
            assert f"mcp__{name}__echo" in {t.qualified for t in listing.tools}
            answer = await servers.call_tool(name, "echo", {"text": version})
            assert (answer.text, answer.is_error) == (f"echo: {version}", False)
            failed = await servers.call_tool(name, "fail", {"message": "no"})
            assert failed.is_error and failed.why is None  # the tool's own error, at every revision
            (status,) = servers.servers()
            assert status.state == "ready" and status.protocol_version == version
            assert status.server_info is not None and status.server_info.startswith("blazar-test-tools")


@pytest.mark.slow
async def test_a_server_of_no_spoken_revision_is_refused_naming_the_versions(urls: dict[str, str]) -> None:
    async with open_servers(McpServer(name="old", url=urls["2025-03-26"], timeout_s=5.0)) as servers:
        with trio.fail_after(60):
            listing = await servers.list_tools("old")
            assert listing.tools == [] and listing.blazar_code == "MCP_PROTOCOL_UNSUPPORTED"
            error = listing.error or ""
            assert "speaks MCP protocol 2025-03-26" in error
            assert "2026-07-28, 2025-11-25, 2025-06-18" in error
            assert "server/discover at 2026-07-28" in error and "initialize offering 2025-11-25" in error
            (status,) = servers.servers()
            assert status.state == "failed" and status.protocol_version is None
            assert status.last_error_code == "MCP_PROTOCOL_UNSUPPORTED"
            called = await servers.call_tool("old", "echo", {"text": "x"})
            assert called.is_error and called.why == "unavailable" and "2025-03-26" in called.text


@pytest.mark.slow
async def test_stdio_sdk_server_speaks_the_stateless_revision_with_list_changed() -> None:
    config = McpServer(name="local", command=[sys.executable, str(TOOLS)], timeout_s=10.0)
    async with open_servers(config) as servers:
        with trio.fail_after(60):
            before = await servers.list_tools("local")
            assert "mcp__local__added" not in {t.qualified for t in before.tools}
            (status,) = servers.servers()
            assert status.protocol_version == "2026-07-28"
            assert (await servers.call_tool("local", "grow", {})).text == "grown"
            after = await servers.list_tools("local")  # the subscriptions/listen stream said so
            assert "mcp__local__added" in {t.qualified for t in after.tools}
