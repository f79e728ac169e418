"""``X-Blazar-Warnings``: each way a request was served with less than it asked, by a stable
name, on the response that did so; none on a request served as asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.instant import MODEL, instant_config, serve_gateway

MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


async def _warnings(gw: Any, path: str, body: dict[str, Any]) -> set[str]:
    r = await gw.client.post(path, json=body)
    assert r.status_code == 200, r.text
    return set(filter(None, r.headers.get("x-blazar-warnings", "").split(",")))


async def test_each_degrade_is_named(instant_home: Path) -> None:
    async with serve_gateway(instant_config()) as gw:
        plain = {"model": MODEL, "messages": MSG, "max_tokens": 4}
        assert await _warnings(gw, "/v1/chat/completions", plain) == set()
        # the test model's template takes no tools: they are emulated
        tools = {**plain, "tools": [TOOL]}
        assert "template_no_tools" in await _warnings(gw, "/v1/chat/completions", tools)
        # a parameter with no effect here (relayed as bytes: the relay names it too)
        assert await _warnings(gw, "/v1/chat/completions", {**plain, "service_tier": "flex"}) == {
            "params_ignored"
        }
        # a context beyond what the model was trained for is clamped
        ollama = {"model": MODEL, "messages": MSG, "stream": False, "options": {"num_ctx": 1_000_000}}
        assert await _warnings(gw, "/api/chat", ollama) == {"ctx_clamped"}
