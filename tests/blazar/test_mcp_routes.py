"""``GET /api/mcp``, ``POST /api/mcp/NAME/tools|call`` and ``blazar mcp``, with a real MCP
server (tests/mcp_servers/tools_server.py over stdio) behind the real gateway and daemon."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from blazar.config import Config
from tests.instant import serve_gateway
from tests.support import home_env, pid_alive, start_daemon

pytestmark = pytest.mark.slow

SERVER = Path(__file__).resolve().parent.parent / "mcp_servers" / "tools_server.py"
CONFIG = f"""
mcp_default = "all"

[[mcp]]
name = "local"
command = [{json.dumps(sys.executable)}, {json.dumps(str(SERVER))}]
timeout_s = 20
"""


async def test_routes_list_without_starting_then_tools_and_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    config = msgspec.toml.decode(CONFIG.encode(), type=Config)
    async with serve_gateway(config) as gw:
        listed = (await gw.client.get("/api/mcp")).json()
        assert listed["default"] == "all"
        (server,) = listed["servers"]
        assert server["name"] == "local" and server["transport"] == "stdio"
        assert server["state"] == "stopped" and server["started"] is False and server["tools"] is None

        r = await gw.client.post("/api/mcp/local/tools", timeout=60)
        assert r.status_code == 200, r.text
        assert "mcp__local__echo" in {t["qualified"] for t in r.json()["tools"]}

        r = await gw.client.post("/api/mcp/local/call", json={"tool": "echo", "arguments": {"text": "hi"}})
        assert r.status_code == 200 and r.json()["text"] == "echo: hi" and r.json()["is_error"] is False

        r = await gw.client.post("/api/mcp/local/call", json={"tool": "fail", "arguments": {}})
        assert r.status_code == 200 and r.json()["is_error"] is True  # an answer, not a 5xx

        (server,) = (await gw.client.get("/api/mcp")).json()["servers"]
        assert server["started"] is True and len(server["tools"]) >= 5

        r = await gw.client.post("/api/mcp/nowhere/tools")  # /api/ errors: Ollama's shape
        assert r.status_code == 404 and r.json()["error"]["blazar_code"] == "MCP_SERVER_NOT_FOUND"
        r = await gw.client.post("/api/mcp/local/call", json={"arguments": {}})
        assert r.status_code == 400 and r.json()["error"]["blazar_code"] == "BAD_REQUEST"


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blazar", "mcp", *args],
        env=home_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_without_a_daemon_runs_the_server_here(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(CONFIG)
    listed = _cli(tmp_path, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["servers"][0]["started"] is False
    tools = _cli(tmp_path, "tools", "local")
    assert tools.returncode == 0, tools.stderr
    assert "mcp__local__echo" in tools.stdout
    called = _cli(tmp_path, "call", "local", "echo", '{"text": "here"}')
    assert called.returncode == 0, called.stderr
    assert called.stdout.strip() == "echo: here"
    failed = _cli(tmp_path, "call", "local", "fail", "{}")
    assert failed.returncode == 1
    bad = _cli(tmp_path, "call", "local", "echo", "[1]")
    assert bad.returncode == 1 and "JSON object" in bad.stderr
    unknown = _cli(tmp_path, "tools", "nowhere")
    assert unknown.returncode == 1 and "no MCP server named 'nowhere'" in unknown.stderr


def test_cli_asks_the_daemon_and_the_daemon_stops_its_server(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(CONFIG)
    daemon = start_daemon(tmp_path)
    try:
        assert "stopped" in _cli(tmp_path, "list").stdout
        called = _cli(tmp_path, "call", "local", "pid")
        assert called.returncode == 0, called.stderr
        pid = int(called.stdout.strip())
        again = _cli(tmp_path, "call", "local", "pid")
        assert int(again.stdout.strip()) == pid  # the daemon's server, reused
        listed = json.loads(_cli(tmp_path, "list", "--json").stdout)
        assert listed["servers"][0]["state"] == "ready"
        assert listed["servers"][0]["protocol_version"] == "2026-07-28"  # the SDK's stdio server
        assert "2026-07-28" in _cli(tmp_path, "list").stdout  # the PROTOCOL column
        unknown = _cli(tmp_path, "call", "local", "nothing-here")
        assert unknown.returncode == 1
    finally:
        daemon.stop()
    assert not pid_alive(pid)
