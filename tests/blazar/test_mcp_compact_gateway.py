"""Compact MCP catalogs through the real gateway, with the instant upstream as the engine and
the real forty-tool server (tests/mcp_servers/many_server.py over stdio).

The upstream's ``--reply`` is an emulated call to one of the meta-tools, so while tools are
offered the "model" makes it again each round: the counts are exact, and what the gateway
does with each meta-call shows in the loop's header, the Responses API's ``mcp_call`` items
and ``blazar why``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from blazar.config import Config
from tests.instant import MODEL, Gateway, instant_config, serve_gateway, sse_events

pytestmark = pytest.mark.slow

SERVER = Path(__file__).resolve().parent.parent / "mcp_servers" / "many_server.py"
WEATHER = {"tool": "mcp_call_tool", "arguments": {"name": "weather_get", "arguments": {"city": "Paris"}}}
FIND = {"tool": "mcp_find_tools", "arguments": {"query": "weather"}}
ASK = "What is the weather in Paris?"
COMPACT = {"x-blazar-mcp-catalog": "compact"}


def _config(reply: dict[str, Any], top: dict[str, Any], **mcp: Any) -> Config:
    server = {"name": "many", "command": [sys.executable, str(SERVER)], "timeout_s": 20, "max_rounds": 2}
    doc = {"mcp_default": "all", "mcp": [{**server, **mcp}], **top}
    base = instant_config("--reply", json.dumps(reply))
    return msgspec.convert({**msgspec.to_builtins(base), **doc}, Config)


@asynccontextmanager
async def gateway(
    reply: dict[str, Any], top: dict[str, Any] | None = None, **mcp: Any
) -> AsyncIterator[Gateway]:
    async with serve_gateway(_config(reply, top or {}, **mcp)) as gw:
        with trio.fail_after(90):
            yield gw


async def test_a_call_tool_meta_call_runs_the_real_tool(instant_home: Path) -> None:
    async with gateway(WEATHER, catalog="compact") as gw:
        body = {"model": MODEL, "input": ASK, "stream": True}
        r = await gw.client.post("/v1/responses", json=body, timeout=60)
        assert r.status_code == 200, r.text
        done = sse_events(r.content)[-1][1]["response"]
        calls = [i for i in done["output"] if i["type"] == "mcp_call"]
        # shown as the tool that ran, never as the meta-tool the model wrote
        assert [(c["server_label"], c["name"], c["status"]) for c in calls] == [
            ("many", "weather_get", "completed")
        ] * 2
        assert calls[0]["output"] == 'weather_get: {"city": "Paris"}'
        assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
        whole = await gw.client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": ASK}]}
        )
        assert whole.headers["x-blazar-mcp"] == "rounds=2, calls=2"
        # the last round, offered no tools, answers with the reply as its words
        assert json.loads(whole.json()["choices"][0]["message"]["content"]) == WEATHER
        # the same reply under the full catalog names a tool that is not offered: no round runs
        full = await gw.client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": ASK}]},
            headers={"x-blazar-mcp-catalog": "full"},
        )
        assert full.headers["x-blazar-mcp"] == "rounds=0, calls=0"


async def test_lookups_are_answered_by_the_gateway_and_counted(instant_home: Path) -> None:
    async with gateway(FIND) as gw:  # full by default: the request asks for compact
        body = {"model": MODEL, "messages": [{"role": "user", "content": ASK}], "stream": True}
        r = await gw.client.post("/v1/chat/completions", json=body, headers=COMPACT)
        assert r.status_code == 200, r.text
        assert r.text.count(": mcp calling") == 0  # a lookup is the gateway's own, not a tool run
        assert ": x-blazar-mcp rounds=2, calls=0, lookups=2" in r.text
        whole = await gw.client.post(
            "/v1/chat/completions",
            json={**body, "stream": False},
            headers=COMPACT,
        )
        assert whole.headers["x-blazar-mcp"] == "rounds=2, calls=0, lookups=2"
        bad = await gw.client.post(
            "/v1/chat/completions", json={**body, "stream": False}, headers={"x-blazar-mcp-catalog": "tiny"}
        )
        assert bad.status_code == 400 and bad.json()["error"]["blazar_code"] == "BAD_REQUEST"


async def test_a_call_through_the_catalog_keeps_the_approval_rules(instant_home: Path) -> None:
    async with gateway(WEATHER, {"mcp_catalog": "compact"}, approve=["weather_*"]) as gw:
        body = {"model": MODEL, "input": ASK}
        r = await gw.client.post("/v1/responses", json=body, timeout=60)
        calls = [i for i in r.json()["output"] if i["type"] == "mcp_call"]
        assert [(c["name"], c["status"]) for c in calls] == [("weather_get", "failed")] * 2
        assert "needs approval" in calls[0]["error"]["message"]
        ok = await gw.client.post(
            "/v1/responses", json=body, headers={"x-blazar-mcp-approve": "mcp__many__weather_get"}, timeout=60
        )
        outputs = [i.get("output") for i in ok.json()["output"] if i["type"] == "mcp_call"]
        assert outputs == ['weather_get: {"city": "Paris"}'] * 2


async def test_a_client_tool_of_a_meta_tool_name_is_refused(instant_home: Path) -> None:
    mine = {"type": "function", "function": {"name": "mcp_call_tool", "parameters": {"type": "object"}}}
    async with gateway(WEATHER, catalog="compact") as gw:
        body = {"model": MODEL, "messages": [{"role": "user", "content": ASK}], "tools": [mine]}
        r = await gw.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and "mcp_call_tool" in r.json()["error"]["message"]
        r = await gw.client.post("/v1/chat/completions", json=body, headers={"x-blazar-mcp-catalog": "full"})
        assert r.status_code == 200


async def test_a_background_response_keeps_the_requests_catalog(instant_home: Path) -> None:
    async with gateway(WEATHER) as gw:  # full by default: only the request's header makes it compact
        body = {"model": MODEL, "input": ASK, "background": True}
        r = await gw.client.post("/v1/responses", json=body, headers=COMPACT)
        assert r.status_code == 200, r.text
        response_id = r.json()["id"]
        while True:  # polled as a client would
            doc = (await gw.client.get(f"/v1/responses/{response_id}")).json()
            if doc["status"] not in ("queued", "in_progress"):
                break
            await trio.sleep(0.05)
        assert doc["status"] == "completed", doc
        assert [(i["type"], i.get("name")) for i in doc["output"]] == [
            ("mcp_call", "weather_get"),
            ("mcp_call", "weather_get"),
            ("message", None),
        ]
