"""The Responses dialect, sans-io: decoding, history, output items and the event stream,
each event parsed by the official SDK's own types and held to both published schemas
(``tests/responses_schema.py``)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from blazar.dialects import responses
from blazar.dialects.neutral import ChatResponse, DecodeError, Delta, ToolCall, ToolCallDelta, Usage
from blazar.dialects.responses_stream import StreamEncoder, queued_events, whole_response
from tests.responses_schema import check_event, check_events, check_response, parse_sse

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


def decode(**body: Any) -> responses.ResponsesRequest:
    return responses.decode_request(msgspec.json.encode({"model": "m", **body}))


def test_a_string_input_is_one_user_message() -> None:
    req = decode(input="hi", instructions="be brief")
    chat = responses.chat_request(req, [])
    assert [(m.role, m.content) for m in chat.messages] == [("system", "be brief"), ("user", "hi")]
    assert req.items[0]["id"].startswith("msg_") and req.items[0]["content"][0]["type"] == "input_text"


def test_items_become_chat_messages() -> None:
    req = decode(
        input=[
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "hm"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "checking"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]
    )
    msgs = responses.chat_request(req, []).messages
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool"]
    assistant = msgs[2]
    assert assistant.content == "checking" and assistant.thinking == "hm"
    assert [c.name for c in assistant.tool_calls] == ["get_weather", "get_time"]
    assert msgs[3].tool_call_id == "c1" and msgs[3].tool_name == "get_weather"


def test_history_comes_before_this_turn() -> None:
    earlier = decode(input="first").items
    req = decode(input="second", previous_response_id="resp_x")
    assert [m.content for m in responses.chat_request(req, earlier).messages] == ["first", "second"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "tools": [{"type": "file_search"}]}, "tools[0].type"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": "x", "include": ["everything"]}, "include[0]"),
        ({"input": "x", "top_p": 2}, "top_p"),
        ({"input": "x", "background": True, "store": False}, "background"),
        ({"input": "x", "conversation": "c", "previous_response_id": "r"}, "conversation"),
        ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"input": []}, "input"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(DecodeError) as err:
        decode(**body)
    assert err.value.param == param


def test_what_cannot_be_honoured_is_named() -> None:
    req = decode(input="x", include=["reasoning.encrypted_content"], reasoning={"summary": "auto"})
    assert req.ignored == ["include:reasoning.encrypted_content", "reasoning.summary"]
    assert decode(input="x", truncation="auto").ignored == ["truncation"]
    assert decode(input="x", truncation="disabled").ignored == []


def test_text_format_json_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    req = decode(input="x", text={"format": {"type": "json_schema", "name": "s", "schema": schema}})
    assert req.response_format is not None and req.response_format.schema == schema
    # the Response repeats the format with every field the reference gives it
    doc = responses.encode_response(
        responses.sampled(req, 0.8, 0.95), response_id="resp_1", created_at=1.0, status="queued"
    )
    assert doc["text"]["format"] == {
        "type": "json_schema",
        "name": "s",
        "description": None,
        "schema": schema,
        "strict": False,
    }
    check_response(doc)
    assert decode(input="x", text={"format": {"type": "text"}}).response_format is None


DELTAS = [
    Delta(thinking="let me "),
    Delta(thinking="think"),
    Delta(text="Hello"),
    Delta(text=" there"),
    Delta(tool_calls=[ToolCallDelta(index=0, id="call_a", name="f", arguments='{"x"')]),
    Delta(tool_calls=[ToolCallDelta(index=0, arguments=": 1}")]),
]


def _encoder(req: responses.ResponsesRequest, **kw: Any) -> StreamEncoder:
    enc = StreamEncoder(req, response_id="resp_1", created_at=100.0, clock=lambda: 101.0, **kw)
    enc.ran_with(0.8, 0.95)  # as the route does once the engine is claimed
    return enc


def _stream(req: responses.ResponsesRequest, deltas: list[Delta], final: Delta) -> tuple[list[Any], Any]:
    enc = _encoder(req)
    raw = enc.start() + b"".join(enc.feed(d) for d in deltas) + enc.finish(final)
    docs = parse_sse(raw.decode())
    check_events(docs)
    check_response(enc.final)
    return [EVENT.validate_python(doc) for doc in docs], enc.final


def test_the_event_stream_parses_and_is_numbered() -> None:
    final = Delta(
        finish_reason="tool_calls", usage=Usage(prompt_tokens=9, completion_tokens=7, cached_tokens=2)
    )
    events, doc = _stream(decode(input="x"), DELTAS, final)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    completed = Response.model_validate(doc)
    assert [i.type for i in completed.output] == ["reasoning", "message", "function_call"]
    assert completed.output_text == "Hello there"
    assert completed.output[2].arguments == '{"x": 1}'  # type: ignore[union-attr]
    assert completed.usage is not None and completed.usage.input_tokens_details.cached_tokens == 2
    # every event of one item names the item's id and index
    message_id = completed.output[1].id
    assert {e.item_id for e in events if e.type == "response.output_text.delta"} == {message_id}
    assert {e.output_index for e in events if e.type == "response.output_text.delta"} == {1}


def test_the_arguments_done_event_names_the_function() -> None:
    """OpenAI's reference requires ``name`` on ``response.function_call_arguments.done``; the
    SDK's own model lags behind it, so the raw event is read."""
    final = Delta(finish_reason="tool_calls", usage=Usage(prompt_tokens=1, completion_tokens=1))
    enc = _encoder(decode(input="x"))
    raw = enc.start() + b"".join(enc.feed(d) for d in DELTAS) + enc.finish(final)
    check_events(parse_sse(raw.decode()))
    done = [
        json.loads(block.split("\n")[1].removeprefix("data: "))
        for block in raw.decode().split("\n\n")
        if block.startswith("event: response.function_call_arguments.done")
    ]
    assert [(d["name"], d["arguments"], d["item_id"]) for d in done] == [
        ("f", '{"x": 1}', done[0]["item_id"])
    ]


def test_streamed_and_whole_give_the_same_output() -> None:
    req = decode(input="x")
    usage = Usage(prompt_tokens=3, completion_tokens=4)
    _, streamed = _stream(req, DELTAS, Delta(finish_reason="tool_calls", usage=usage))
    whole = whole_response(
        responses.sampled(req, 0.8, 0.95),
        ChatResponse(
            id="x",
            model="m",
            created=0,
            text="Hello there",
            thinking="let me think",
            tool_calls=[ToolCall(id="call_a", name="f", arguments='{"x": 1}')],
            finish_reason="tool_calls",
            usage=usage,
        ),
        response_id="resp_1",
        created_at=100.0,
        completed_at=101.0,
    )

    def strip(doc: dict[str, Any]) -> dict[str, Any]:
        return {**doc, "output": [{k: v for k, v in i.items() if k != "id"} for i in doc["output"]]}

    assert strip(streamed) == strip(whole)
    check_response(whole)


def test_hitting_max_output_tokens_is_incomplete() -> None:
    events, doc = _stream(
        decode(input="x", max_output_tokens=2), [Delta(text="ab")], Delta(finish_reason="length")
    )
    assert events[-1].type == "response.incomplete"
    assert doc["status"] == "incomplete" and doc["incomplete_details"] == {"reason": "max_output_tokens"}
    assert doc["output"][0]["status"] == "incomplete"


def test_a_mid_stream_failure_ends_with_error_and_failed() -> None:
    enc = _encoder(decode(input="x"))
    enc.start()
    enc.feed(Delta(text="par"))
    tail = enc.error("ENGINE_CRASHED", "the engine died")
    blocks = parse_sse(tail.decode())
    assert [b["type"] for b in blocks] == ["error", "response.failed"]
    for block in blocks:
        check_event(block)
    assert Response.model_validate(blocks[1]["response"]).status == "failed"


def test_item_pages() -> None:
    items = [{"id": f"i{n}"} for n in range(5)]
    page = responses.item_page(items, after=None, limit=2, order="desc")
    assert [i["id"] for i in page["data"]] == ["i4", "i3"] and page["has_more"]
    page = responses.item_page(items, after="i3", limit=10, order="desc")
    assert [i["id"] for i in page["data"]] == ["i2", "i1", "i0"] and not page["has_more"]
    with pytest.raises(DecodeError):
        responses.item_page(items, after="zz", limit=2, order="asc")


def test_namespace_tools_are_offered_and_answered_in_their_namespace() -> None:
    spawn = {"type": "function", "name": "spawn", "parameters": {"type": "object", "properties": {}}}
    req = decode(
        input="x",
        tools=[{"type": "namespace", "name": "agents", "description": "sub-agents", "tools": [spawn]}],
    )
    assert [t.name for t in req.tools] == ["agents.spawn"]
    call = ToolCallDelta(index=0, id="call_1", name="agents.spawn", arguments="{}")
    _, doc = _stream(req, [Delta(tool_calls=[call])], Delta(finish_reason="tool_calls"))
    item = Response.model_validate(doc).output[0]
    assert (item.name, item.namespace) == ("spawn", "agents")  # type: ignore[union-attr]
    # given back, the call is the namespaced function again
    back = decode(
        input=[doc["output"][0], {"type": "function_call_output", "call_id": "call_1", "output": "ok"}]
    )
    msgs = responses.chat_request(back, []).messages
    assert msgs[0].tool_calls[0].name == "agents.spawn" and msgs[1].tool_name == "agents.spawn"


def test_a_stream_that_fails_midway_sends_openais_error_event() -> None:
    """OpenAI's ``error`` event, then ``response.failed`` (docs/api.md, OpenAI Responses)."""
    enc = _encoder(decode(input="x"))
    raw = enc.start() + enc.feed(Delta(text="Hel")) + enc.error("ENGINE_CRASHED", "engine for 'm' crashed")
    docs = parse_sse(raw.decode())
    check_events(docs)
    events = [EVENT.validate_python(doc) for doc in docs]
    error, failed = events[-2], events[-1]
    assert error.type == "error" and error.code == "ENGINE_CRASHED" and error.message.startswith("engine")
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error is not None and failed.response.error.code == "server_error"


def test_a_background_stream_opens_queued_then_goes_on_in_progress() -> None:
    """OpenAI's order for ``background`` with ``stream``: ``response.created`` and
    ``response.queued`` with the queued Response (logged at submit), then the job's stream from
    ``response.in_progress``, numbered after them."""
    req = responses.sampled(decode(input="x", background=True, stream=True), 0.8, 0.95)
    queued = responses.encode_response(req, response_id="resp_1", created_at=100.0, status="queued")
    opening = [{**e, "sequence_number": n} for n, e in enumerate(queued_events(queued))]
    enc = _encoder(req, queued=True)
    raw = enc.start() + enc.feed(Delta(text="Hi")) + enc.finish(Delta(finish_reason="stop"))
    events = [*opening, *parse_sse(raw.decode())]
    check_events(events)
    assert [(e["type"], e.get("response", {}).get("status")) for e in events[:3]] == [
        ("response.created", "queued"),
        ("response.queued", "queued"),
        ("response.in_progress", "in_progress"),
    ]
    assert events[-1]["type"] == "response.completed"
