"""``/api/chat`` and ``/v1/messages`` end to end, with the instant upstream as the engine.

These dialects are translated: the engine's OpenAI answer becomes Ollama's NDJSON
or Anthropic's message and event stream, with their stop reasons and usage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.instant import MODEL, instant_config, serve_gateway, sse_events

REPLY = "Grüße aus Zürich — 東京, ✓ done."
MESSAGES = [{"role": "user", "content": "Say hello."}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _ndjson(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


async def _ollama(client: httpx.AsyncClient, **extra: Any) -> httpx.Response:
    r = await client.post("/api/chat", json={"model": MODEL, "messages": MESSAGES, **extra})
    assert r.status_code == 200, r.text
    return r


def _check_ollama_final(doc: dict[str, Any]) -> None:
    assert doc["done"] is True and doc["model"] == MODEL
    for key in ("total_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count"):
        assert isinstance(doc[key], int) and doc[key] >= 0, key
    assert doc["prompt_eval_count"] > 0 and doc["eval_count"] > 0


async def test_ollama_chat_streamed_and_not(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--reply", REPLY)) as gw:
        doc = (await _ollama(gw.client, stream=False)).json()
        assert doc["message"] == {"role": "assistant", "content": REPLY}
        assert doc["done_reason"] == "stop"
        _check_ollama_final(doc)

        r = await _ollama(gw.client)  # Ollama streams unless told not to
        assert r.headers["content-type"].startswith("application/x-ndjson")
        *parts, last = _ndjson(r)
        assert parts and all(p["done"] is False and p["message"]["role"] == "assistant" for p in parts)
        assert "".join(p["message"]["content"] for p in [*parts, last]) == REPLY
        assert last["done_reason"] == "stop" and last["eval_count"] == doc["eval_count"]
        _check_ollama_final(last)
        assert last["total_duration"] >= last["eval_duration"]

        # num_predict cuts the answer: done_reason says so, and eval_count is the cut.
        for stream in (False, True):
            lines = _ndjson(await _ollama(gw.client, stream=stream, options={"num_predict": 3}))
            text = "".join(line["message"]["content"] for line in lines)
            assert REPLY.startswith(text) and 0 < len(text) < len(REPLY)
            assert lines[-1]["done_reason"] == "length" and lines[-1]["eval_count"] == 3

        # Tools offered, but the model answers in prose: that stays text.
        tool = {"type": "function", "function": WEATHER}
        doc = (await _ollama(gw.client, stream=False, tools=[tool])).json()
        assert doc["message"]["content"] == REPLY and not doc["message"].get("tool_calls")


async def _messages(client: httpx.AsyncClient, **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 100, "messages": MESSAGES, **extra}
    r = await client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    return r


def _event_stream(r: httpx.Response) -> tuple[list[str], list[dict[str, Any]]]:
    """The event names (pings left out, which may come anywhere) and their data."""
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [(name, data) for name, data in sse_events(r.content) if name != "ping"]
    for name, data in events:
        assert data["type"] == name
    return [name for name, _ in events if name], [data for _, data in events]


def _streamed_text(r: httpx.Response, stop_reason: str) -> tuple[str, dict[str, Any]]:
    """The text of a one-block streamed message, checking the event order; and its usage."""
    names, events = _event_stream(r)
    assert names[0] == "message_start" and names[1] == "content_block_start"
    assert set(names[2:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = events[0]["message"]
    assert start["role"] == "assistant" and start["model"] == MODEL and start["content"] == []
    assert start["stop_reason"] is None
    assert events[1]["content_block"] == {"type": "text", "text": ""} and events[1]["index"] == 0
    deltas = [e["delta"] for e in events[2:-3]]
    assert all(d["type"] == "text_delta" for d in deltas)
    delta = events[-2]
    assert delta["delta"]["stop_reason"] == stop_reason
    return "".join(d["text"] for d in deltas), delta["usage"]


async def test_anthropic_messages_streamed_and_not(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--reply", REPLY)) as gw:
        r = await _messages(gw.client)
        assert r.headers["request-id"] == r.headers["x-blazar-trace-id"]
        doc = r.json()
        assert doc["type"] == "message" and doc["role"] == "assistant" and doc["model"] == MODEL
        assert doc["id"].startswith("msg_")
        assert doc["content"] == [{"type": "text", "text": REPLY}]
        assert doc["stop_reason"] == "end_turn" and doc["stop_sequence"] is None
        usage = doc["usage"]
        assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0

        text, streamed_usage = _streamed_text(await _messages(gw.client, stream=True), "end_turn")
        assert text == REPLY
        assert streamed_usage["output_tokens"] == usage["output_tokens"]

        # max_tokens cuts the answer, streamed or not, and says so.
        doc = (await _messages(gw.client, max_tokens=3)).json()
        [block] = doc["content"]
        assert doc["stop_reason"] == "max_tokens" and doc["usage"]["output_tokens"] == 3
        assert REPLY.startswith(block["text"]) and 0 < len(block["text"]) < len(REPLY)
        text, streamed_usage = _streamed_text(
            await _messages(gw.client, max_tokens=3, stream=True), "max_tokens"
        )
        assert text == block["text"] and streamed_usage["output_tokens"] == 3

        # Tools offered, but the model answers in prose: a text block and end_turn.
        tool = {"name": WEATHER["name"], "description": WEATHER["description"]}
        tool["input_schema"] = WEATHER["parameters"]
        doc = (await _messages(gw.client, tools=[tool])).json()
        assert doc["content"] == [{"type": "text", "text": REPLY}] and doc["stop_reason"] == "end_turn"
        text, _ = _streamed_text(await _messages(gw.client, tools=[tool], stream=True), "end_turn")
        assert text == REPLY
