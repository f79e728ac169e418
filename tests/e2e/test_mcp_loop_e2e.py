"""The MCP tool loop through the real daemon, with the test model (its template has no tools,
so calls go through the gateway's emulation) and a real MCP server over stdio: the official
OpenAI, Anthropic and Ollama clients get an answer after the gateway ran the tools, told by
``x-blazar-mcp``, whole or streamed; a client's own tool ends the loop; a failing tool is a
result, not a 5xx."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

SERVER = Path(__file__).resolve().parent.parent / "mcp_servers" / "tools_server.py"
CONFIG = f"""
[[mcp]]
name = "tools"
command = [{json.dumps(sys.executable)}, {json.dumps(str(SERVER))}]
timeout_s = 5
max_rounds = 2
"""
USE = {"x-blazar-mcp": "tools"}
ASK = [{"role": "user", "content": "Repeat the word banana with the echo tool."}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    d = start_daemon(make_home(tmp_path_factory.mktemp("mcp") / "home", model_path, config=CONFIG))
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=180)


def _counts(header: str) -> tuple[int, int]:
    found = re.fullmatch(r"rounds=(\d+), calls=(\d+)", header)
    assert found, header
    return int(found[1]), int(found[2])


def _looped(header: str) -> None:
    """At least the forced round ran, at most ``max_rounds`` (the model may call again freely)."""
    rounds, calls = _counts(header)
    assert 1 <= rounds <= 2 and calls >= rounds, header


def _forced(name: str) -> dict[str, object]:
    return {"type": "function", "function": {"name": name}}


def test_openai_chat_gets_the_answer_after_the_tool_ran(daemon: DaemonProc, client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tool_choice=_forced("mcp__tools__echo"),  # type: ignore[arg-type]
        max_tokens=40,
        temperature=0,
        extra_headers=USE,
    )
    _looped(raw.headers["x-blazar-mcp"])
    answer = raw.parse().choices[0]
    # the loop ended in text (how much the tiny model says is up to it): no MCP call leaks out
    assert not answer.message.tool_calls and answer.finish_reason in ("stop", "length")
    servers = {s["name"]: s for s in httpx.get(f"{daemon.url}/api/mcp", timeout=30).json()["servers"]}
    assert servers["tools"]["started"] is True


def test_a_failing_tool_is_a_result_the_model_reads(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Call the fail tool."}],
        tool_choice=_forced("mcp__tools__fail"),  # type: ignore[arg-type]
        max_tokens=24,
        extra_headers=USE,
    )
    assert raw.http_response.status_code == 200
    _looped(raw.headers["x-blazar-mcp"])


def test_a_client_tool_ends_the_loop_and_returns_to_the_client(client: openai.OpenAI) -> None:
    mine = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[mine],  # type: ignore[list-item]
        tool_choice=_forced("get_weather"),  # type: ignore[arg-type]
        max_tokens=40,
        extra_headers=USE,
    )
    (call,) = raw.parse().choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and raw.headers["x-blazar-mcp"] == "rounds=0, calls=0"


def test_anthropic_and_ollama_run_the_same_loop(daemon: DaemonProc) -> None:
    ant = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=180)
    raw = ant.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=40,
        messages=ASK,  # type: ignore[arg-type]
        tool_choice={"type": "any"},  # some tool: the client knows no names, the gateway adds them
        extra_headers=USE,
    )
    _looped(raw.headers["x-blazar-mcp"])
    assert all(b.type == "text" for b in raw.parse().content)  # no tool_use leaks out
    chat = ollama.Client(host=daemon.url, timeout=180, headers=USE).chat(
        model=MODEL, messages=ASK, options={"num_predict": 24}
    )
    assert chat.done and not chat.message.tool_calls  # no tool_choice here: the model decides
    r = httpx.post(
        f"{daemon.url}/api/chat",
        json={"model": MODEL, "messages": ASK, "stream": False, "options": {"num_predict": 8}},
        headers=USE,
        timeout=180,
    )
    rounds, _ = _counts(r.headers["x-blazar-mcp"])
    assert r.status_code == 200 and rounds <= 2


def test_the_body_names_the_servers_too(daemon: DaemonProc) -> None:
    body = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 40,
        "mcp": "tools",
        "tool_choice": _forced("mcp__tools__echo"),
    }
    r = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    _looped(r.headers["x-blazar-mcp"])
    assert "x-blazar-ignored" not in r.headers  # `mcp` is a parameter, honoured
    # the body wins over the header; a wrong shape is named
    off = httpx.post(f"{daemon.url}/v1/chat/completions", json={**body, "mcp": "none", "tool_choice": "auto"},
                     headers=USE, timeout=180)  # fmt: skip
    assert off.status_code == 200 and "x-blazar-mcp" not in off.headers
    bad = httpx.post(f"{daemon.url}/v1/chat/completions", json={**body, "mcp": 3}, timeout=60)
    assert bad.status_code == 400 and "`mcp`" in bad.json()["error"]["message"]


def test_streams_run_the_loop_with_the_official_clients(daemon: DaemonProc, client: openai.OpenAI) -> None:
    with client.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tool_choice=_forced("mcp__tools__echo"),  # type: ignore[arg-type]
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=USE,
    ) as raw:
        assert raw.headers["x-blazar-mcp"] == "servers=tools"
        chunks = list(raw.parse())
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])  # one end, after the rounds
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)  # no MCP call leaks
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    ant = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=180)
    with ant.messages.stream(
        model=MODEL,
        max_tokens=24,
        messages=ASK,  # type: ignore[arg-type]
        tool_choice={"type": "any"},
        extra_headers=USE,
    ) as stream:
        final = stream.get_final_message()
    assert all(b.type == "text" for b in final.content) and final.stop_reason in ("end_turn", "max_tokens")
    unknown = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": MODEL, "messages": ASK, "max_tokens": 8},
        headers={"x-blazar-mcp": "nope"},
        timeout=60,
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["blazar_code"] == "MCP_SERVER_NOT_FOUND"


def test_the_responses_api_shows_the_calls_as_mcp_call_items(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        input="Repeat the word banana with the echo tool.",
        tool_choice="required",
        max_output_tokens=40,
        extra_headers=USE,
    )
    rounds, calls = _counts(raw.headers["x-blazar-mcp"])
    done = raw.parse()
    kinds = [item.type for item in done.output]
    assert done.status in ("completed", "incomplete") and kinds.count("mcp_call") == calls >= rounds >= 1
    assert "function_call" not in kinds  # every call ran here; none is left for the client
    with client.responses.stream(
        model=MODEL, input="Echo kiwi.", tool_choice="required", max_output_tokens=24, extra_headers=USE
    ) as stream:
        events = list(stream)
    # The last event carries the response: `response.completed`, or `response.incomplete` when
    # the tiny model runs into max_output_tokens (the SDK's get_final_response wants completed).
    seen = {event.type for event in events}
    assert events[-1].type in ("response.completed", "response.incomplete")
    final = events[-1].response  # type: ignore[union-attr]
    # the call is reported as it runs, and how it ended (the tiny model's arguments may not fit)
    assert "response.mcp_call.in_progress" in seen
    assert seen & {"response.mcp_call.completed", "response.mcp_call.failed"}
    assert final.output[0].type == "mcp_call"
