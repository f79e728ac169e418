"""Compact MCP catalogs through the real daemon, with the test model and the real many-tool
server (tests/mcp_servers/many_server.py over stdio, here with seventeen of its forty tools:
reading forty schemas takes the CPU engine a minute, and ``bench mcp_catalog`` measures them).

What the engine is sent shows in the usage it reports: with the compact catalog a round's
prompt is a few hundred tokens instead of the thousands the full catalog costs. The
task the tiny model does with the full catalog (repeat a word with the echo tool, which a
forced ``tool_choice`` names) still runs with the compact one: the tool the client forces is
offered beside the meta-tools. The 135M model cannot find a tool by itself (asked to, it
searches for "banana" and calls a tool named "banana"), so what the gateway does with its
meta-calls is checked on its own answers, not on the task's success.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

SERVER = Path(__file__).resolve().parent.parent / "mcp_servers" / "many_server.py"
CONFIG = f"""
default_ctx = 8192
slots = 1

[[mcp]]
name = "many"
command = [{json.dumps(sys.executable)}, {json.dumps(str(SERVER))}, "4"]
timeout_s = 10
max_rounds = 1
"""
ASK = [{"role": "user", "content": "Repeat the word banana with the echo tool."}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    d = start_daemon(make_home(tmp_path_factory.mktemp("compact") / "home", model_path, config=CONFIG))
    try:
        yield d
    finally:
        d.stop()


def _chat(daemon: DaemonProc, catalog: str, forced: str) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": ASK,
        "tool_choice": {"type": "function", "function": {"name": forced}},
        "max_tokens": 24,
        "temperature": 0,
    }
    headers = {"x-blazar-mcp": "many", "x-blazar-mcp-catalog": catalog}
    r = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, headers=headers, timeout=600)
    assert r.status_code == 200, r.text
    return r


def _tools_run(daemon: DaemonProc, r: httpx.Response) -> list[tuple[str, bool]]:
    trace = r.headers["x-blazar-trace-id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        story = httpx.get(f"{daemon.url}/api/why/{trace}", timeout=30)
        if story.status_code == 200:
            doc: dict[str, Any] = story.json()
            return [(t["tool"], t["ok"]) for t in doc["tools"]]
        time.sleep(0.1)
    raise AssertionError(f"no story for {trace}")


def test_compact_sends_a_fraction_of_the_prompt_and_the_task_still_runs(daemon: DaemonProc) -> None:
    full = _chat(daemon, "full", "mcp__many__echo")
    compact = _chat(daemon, "compact", "mcp__many__echo")
    for r in (full, compact):  # one tool round, then the answer: two engine calls each
        assert r.headers["x-blazar-mcp"] == "rounds=1, calls=1"
        assert _tools_run(daemon, r) == [("mcp__many__echo", True)]
        assert not r.json()["choices"][0]["message"].get("tool_calls")
    full_tokens = full.json()["usage"]["prompt_tokens"]
    compact_tokens = compact.json()["usage"]["prompt_tokens"]
    # Seventeen schemas here, to keep the test short (bench mcp_catalog measures all forty);
    # the last round, offered no tools, has none.
    assert full_tokens > 2000
    assert compact_tokens * 5 < full_tokens, (compact_tokens, full_tokens)


def test_the_models_own_meta_calls_are_answered_by_the_gateway(daemon: DaemonProc) -> None:
    found = _chat(daemon, "compact", "mcp_find_tools")
    assert found.headers["x-blazar-mcp"] == "rounds=1, calls=0, lookups=1"
    assert _tools_run(daemon, found) == []  # a lookup runs no tool
    called = _chat(daemon, "compact", "mcp_call_tool")
    rounds = called.headers["x-blazar-mcp"]
    ran = _tools_run(daemon, called)
    # the tiny model names a tool that may not exist: then the gateway answers with an error
    # and suggestions (a lookup); a name it resolves runs that tool
    assert rounds in ("rounds=1, calls=0, lookups=1", "rounds=1, calls=1"), rounds
    assert (rounds == "rounds=1, calls=1") == bool(ran)
    assert all(name.startswith("mcp__many__") for name, _ in ran)
    for r in (found, called):  # two engine calls, and no schema of the forty in either
        assert r.json()["usage"]["prompt_tokens"] < 1600
