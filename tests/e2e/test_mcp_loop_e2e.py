"""The MCP tool loop through the real daemon, with the test model (its template has no tools,
so calls go through the gateway's emulation) and a real MCP server over stdio: the official
OpenAI, Anthropic and Ollama clients get an answer after the gateway ran the tools, told by
``x-blazar-mcp``; a client's own tool ends the loop; a failing tool is a result, not a 5xx."""

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


def test_what_the_loop_cannot_do_is_refused_clearly(daemon: DaemonProc) -> None:
    body = {"model": MODEL, "messages": ASK, "stream": True, "max_tokens": 8}
    streamed = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, headers=USE, timeout=60)
    assert streamed.status_code == 400 and "whole answers" in streamed.json()["error"]["message"]
    unknown = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={**body, "stream": False},
        headers={"x-blazar-mcp": "nope"},
        timeout=60,
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["blazar_code"] == "MCP_SERVER_NOT_FOUND"


def test_the_responses_api_runs_the_loop_and_refuses_it_in_background(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        input="Repeat the word banana with the echo tool.",
        tool_choice="required",
        max_output_tokens=40,
        extra_headers=USE,
    )
    _looped(raw.headers["x-blazar-mcp"])
    done = raw.parse()
    assert done.status == "completed" and [item.type for item in done.output] == ["message"]
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.create(model=MODEL, input="hi", background=True, extra_headers=USE)
