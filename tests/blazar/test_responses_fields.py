"""The Response object carries every field OpenAI's reference requires, with the values that
ran: the sampling the engine used when the request named none, the request's echoes, and the
neutral value of what Blazar does not vary. Served by the real gateway on the instant upstream
(a llama.cpp lane, so its sampling defaults are llama.cpp's)."""

from __future__ import annotations

import json
from pathlib import Path

from openai.types.responses import Response

from tests.instant import MODEL, instant_config, serve_gateway

REQUIRED = (
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "max_tool_calls",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "parallel_tool_calls",
    "tool_choice",
    "tools",
    "truncation",
)


async def test_a_response_says_the_sampling_it_ran_with(instant_home: Path) -> None:
    async with serve_gateway(instant_config()) as gw:
        plain = await gw.client.post(
            "/v1/responses", json={"model": MODEL, "input": "Hi", "max_output_tokens": 4}
        )
        asked = await gw.client.post(
            "/v1/responses",
            json={
                "model": MODEL,
                "input": "Hi",
                "max_output_tokens": 4,
                "temperature": 0.2,
                "top_p": 0.5,
                "safety_identifier": "user-7",
                "prompt_cache_key": "thread-1",
                "max_tool_calls": 3,
            },
        )
        streamed = await gw.client.post(
            "/v1/responses", json={"model": MODEL, "input": "Hi", "max_output_tokens": 4, "stream": True}
        )
    assert plain.status_code == asked.status_code == streamed.status_code == 200
    doc = plain.json()
    assert all(name in doc for name in REQUIRED), [n for n in REQUIRED if n not in doc]
    assert (doc["temperature"], doc["top_p"]) == (0.8, 0.95)  # llama.cpp's own defaults
    assert (doc["presence_penalty"], doc["frequency_penalty"], doc["top_logprobs"]) == (0.0, 0.0, 0)
    assert doc["service_tier"] == "default" and doc["max_tool_calls"] is None
    Response.model_validate(doc)
    echoed = asked.json()
    assert (echoed["temperature"], echoed["top_p"]) == (0.2, 0.5)
    assert (echoed["safety_identifier"], echoed["prompt_cache_key"], echoed["max_tool_calls"]) == (
        "user-7",
        "thread-1",
        3,
    )
    events = [
        json.loads(line.removeprefix("data: "))
        for line in streamed.text.splitlines()
        if line.startswith("data: ")
    ]
    snapshots = [e["response"] for e in events if "response" in e]
    assert snapshots and all((s["temperature"], s["top_p"]) == (0.8, 0.95) for s in snapshots)
    assert all(all(name in s for name in REQUIRED) for s in snapshots)
