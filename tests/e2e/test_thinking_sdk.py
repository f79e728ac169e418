"""Thinking control end to end: each dialect's switch reaches llama.cpp through the real
daemon and engine, and the reasoning comes back in the dialect's own field, never as
``<think>`` tags in the answer; a model that cannot think says so, and strict mode refuses.

The thinking model is the test model with a template that opens ``<think>`` in its
generation prompt (``tests.synthetic_think``): SmolLM2 never closes it itself, so with
thinking on its output is reasoning until llama.cpp's reasoning budget ends the section."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from registry.store import Store
from tests.support import MODEL, DaemonProc, make_home, start_daemon
from tests.synthetic_think import cached_think_model

pytestmark = pytest.mark.slow

THINKER = "smollm2-think"
ASK = [{"role": "user", "content": "What is 2+2?"}]
GREEDY = {"temperature": 0}
"""Sampling the Anthropic client no longer names: the daemon reads it all the same."""
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to fly."}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    home = make_home(tmp_path_factory.mktemp("thinking") / "home", model_path, config="slots = 1\n")
    Store(home / "models").import_file(cached_think_model(model_path), THINKER, source="test")
    d = start_daemon(home)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def oai(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_openai_chat_switches_thinking_and_returns_reasoning_apart(oai: openai.OpenAI) -> None:
    off = oai.chat.completions.create(
        model=THINKER, messages=ASK, max_tokens=16, temperature=0, reasoning_effort="none"
    )
    message = off.choices[0].message
    assert message.content and "<think>" not in message.content
    assert getattr(message, "reasoning_content", None) in (None, "")

    # A level becomes a reasoning budget (minimal: 128 tokens): llama.cpp ends the reasoning
    # there and the model goes on to answer in the same stream.
    stream = oai.chat.completions.create(
        model=THINKER, messages=STORY, max_tokens=200, temperature=0, reasoning_effort="minimal", stream=True
    )
    reasoning, content = [], []
    for chunk in stream:
        for choice in chunk.choices:
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            content.append(choice.delta.content or "")
    assert "".join(reasoning).strip(), "no reasoning came back"
    assert "".join(content).strip(), "the budget did not end the reasoning"
    assert "<think>" not in "".join(content) and "</think>" not in "".join(content)


def test_openai_responses_returns_a_reasoning_item(oai: openai.OpenAI) -> None:
    resp = oai.responses.create(
        model=THINKER, input="What is 2+2?", max_output_tokens=24, reasoning={"effort": "high"}
    )
    kinds = [item.type for item in resp.output]
    assert kinds[0] == "reasoning", kinds
    assert "<think>" not in resp.output_text


def test_anthropic_thinking_blocks_whole_and_streamed(daemon: DaemonProc) -> None:
    client = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=300)
    thinking = {"type": "enabled", "budget_tokens": 1024}
    msg = client.messages.create(
        model=THINKER,
        messages=ASK,
        max_tokens=1100,
        thinking=thinking,  # type: ignore[arg-type]
        extra_body=GREEDY,
    )
    assert msg.content[0].type == "thinking" and msg.content[0].thinking.strip()
    assert all("<think>" not in b.text for b in msg.content if b.type == "text")

    events = []
    with client.messages.stream(
        model=THINKER,
        messages=ASK,
        max_tokens=1100,
        thinking=thinking,  # type: ignore[arg-type]
        extra_body=GREEDY,
    ) as stream:
        events = list(stream)
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert starts[0] == "thinking" and "thinking_delta" in deltas and "signature_delta" in deltas
    assert deltas.index("signature_delta") > deltas.index("thinking_delta")

    plain = client.messages.create(
        model=THINKER, messages=ASK, max_tokens=16, thinking={"type": "disabled"}, extra_body=GREEDY
    )
    assert [b.type for b in plain.content] == ["text"] and plain.content[0].text.strip()  # type: ignore[union-attr]


def test_ollama_think_switches_and_fills_thinking(daemon: DaemonProc) -> None:
    client = ollama.Client(host=daemon.url, timeout=300)
    on = client.chat(model=THINKER, messages=ASK, think=True, options={"num_predict": 24, "temperature": 0})
    assert on.message.thinking and "<think>" not in (on.message.content or "")
    off = client.chat(model=THINKER, messages=ASK, think=False, options={"num_predict": 16, "temperature": 0})
    assert off.message.content and not off.message.thinking
    gen = client.generate(model=THINKER, prompt="What is 2+2?", think=True, options={"num_predict": 24})
    assert gen.thinking and "<think>" not in gen.response


def test_a_model_that_cannot_think_says_so(daemon: DaemonProc, oai: openai.OpenAI) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, max_tokens=4, reasoning_effort="low"
    )
    assert raw.headers["x-blazar-ignored"] == "reasoning_effort"
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(
            model=MODEL,
            messages=ASK,
            max_tokens=4,
            reasoning_effort="low",
            extra_headers={"x-blazar-strict": "1"},
        )
    assert "PARAMETER_IGNORED" in str(refused.value.body)
    said = httpx.post(
        f"{daemon.url}/api/chat",
        json={"model": MODEL, "messages": ASK, "think": True, "stream": False, "options": {"num_predict": 4}},
        timeout=300,
    )
    assert said.status_code == 200 and said.headers["x-blazar-ignored"] == "think"
    # Not thinking is what this model does anyway: nothing to report.
    quiet = oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, max_tokens=4, reasoning_effort="none"
    )
    assert "x-blazar-ignored" not in quiet.headers
