"""The strict schema check itself (tests/responses_schema.py): what it lets through, what it
refuses, and that the suite's clients go through it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest
import trio

from blazar.dialects import responses
from blazar.dialects.neutral import Delta, ToolCallDelta, Usage
from blazar.dialects.responses_stream import StreamEncoder
from tests import responses_schema
from tests.instant import MODEL, instant_config, serve_gateway
from tests.responses_schema import SchemaError, check_event, check_events, check_response, parse_sse

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}


def _stream() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    body = {"model": "m", "input": "x", "tools": [TOOL], "metadata": {"k": "v"}}
    req = responses.decode_request(msgspec.json.encode(body))
    enc = StreamEncoder(req, response_id="resp_1", created_at=100.0, clock=lambda: 101.0)
    enc.ran_with(0.8, 0.95)
    raw = (
        enc.start()
        + enc.feed(Delta(thinking="hm"))
        + enc.feed(Delta(text="Hi"))
        + enc.feed(Delta(tool_calls=[ToolCallDelta(index=0, id="call_1", name="f", arguments="{}")]))
        + enc.finish(Delta(finish_reason="tool_calls", usage=Usage(prompt_tokens=3, completion_tokens=4)))
    )
    assert enc.final is not None
    return parse_sse(raw.decode()), enc.final


def test_what_the_encoder_sends_passes() -> None:
    events, doc = _stream()
    check_events(events)
    check_response(doc)


def _refused(doc: dict[str, Any], match: str) -> None:
    with pytest.raises(SchemaError, match=match):
        check_response(doc)


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ((), "surprise"),  # the Response itself
        (("output", 1), "surprise"),  # an output item
        (("output", 1, "content", 0), "surprise"),  # a content part
        (("tools", 0), "surprise"),  # a tool
        (("usage",), "surprise"),
        (("usage", "input_tokens_details"), "surprise"),
        (("reasoning",), "surprise"),
        (("text", "format"), "surprise"),
    ],
)
def test_a_key_no_model_declares_is_refused(path: tuple[Any, ...], match: str) -> None:
    _, doc = _stream()
    doc = copy.deepcopy(doc)
    target = doc
    for step in path:
        target = target[step]
    target["surprise"] = 1
    _refused(doc, match)


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ((), "temperature"),  # Open Responses requires the sampling that ran
        ((), "status"),
        ((), "store"),
        ((), "tools"),
        (("output", 1), "id"),
        (("output", 1, "content", 0), "annotations"),
        (("output", 2), "call_id"),
        (("usage",), "total_tokens"),
        (("usage", "input_tokens_details"), "cache_write_tokens"),  # the SDK requires it
    ],
)
def test_a_missing_field_is_refused(path: tuple[Any, ...], key: str) -> None:
    _, doc = _stream()
    doc = copy.deepcopy(doc)
    target = doc
    for step in path:
        target = target[step]
    del target[key]
    _refused(doc, "Field required")


def test_a_null_where_a_value_is_required_is_refused() -> None:
    _, doc = _stream()
    _refused({**doc, "top_p": None}, "top_p")
    _refused({**doc, "service_tier": None}, "service_tier")


def test_the_allow_lists_are_narrow() -> None:
    """``presence_penalty`` is accepted on a Response (Open Responses declares it there), not on
    an output item; ``namespace`` on a function call, not on a message."""
    _, doc = _stream()
    check_response(doc)  # presence_penalty and frequency_penalty are in it
    item = copy.deepcopy(doc)
    item["output"][1]["presence_penalty"] = 0.0
    _refused(item, "presence_penalty")
    call = copy.deepcopy(doc)
    call["output"][2]["namespace"] = "agents"
    check_response(call)
    message = copy.deepcopy(doc)
    message["output"][1]["namespace"] = "agents"
    _refused(message, "namespace")


def test_events_are_held_to_both_schemas() -> None:
    events, _ = _stream()
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    with pytest.raises(SchemaError, match="surprise"):
        check_event({**delta, "surprise": 1})
    with pytest.raises(SchemaError, match="Field required"):
        check_event({k: v for k, v in delta.items() if k != "item_id"})
    with pytest.raises(SchemaError, match="no event of this type"):
        check_event({**delta, "type": "response.output_text.tweaked"})
    created = events[0]
    with pytest.raises(SchemaError, match="temperature"):
        check_event({**created, "response": {**created["response"], "temperature": None}})
    with pytest.raises(SchemaError, match="consecutive"):
        check_events([events[0], events[2]])
    with pytest.raises(SchemaError, match="carries"):
        parse_sse('event: response.created\ndata: {"type": "response.in_progress"}\n\n')


async def test_the_suites_clients_are_checked(instant_home: Path) -> None:
    """tests/conftest.py puts the check on every httpx client and on the openai SDK's (httpx2):
    an answer of a Responses route passes through it, whole or streamed."""
    async with serve_gateway(instant_config()) as gw:
        body = {"model": MODEL, "input": "Hi", "max_output_tokens": 4}
        before = dict(responses_schema.SEEN)
        assert (await gw.client.post("/v1/responses", json=body)).status_code == 200
        assert (await gw.client.post("/v1/responses", json={**body, "stream": True})).status_code == 200
        assert responses_schema.SEEN["response"] == before.get("response", 0) + 1
        assert responses_schema.SEEN["event"] > before.get("event", 0)
        sdk = openai.OpenAI(
            base_url=f"{str(gw.client.base_url).rstrip('/')}/v1", api_key="unused", max_retries=0
        )
        before = dict(responses_schema.SEEN)
        await trio.to_thread.run_sync(
            lambda: sdk.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
        )
        assert responses_schema.SEEN["response"] == before.get("response", 0) + 1
