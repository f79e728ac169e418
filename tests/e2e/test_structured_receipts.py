"""Structured-output receipts (``X-Blazar-Structured-Output``) on the real daemon and engine,
through the official SDKs of each dialect."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support import MODEL, DaemonProc

pytestmark = pytest.mark.slow

HEADER = "x-blazar-structured-output"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"colour": {"type": "string", "maxLength": 12}},
    "required": ["colour"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Name a colour as JSON."}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA, "strict": True}}


def _client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_openai_whole_answer_is_checked(daemon: DaemonProc) -> None:
    raw = _client(daemon).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        response_format=FORMAT,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0,
    )
    answer = raw.parse().choices[0].message.content or ""
    want = "true" if raw.parse().choices[0].finish_reason == "stop" else "false"
    assert raw.headers[HEADER] == f"enforced=engine-grammar; valid={want}"
    if want == "true":
        assert "colour" in json.loads(answer)


def test_openai_stream_says_it_before_done(daemon: DaemonProc) -> None:
    body = {"model": MODEL, "messages": ASK, "response_format": {"type": "json_object"}, "max_tokens": 24,
            "temperature": 0, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{daemon.url}/v1/chat/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200 and resp.headers[HEADER] == "enforced=engine-grammar"
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert lines[-2].startswith(f": {HEADER} enforced=engine-grammar; valid=")


def test_llamacpp_grammar_has_no_check_but_itself(daemon: DaemonProc) -> None:
    body = {"model": MODEL, "messages": ASK, "grammar": 'root ::= "red" | "blue"', "max_tokens": 4}
    resp = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200 and resp.headers[HEADER] == "enforced=engine-grammar"
    assert resp.json()["choices"][0]["message"]["content"] in ("red", "blue")
    plain = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": MODEL, "messages": ASK, "max_tokens": 2},
        timeout=120,
    )
    assert HEADER not in plain.headers


def test_ollama_anthropic_and_responses_say_it_too(daemon: DaemonProc) -> None:
    seen: list[str] = []

    def keep(resp: httpx.Response) -> None:
        if HEADER in resp.headers:
            seen.append(resp.headers[HEADER])

    oll = ollama.Client(host=daemon.url, timeout=120, event_hooks={"response": [keep]})
    got = oll.chat(model=MODEL, messages=ASK, format=SCHEMA, options={"num_predict": 24, "temperature": 0})
    assert seen[-1].startswith("enforced=engine-grammar; valid=")
    assert seen[-1].endswith("true") == (got.done_reason == "stop")
    # a stream's head has the enforcement; its last line the check (the SDK drops that field)
    body = {"model": MODEL, "messages": ASK, "format": SCHEMA, "options": {"num_predict": 24}}
    with httpx.stream("POST", f"{daemon.url}/api/chat", json=body, timeout=120) as resp:
        assert resp.headers[HEADER] == "enforced=engine-grammar"
        last = json.loads([line for line in resp.iter_lines() if line][-1])
    assert last["done"] and last["blazar_structured_output"].startswith("enforced=engine-grammar; valid=")

    ant = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=120)
    raw = ant.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=24,
        messages=ASK,  # type: ignore[arg-type]
        extra_body={"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}},
    )
    assert raw.headers[HEADER].startswith("enforced=engine-grammar; valid=")

    resp = _client(daemon).responses.with_raw_response.create(
        model=MODEL,
        input="Name a colour as JSON.",
        max_output_tokens=24,
        text={"format": {"type": "json_schema", "name": "colour", "schema": SCHEMA, "strict": True}},
        store=False,
    )
    assert resp.headers[HEADER].startswith("enforced=engine-grammar; valid=")
