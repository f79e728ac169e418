"""An integer beyond 64 bits is refused at decode, in every dialect, naming its field: Ollama's
own server refuses ``options.num_predict = 10**30``, and so does every API whose integers are
int64 on the wire. So is an integer below the floor its reference sets (a negative count, a
zero cap). A long number inside a string is text, and passes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from blazar.dialects import anthropic, images, ollama, openai, realtime, rerank, responses
from blazar.dialects.neutral import DecodeError
from tests.instant import MODEL, instant_config, serve_gateway

HUGE = 10**30
MSG = [{"role": "user", "content": "hi"}]

CASES: list[tuple[str, Callable[[bytes], Any], dict[str, Any], str]] = [
    (
        "openai chat",
        openai.decode_chat_request,
        {"model": "m", "messages": MSG, "max_tokens": HUGE},
        "max_tokens",
    ),
    ("openai seed", openai.decode_chat_request, {"model": "m", "messages": MSG, "seed": -HUGE}, "seed"),
    (
        "completions",
        openai.decode_completion_request,
        {"model": "m", "prompt": "x", "max_tokens": HUGE},
        "max_tokens",
    ),
    (
        "anthropic",
        anthropic.decode_messages_request,
        {"model": "m", "messages": MSG, "max_tokens": HUGE},
        "max_tokens",
    ),
    (
        "ollama chat",
        ollama.decode_chat_request,
        {"model": "m", "messages": MSG, "options": {"num_ctx": HUGE}},
        "options.num_ctx",
    ),
    (
        "ollama generate",
        ollama.decode_generate_request,
        {"model": "m", "prompt": "x", "options": {"num_predict": HUGE}},
        "options.num_predict",
    ),
    (
        "responses",
        responses.decode_request,
        {"model": "m", "input": "x", "max_output_tokens": HUGE},
        "max_output_tokens",
    ),
    (
        "rerank",
        rerank.decode_request,
        {"model": "m", "query": "q", "documents": ["a"], "top_n": HUGE},
        "top_n",
    ),
]


@pytest.mark.parametrize(("name", "decode", "body", "field"), CASES, ids=[c[0] for c in CASES])
def test_an_integer_beyond_64_bits_is_refused_naming_its_field(
    name: str, decode: Callable[[bytes], Any], body: dict[str, Any], field: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(json.dumps(body).encode())
    assert caught.value.code == "BAD_REQUEST" and caught.value.param == field, caught.value.message
    assert f"`{field}`" in caught.value.message


def test_a_long_number_in_text_is_text() -> None:
    content = "my card is 12345678901234567890123456789"
    req = openai.decode_chat_request(
        json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()
    )
    assert req.messages[0].content == content


async def test_ollama_generate_refuses_num_predict_beyond_int64(instant_home: object) -> None:
    async with serve_gateway(instant_config()) as gw:
        resp = await gw.client.post(
            "/api/generate",
            json={"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": HUGE}},
        )
    assert resp.status_code == 400, resp.text
    assert "options.num_predict" in resp.json()["error"]


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSG, **extra}


BELOW: list[tuple[str, Callable[[bytes], Any], dict[str, Any], str]] = [
    ("openai max_tokens", openai.decode_chat_request, _chat(max_tokens=0), "max_tokens"),
    (
        "openai max_completion",
        openai.decode_chat_request,
        _chat(max_completion_tokens=-1),
        "max_completion_tokens",
    ),
    ("openai n", openai.decode_chat_request, _chat(n=0), "n"),
    (
        "openai top_logprobs",
        openai.decode_chat_request,
        _chat(logprobs=True, top_logprobs=-1),
        "top_logprobs",
    ),
    ("completions n", openai.decode_completion_request, {"model": "m", "prompt": "x", "n": -1}, "n"),
    (
        "embeddings dimensions",
        openai.decode_embeddings_request,
        {"model": "m", "input": "x", "dimensions": 0},
        "dimensions",
    ),
    ("anthropic max_tokens", anthropic.decode_messages_request, _chat(max_tokens=0), "max_tokens"),
    ("anthropic top_k", anthropic.decode_messages_request, _chat(max_tokens=8, top_k=-1), "top_k"),
    ("ollama num_ctx", ollama.decode_chat_request, _chat(options={"num_ctx": 0}), "options.num_ctx"),
    (
        "ollama num_predict",
        ollama.decode_generate_request,
        {"model": "m", "prompt": "x", "options": {"num_predict": -3}},
        "options.num_predict",
    ),
    ("ollama top_k", ollama.decode_chat_request, _chat(options={"top_k": -1}), "options.top_k"),
    (
        "ollama repeat_last_n",
        ollama.decode_chat_request,
        _chat(options={"repeat_last_n": -2}),
        "options.repeat_last_n",
    ),
    (
        "responses max_output",
        responses.decode_request,
        {"model": "m", "input": "x", "max_output_tokens": 0},
        "max_output_tokens",
    ),
    (
        "responses top_logprobs",
        responses.decode_request,
        {"model": "m", "input": "x", "top_logprobs": -1},
        "top_logprobs",
    ),
    (
        "responses max_tool_calls",
        responses.decode_request,
        {"model": "m", "input": "x", "max_tool_calls": -1},
        "max_tool_calls",
    ),
    (
        "rerank top_n",
        rerank.decode_request,
        {"model": "m", "query": "q", "documents": ["a"], "top_n": 0},
        "top_n",
    ),
    (
        "rerank max_tokens_per_doc",
        rerank.decode_request,
        {"model": "m", "query": "q", "documents": ["a"], "max_tokens_per_doc": 0},
        "max_tokens_per_doc",
    ),
    (
        "images partial_images",
        images.decode_generation,
        {"model": "m", "prompt": "x", "partial_images": -1},
        "partial_images",
    ),
]


@pytest.mark.parametrize(("name", "decode", "body", "field"), BELOW, ids=[c[0] for c in BELOW])
def test_an_integer_below_its_floor_is_refused_naming_its_field(
    name: str, decode: Callable[[bytes], Any], body: dict[str, Any], field: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(json.dumps(body).encode())
    assert caught.value.code == "BAD_REQUEST" and caught.value.param == field, caught.value.message
    assert field in caught.value.message


def test_realtime_turn_detection_refuses_a_negative_duration() -> None:
    for key in ("silence_duration_ms", "prefix_padding_ms"):
        with pytest.raises(realtime.EventError) as caught:
            realtime.update_session(realtime.Session(id="sess_1", model="m"), {"turn_detection": {key: -1}})
        assert key in caught.value.message
