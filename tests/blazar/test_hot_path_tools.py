"""Emulated tool calls end to end, with the instant upstream as the engine.

The test model's chat template knows no tools, so the gateway describes them in
the prompt and reads the model's JSON answer back as calls. A forced call goes to
the engine as a JSON-schema constraint, which the instant upstream obeys as
llama.cpp's grammar would; an unforced one is constrained to a call or a text
answer, and the upstream's ``--reply`` says which the model chose. Each dialect
must hand back a proper tool call: the name, and arguments that decode to the
JSON the model produced. How the call is cut into chunks is left open: only what
the chunks add up to is checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.instant import MODEL, instant_config, serve_gateway, sse_events

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris"]}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
OTHER = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": "search", "parameters": OTHER}},
    {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}},
]
ANTHROPIC_TOOLS = [
    {"name": "search", "input_schema": OTHER},
    {"name": "get_weather", "input_schema": PARAMETERS},
]
CALL = {"tool": "get_weather", "arguments": {"city": "Paris", "days": 3}}
"""What the model says when it may answer in words or call (``auto``), in the emulation's
call format: the upstream takes the constraint's alternative that this reply fits."""
CONSTRAINED = {"city": "Paris", "days": 1}
"""What the constraint for get_weather yields from the instant upstream (enum, integer)."""


# -- collecting one answer's calls, per dialect ------------------------------------------


def _openai_calls(r: httpx.Response, *, stream: bool) -> tuple[list[tuple[str, Any]], str, str]:
    """(name, decoded arguments) of each call, the finish reason, and any text."""
    assert r.status_code == 200, r.text
    if not stream:
        [choice] = r.json()["choices"]
        message = choice["message"]
        assert message["role"] == "assistant"
        calls = message.get("tool_calls") or []
        assert all(c["type"] == "function" and c["id"] for c in calls)
        found = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
        return found, choice["finish_reason"], message.get("content") or ""
    chunks = [data for _, data in sse_events(r.content)]
    assert chunks[-1] == "[DONE]"
    merged: dict[int, dict[str, str]] = {}
    text, finish = "", None
    for chunk in chunks[:-1]:
        assert chunk["model"] == MODEL
        for choice in chunk["choices"]:
            delta = choice["delta"]
            text += delta.get("content") or ""
            for part in delta.get("tool_calls") or []:
                call = merged.setdefault(part["index"], {"id": "", "name": "", "arguments": ""})
                call["id"] += part.get("id") or ""
                call["name"] += (part.get("function") or {}).get("name") or ""
                call["arguments"] += (part.get("function") or {}).get("arguments") or ""
            finish = choice["finish_reason"] or finish
    assert all(c["id"] for c in merged.values())
    found = [(c["name"], json.loads(c["arguments"])) for _, c in sorted(merged.items())]
    return found, str(finish), text


def _anthropic_calls(r: httpx.Response, *, stream: bool) -> tuple[list[tuple[str, Any]], str, str]:
    assert r.status_code == 200, r.text
    if not stream:
        doc = r.json()
        uses = [b for b in doc["content"] if b["type"] == "tool_use"]
        assert all(b["id"] for b in uses)
        text = "".join(b["text"] for b in doc["content"] if b["type"] == "text")
        return [(b["name"], b["input"]) for b in uses], doc["stop_reason"], text
    events = [(name, data) for name, data in sse_events(r.content) if name != "ping"]
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    blocks: dict[int, dict[str, Any]] = {}
    open_block: int | None = None
    for name, data in events[1:-2]:
        if name == "content_block_start":
            assert open_block is None  # one block open at a time
            open_block = data["index"]
            blocks[data["index"]] = {**data["content_block"], "json": ""}
        elif name == "content_block_delta":
            assert data["index"] == open_block
            delta, block = data["delta"], blocks[data["index"]]
            if delta["type"] == "input_json_delta":
                block["json"] += delta["partial_json"]
            elif delta["type"] == "text_delta":
                block["text"] += delta["text"]
        else:
            assert name == "content_block_stop" and data["index"] == open_block
            open_block = None
    assert open_block is None and sorted(blocks) == list(range(len(blocks)))
    uses = [b for _, b in sorted(blocks.items()) if b["type"] == "tool_use"]
    assert all(b["id"] and b["input"] == {} for b in uses)
    text = "".join(b["text"] for b in blocks.values() if b["type"] == "text")
    stop = events[-2][1]["delta"]["stop_reason"]
    return [(b["name"], json.loads(b["json"])) for b in uses], stop, text


def _ollama_calls(r: httpx.Response, *, stream: bool) -> tuple[list[tuple[str, Any]], str, str]:
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
    assert len(lines) == 1 or stream
    assert lines[-1]["done"] is True and all(not line["done"] for line in lines[:-1])
    calls = [c["function"] for line in lines for c in line["message"].get("tool_calls") or []]
    assert all(isinstance(c["arguments"], dict) for c in calls)  # an object, not a JSON string
    text = "".join(line["message"]["content"] for line in lines)
    return [(c["name"], c["arguments"]) for c in calls], lines[-1]["done_reason"], text


async def _ask(client: httpx.AsyncClient, dialect: str, *, stream: bool, forced: bool) -> httpx.Response:
    """A request offering two tools; ``forced``: it must call get_weather (or a tool at all)."""
    if dialect == "openai":
        body: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "tools": OPENAI_TOOLS, "stream": stream}
        if forced:
            body["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
        return await client.post("/v1/chat/completions", json=body)
    if dialect == "anthropic":
        body = {"model": MODEL, "max_tokens": 200, "messages": MESSAGES, "tools": ANTHROPIC_TOOLS}
        if forced:
            body["tool_choice"] = {"type": "tool", "name": "get_weather"}
        return await client.post("/v1/messages", json=body | {"stream": stream})
    # Ollama has no tool_choice; tools with a `format` force a call.
    body = {"model": MODEL, "messages": MESSAGES, "tools": OPENAI_TOOLS[1:], "stream": stream}
    if forced:
        body["format"] = "json"
    return await client.post("/api/chat", json=body)


COLLECT = {"openai": _openai_calls, "anthropic": _anthropic_calls, "ollama": _ollama_calls}
FINISH = {"openai": "tool_calls", "anthropic": "tool_use", "ollama": "stop"}


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "ollama"])
async def test_a_forced_call_comes_back_as_a_tool_call(instant_home: Path, dialect: str) -> None:
    async with serve_gateway(instant_config()) as gw:
        for stream in (False, True):
            r = await _ask(gw.client, dialect, stream=stream, forced=True)
            calls, finish, text = COLLECT[dialect](r, stream=stream)
            assert calls == [("get_weather", CONSTRAINED)], (stream, r.text)
            assert finish == FINISH[dialect] and text == "", (stream, finish, text)


async def test_a_call_the_model_makes_unasked_is_a_tool_call_in_every_dialect(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--reply", json.dumps(CALL))) as gw:
        for dialect, collect in COLLECT.items():
            for stream in (False, True):
                r = await _ask(gw.client, dialect, stream=stream, forced=False)
                calls, finish, text = collect(r, stream=stream)
                assert calls == [("get_weather", CALL["arguments"])], (dialect, stream, r.text)
                assert finish == FINISH[dialect] and text == "", (dialect, stream, finish, text)

        # The same answer with no tools offered is just text, relayed as the model said it.
        body = {"model": MODEL, "messages": MESSAGES}
        r = await gw.client.post("/v1/chat/completions", json=body)
        message = r.json()["choices"][0]["message"]
        assert json.loads(message["content"]) == CALL and not message.get("tool_calls")
