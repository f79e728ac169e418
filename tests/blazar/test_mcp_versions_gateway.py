"""MCP protocol revisions through the real gateway: one real server per revision
(tests/mcp_servers/versioned_server.py over Streamable HTTP), their tools listed and called
with the admin routes and by the tool loop (the instant upstream as the engine), and
``GET /api/mcp`` naming the revision each server speaks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from blazar.config import Config
from tests.instant import MODEL, instant_config, serve_gateway
from tests.mcp_servers.launch import versioned_servers

pytestmark = pytest.mark.slow

SPOKEN = ["2026-07-28", "2025-11-25", "2025-06-18"]
OLD = "2025-03-26"


def _name(version: str) -> str:
    return "v" + version.replace("-", "")


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    with versioned_servers(*SPOKEN, OLD) as started:
        yield started


def _config(urls: dict[str, str], reply: dict[str, Any]) -> Config:
    servers = [{"name": _name(v), "url": u, "timeout_s": 10, "max_rounds": 2} for v, u in urls.items()]
    base = instant_config("--reply", json.dumps(reply))
    return msgspec.convert({**msgspec.to_builtins(base), "mcp": servers}, Config)


async def test_each_revision_through_the_gateway(instant_home: Path, urls: dict[str, str]) -> None:
    modern = _name("2026-07-28")
    echo = {"tool": f"mcp__{modern}__echo", "arguments": {"text": "hi"}}
    async with serve_gateway(_config(urls, echo)) as gw:
        with trio.fail_after(120):
            listed = (await gw.client.get("/api/mcp")).json()["servers"]
            assert {s["name"]: s["protocol_version"] for s in listed} == {_name(v): None for v in urls}

            for version in SPOKEN:
                name = _name(version)
                r = await gw.client.post(f"/api/mcp/{name}/tools", timeout=60)
                assert r.status_code == 200 and r.json()["error"] is None, r.text
                assert f"mcp__{name}__echo" in {t["qualified"] for t in r.json()["tools"]}
                call = {"tool": "echo", "arguments": {"text": version}}
                r = await gw.client.post(f"/api/mcp/{name}/call", json=call, timeout=60)
                assert r.status_code == 200 and r.json()["text"] == f"echo: {version}", r.text

            r = await gw.client.post(f"/api/mcp/{_name(OLD)}/tools", timeout=60)
            assert r.status_code == 200 and r.json()["tools"] == []
            assert r.json()["blazar_code"] == "MCP_PROTOCOL_UNSUPPORTED"
            assert f"speaks MCP protocol {OLD}" in r.json()["error"]
            assert "2026-07-28, 2025-11-25, 2025-06-18" in r.json()["error"]

            listed = {s["name"]: s for s in (await gw.client.get("/api/mcp")).json()["servers"]}
            for version in SPOKEN:
                assert listed[_name(version)]["protocol_version"] == version
                assert listed[_name(version)]["state"] == "ready"
            old = listed[_name(OLD)]
            assert old["state"] == "failed" and old["protocol_version"] is None
            assert old["last_error_code"] == "MCP_PROTOCOL_UNSUPPORTED"
            assert "/tmp" not in old["last_error"] and "Traceback" not in old["last_error"]

            # The tool loop on the stateless server: the model's two rounds of calls run there.
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "mcp": modern}
            r = await gw.client.post("/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            assert r.headers["x-blazar-mcp"] == "rounds=2, calls=2"
            assert json.loads(r.json()["choices"][0]["message"]["content"]) == echo
            body = {"model": MODEL, "input": "hi", "mcp": modern}
            r = await gw.client.post("/v1/responses", json=body, timeout=60)
            assert r.status_code == 200, r.text
            calls = [i for i in r.json()["output"] if i["type"] == "mcp_call"]
            assert [(i["server_label"], i.get("output")) for i in calls] == [(modern, "echo: hi")] * 2
