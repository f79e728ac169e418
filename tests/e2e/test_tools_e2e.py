"""Emulated tool calls with the real engine: SmolLM2's template has no tools."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.support import MODEL, DaemonProc

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PERSON = {
    "type": "function",
    "function": {
        "name": "add_person",
        "description": "Add a person to the address book",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
    },
}
TOOLS = [WEATHER, PERSON]
HAIKU = [{"role": "user", "content": "Write a haiku about the sea."}]


@pytest.fixture(scope="module")
def client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_streamed_text_answer_with_tools_arrives_in_several_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=HAIKU,
        tools=TOOLS,
        temperature=0,
        max_tokens=48,
        stream=True,  # type: ignore[arg-type]
    )
    pieces, calls, finish = [], [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        if delta.content:
            pieces.append(delta.content)
        calls += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert calls == [] and len(pieces) > 3, pieces
    text = "".join(pieces)
    assert '{"text"' not in text and len(text) > 10


def test_anthropic_stream_with_tools_streams_text_deltas(daemon: DaemonProc) -> None:
    ant = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=120)
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],  # type: ignore[index]
            "input_schema": t["function"]["parameters"],
        }  # type: ignore[index]
        for t in TOOLS
    ]
    with ant.messages.stream(
        model=MODEL,
        max_tokens=48,
        messages=HAIKU,
        tools=tools,  # type: ignore[arg-type]
        extra_body={"temperature": 0},
    ) as stream:
        deltas = [
            e.delta.text for e in stream if e.type == "content_block_delta" and e.delta.type == "text_delta"
        ]
    assert len(deltas) > 3 and '{"text"' not in "".join(deltas)


def test_an_argument_called_name_gets_the_person_not_the_tool(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Add a person called Carol who is 25"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        temperature=0,
    )
    call = r.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "add_person"  # type: ignore[union-attr]
    args = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert args["name"] not in ("add_person", "<tool name>") and "Carol" in args["name"]
    # Compact JSON: no token goes to indentation before the first argument.
    assert r.usage is not None and r.usage.completion_tokens < 30


def test_a_forced_call_cut_off_by_max_tokens_is_a_partial_call(
    daemon: DaemonProc, client: openai.OpenAI
) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=9,  # type: ignore[arg-type]
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length" and not choice.message.content
    assert choice.message.tool_calls and choice.message.tool_calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    body = {
        "model": MODEL,
        "max_tokens": 9,
        "temperature": 0,
        "messages": ask,
        "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],  # type: ignore[index]
        "tool_choice": {"type": "any"},
    }
    m = httpx.post(f"{daemon.url}/v1/messages", json=body, timeout=120).json()
    assert m["stop_reason"] == "max_tokens"
    assert [b["type"] for b in m["content"]] == ["tool_use"] and m["content"][0]["name"] == "get_weather"


def test_ollama_stream_with_tools_reports_real_eval_duration(daemon: DaemonProc) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": TOOLS,
        "format": "json",
        "options": {"temperature": 0, "num_predict": 40},
    }
    with httpx.stream("POST", f"{daemon.url}/api/chat", json=body, timeout=120) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    final = lines[-1]
    assert final["done"] and final["eval_count"] > 5
    # At least 1 ms per generated token on any machine: not the few microseconds of a
    # clock started when the whole call was already there.
    assert final["eval_duration"] > final["eval_count"] * 1_000_000


QUOTE = [{"role": "user", "content": 'Repeat this sentence exactly: She said "good morning" to everyone.'}]
CODE = [{"role": "user", "content": "Write a Python hello world program."}]


def _texts(daemon: DaemonProc, messages: list[dict[str, str]], max_tokens: int) -> dict[str, str]:
    """The answer through each dialect, with tools offered (the model's template has none)."""
    out: dict[str, str] = {}
    with httpx.Client(base_url=daemon.url, timeout=120) as http:
        chat = http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": messages,
                "tools": TOOLS,
                "temperature": 0,
                "max_tokens": max_tokens,
            },
        ).json()
        out["openai"] = chat["choices"][0]["message"]["content"] or ""
        tools = [
            {"name": t["function"]["name"], "description": t["function"]["description"],
             "input_schema": t["function"]["parameters"]}
            for t in TOOLS
        ]  # fmt: skip
        msg = http.post(
            "/v1/messages",
            headers={"anthropic-version": "2023-06-01"},
            json={
                "model": MODEL,
                "messages": messages,
                "tools": tools,
                "temperature": 0,
                "max_tokens": max_tokens,
            },
        ).json()
        out["anthropic"] = "".join(b.get("text", "") for b in msg["content"])
        ollama = http.post(
            "/api/chat",
            json={
                "model": MODEL, "messages": messages, "tools": TOOLS, "stream": False,
                "options": {"temperature": 0, "num_predict": max_tokens},
            },
        ).json()  # fmt: skip
        out["ollama"] = ollama["message"]["content"]
    return out


def test_a_text_answer_with_quotes_or_code_is_not_cut_when_tools_are_offered(daemon: DaemonProc) -> None:
    """A JSON string's grammar ended the answer at its first ``"`` (``She said ``, finish
    ``stop``); the answer is prose now, so quotes and code come through whole."""
    for dialect, text in _texts(daemon, QUOTE, 32).items():
        assert '"good morning"' in text, (dialect, text)
    for dialect, text in _texts(daemon, CODE, 96).items():
        assert "print(" in text and len(text) > 30, (dialect, text)
