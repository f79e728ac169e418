"""Emulated tool calls: the incremental parser, streamed text answers, cut-off calls, the prompt."""

from __future__ import annotations

import itertools
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.dialects import anthropic, ollama, openai, tools
from blazar.dialects.jsonstream import StringReader, complete_prefix
from blazar.dialects.llamacpp import EngineStream, engine_request, parse_response
from blazar.dialects.neutral import ChatRequest, Delta, Message, ToolChoice, ToolSpec

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
PERSON = ToolSpec(
    name="add_person",
    description="Add a person to the address book",
    parameters={
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
)
SPECS = [WEATHER, PERSON]
REQUIRED = ToolChoice(mode="required")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
layouts = st.sampled_from(
    [{"separators": (",", ":")}, {"indent": 2}, {"separators": (", ", ": ")}]  # compact, pretty, spaced
)


def _render(doc: dict[str, Any], layout: dict[str, Any], ascii_only: bool) -> str:
    return json.dumps(doc, ensure_ascii=ascii_only, **layout)


def _chunks(data: Any, cuts: list[int]) -> list[Any]:
    points = sorted({min(c, len(data)) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


def _run(parser: tools.OutputParser, pieces: list[Any], finish: str = "stop") -> tuple[list[Delta], str]:
    deltas = [d for piece in pieces for d in parser.feed(piece)]
    tail, reason = parser.finish(finish)  # type: ignore[arg-type]
    return deltas + tail, reason


def _text(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


def _arguments(deltas: list[Delta]) -> str:
    return "".join(c.arguments for d in deltas for c in d.tool_calls)


# -- the incremental parser -----------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    answer=st.text(),
    layout=layouts,
    ascii_only=st.booleans(),
    as_bytes=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_any_chunking_of_a_text_answer_yields_its_text(
    answer: str, layout: dict[str, Any], ascii_only: bool, as_bytes: bool, cuts: list[int]
) -> None:
    output = _render({"text": answer}, layout, ascii_only)
    data: Any = output.encode() if as_bytes else output
    deltas, reason = _run(tools.OutputParser(SPECS, None, wrapped=True), _chunks(data, cuts))
    assert _text(deltas) == answer
    assert reason == "stop" and not any(d.tool_calls for d in deltas)


@settings(max_examples=150, deadline=None)
@given(
    tool=st.sampled_from(SPECS),
    args=st.dictionaries(st.text(max_size=8), json_values, max_size=5),
    layout=layouts,
    ascii_only=st.booleans(),
    as_bytes=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_any_chunking_of_a_call_yields_its_name_and_arguments(
    tool: ToolSpec,
    args: dict[str, Any],
    layout: dict[str, Any],
    ascii_only: bool,
    as_bytes: bool,
    cuts: list[int],
) -> None:
    output = _render({"tool": tool.name, "arguments": args}, layout, ascii_only)
    data: Any = output.encode() if as_bytes else output
    deltas, reason = _run(tools.OutputParser(SPECS, REQUIRED, wrapped=True), _chunks(data, cuts))
    fragments = [c for d in deltas for c in d.tool_calls]
    assert [c.name for c in fragments if c.name] == [tool.name]
    assert fragments[0].id and {c.index for c in fragments} == {0}
    assert json.loads(_arguments(deltas)) == args
    assert reason == "tool_calls" and _text(deltas) == ""


@settings(max_examples=150, deadline=None)
@given(
    tool=st.sampled_from(SPECS),
    args=st.dictionaries(st.text(max_size=8), json_values, min_size=1, max_size=5),
    layout=layouts,
    cut=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_a_call_cut_off_anywhere_is_still_that_call(
    tool: ToolSpec, args: dict[str, Any], layout: dict[str, Any], cut: float
) -> None:
    output = _render({"tool": tool.name, "arguments": args}, layout, False)
    head = output[: int(len(output) * cut)]
    key = '"arguments":'
    full_args = output[output.index(key) + len(key) :].lstrip()
    deltas, reason = _run(
        tools.OutputParser([tool], REQUIRED, wrapped=True), [head] if head else [], "length"
    )
    assert _text(deltas) == ""  # never the wrapper as text
    names = [c.name for d in deltas for c in d.tool_calls if c.name]
    assert names == [tool.name]  # the only tool it can be
    partial = _arguments(deltas)
    assert reason == "length" and full_args.startswith(partial.lstrip())
    repaired = json.loads(complete_prefix(partial) or "{}")
    assert isinstance(repaired, dict) and set(repaired) <= set(args)


@settings(max_examples=150, deadline=None)
@given(text=st.text(), cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=10))
def test_string_reader_decodes_escapes_split_anywhere(text: str, cuts: list[int]) -> None:
    encoded = json.dumps(text, ensure_ascii=True)[1:] + "tail"  # after the opening quote
    reader = StringReader()
    got, rest = [], None
    for piece in _chunks(encoded, cuts):
        if rest is not None:
            break
        out, end = reader.feed(piece)
        got.append(out)
        if end is not None:
            rest = piece[end:]
    assert "".join(got) == text


def test_complete_prefix_closes_what_was_cut() -> None:
    assert complete_prefix('{"city": "Par') == '{"city": "Par"}'
    assert complete_prefix('{"a": 1, "b') == '{"a": 1}'
    assert complete_prefix('{"a": [1, {"x": "y\\u00') == '{"a": [1, {"x": "y"}]}'
    assert complete_prefix('{"s": "\\ud83d') == '{"s": ""}'
    assert complete_prefix("not json") == ""


def test_unconstrained_output_prose_streams_and_other_json_is_text() -> None:
    prose, _ = _run(tools.OutputParser(SPECS, None, wrapped=False), ["It is ", "sunny."])
    assert [d.text for d in prose] == ["It is ", "sunny."]
    other, _ = _run(tools.OutputParser(SPECS, None, wrapped=False), ['{"score"', ": 5}"])
    assert _text(other) == '{"score": 5}'
    listed, reason = _run(
        tools.OutputParser(SPECS, None, wrapped=False), ['[{"name": "get_weather", "arguments": {}}]']
    )
    assert reason == "tool_calls" and [c.name for d in listed for c in d.tool_calls] == ["get_weather"]


# -- through the engine's stream ------------------------------------------------------


def _req(**kw: Any) -> ChatRequest:
    base: dict[str, Any] = {"model": "m", "messages": [Message(role="user", content="Hi")], "stream": True}
    return ChatRequest(**{**base, **kw})


def _sse(*contents: str, finish: str) -> list[bytes]:
    events = [{"choices": [{"index": 0, "delta": {"content": c}, "finish_reason": None}]} for c in contents]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    events.append({"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": len(contents)}})
    return [b"data: " + msgspec.json.encode(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def test_a_streamed_text_answer_with_tools_arrives_as_it_is_generated() -> None:
    events = _sse('{"te', 'xt":"Bon', "jour, ", 'le monde\\n"', "}", finish="stop")
    stream = EngineStream(_req(tools=SPECS), native_tools=False)
    per_event = [stream.feed(e) for e in events]
    texts = [d.text for deltas in per_event for d in deltas if d.text]
    assert texts == ["Bon", "jour, ", "le monde\n"]
    assert per_event[1] and per_event[1][0].text == "Bon"  # before the answer is over
    final = per_event[-2][-1]
    assert final.finish_reason == "stop" and not final.tool_calls


CUT = ['{"tool":"get_weather",', '"arguments":{"ci', 'ty":"Par']


def _cut_response() -> tuple[ChatRequest, Any]:
    req = _req(tools=[WEATHER], tool_choice=REQUIRED, stream=False, max_tokens=12)
    doc = {
        "choices": [{"index": 0, "message": {"content": "".join(CUT)}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 12},
    }
    return req, parse_response(doc, req, native_tools=False)


def test_a_call_cut_off_by_max_tokens_is_a_partial_call_in_every_dialect() -> None:
    req, resp = _cut_response()
    assert resp.text == "" and resp.finish_reason == "length"
    assert [(c.name, c.arguments) for c in resp.tool_calls] == [("get_weather", '{"city":"Par')]

    oa = msgspec.json.decode(openai.encode_chat_response(resp, model="m"))["choices"][0]
    assert oa["finish_reason"] == "length" and oa["message"]["content"] is None
    assert oa["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city":"Par'}

    an = msgspec.json.decode(anthropic.encode_response(resp, request=req))
    assert an["stop_reason"] == "max_tokens"
    assert [(b["type"], b.get("input")) for b in an["content"]] == [("tool_use", {"city": "Par"})]

    timings = ollama.Timings(total_ns=1)
    ol = msgspec.json.decode(ollama.encode_chat_response(resp, created_at="t", timings=timings))
    assert ol["done_reason"] == "length" and ol["message"]["content"] == ""
    assert ol["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Par"}


def _cut_stream_deltas() -> tuple[list[Delta], Delta]:
    req = _req(tools=[WEATHER], tool_choice=REQUIRED, max_tokens=12)
    stream = EngineStream(req, native_tools=False)
    deltas = [d for e in _sse(*CUT, finish="length") for d in stream.feed(e)]
    return [d for d in deltas if d.finish_reason is None], deltas[-1]


def test_a_streamed_call_cut_off_by_max_tokens_is_a_partial_call_in_every_dialect() -> None:
    deltas, final = _cut_stream_deltas()
    assert final.finish_reason == "length" and _text([*deltas, final]) == ""

    oa_enc = openai.ChatStreamEncoder(completion_id="c", model="m", created=0, include_usage=False)
    oa = b"".join([oa_enc.start(), *(oa_enc.feed(d) for d in deltas), oa_enc.finish(final)])
    chunks = [json.loads(line[6:]) for line in oa.split(b"\n\n") if line.startswith(b"data: {")]
    calls = [c for ch in chunks for c in ch["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city":"Par'
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert not any(ch["choices"][0]["delta"].get("content") for ch in chunks)

    an_enc = anthropic.StreamEncoder(message_id="m1", model="m", request=_req())
    an = b"".join([an_enc.start(), *(an_enc.feed(d) for d in deltas), an_enc.finish("length")])
    events = [json.loads(part.split(b"\ndata: ")[1]) for part in an.split(b"\n\n") if b"\ndata: " in part]
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [b["type"] for b in starts] == ["tool_use"] and starts[0]["name"] == "get_weather"
    partial = "".join(
        e["delta"]["partial_json"] for e in events if e.get("delta", {}).get("type") == "input_json_delta"
    )
    assert partial == '{"city":"Par'
    assert next(e for e in events if e["type"] == "message_delta")["delta"]["stop_reason"] == "max_tokens"

    ol_enc = ollama.StreamEncoder("m", dialect="chat")
    ol = b"".join([*(ol_enc.feed(d, created_at="t") for d in [*deltas, final])])
    ol += ol_enc.finish(created_at="t", timings=ollama.Timings(total_ns=1))
    lines = [json.loads(line) for line in ol.splitlines()]
    assert lines[-1]["done_reason"] == "length"
    called = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert called[0]["function"] == {"index": 0, "name": "get_weather", "arguments": {"city": "Par"}}
    assert not any(line["message"]["content"] for line in lines)


# -- what the engine is asked ---------------------------------------------------------


def test_the_constraint_is_compact_json_where_the_engine_reads_llguidance() -> None:
    _, body = engine_request(_req(tools=SPECS, tool_choice=REQUIRED), native_tools=False, llguidance=True)
    assert "response_format" not in body
    head, _, schema = body["grammar"].partition("\nstart: %json ")
    assert head == "%llguidance {}"
    assert json.loads(schema)["x-guidance"] == {"whitespace_flexible": False}
    # Elsewhere the JSON schema stands (its grammar allows whitespace between tokens).
    _, plain = engine_request(_req(tools=SPECS, tool_choice=REQUIRED), native_tools=False)
    assert "grammar" not in plain and plain["response_format"]["type"] == "json_schema"


@pytest.mark.parametrize("choice", [None, REQUIRED, ToolChoice(mode="function", name="add_person")])
def test_the_prompt_shows_compact_shapes_with_nothing_to_copy(choice: ToolChoice | None) -> None:
    _, body = engine_request(_req(tools=SPECS, tool_choice=choice), native_tools=False)
    rules = body["messages"][0]["content"].split("\n\n")[-1]
    assert '": ' not in rules and '", ' not in rules  # no spaces for the model to imitate
    # The only string values shown are tool names: no placeholder like "<tool name>".
    assert '"<' not in rules and "<tool name>" not in rules
    quoted = {piece for piece in rules.split('"')[1::2]}
    assert quoted <= {"tool", "arguments", "text", "add_person"}


def test_the_key_naming_the_tool_is_never_an_argument_name() -> None:
    # add_person has an argument called `name`: the call's own key must differ.
    schema = tools.constraint_schema([PERSON], REQUIRED)
    assert schema is not None and set(schema["properties"]) == {"tool", "arguments"}
    clash = ToolSpec(name="pick", parameters={"type": "object", "properties": {"tool": {"type": "string"}}})
    assert tools.call_key([PERSON, clash]) == "function"
    deltas, reason = _run(
        tools.OutputParser([clash], REQUIRED, wrapped=True),
        ['{"function":"pick","arguments":{"tool":"hammer"}}'],
    )
    assert reason == "tool_calls" and json.loads(_arguments(deltas)) == {"tool": "hammer"}


def test_auto_lets_the_model_answer_in_text_or_call() -> None:
    schema = tools.constraint_schema(SPECS, None)
    assert schema is not None
    shapes = [set(alt["properties"]) for alt in schema["anyOf"]]
    assert shapes == [{"tool", "arguments"}, {"tool", "arguments"}, {"text"}]
    # The caller's own response format wins over ours when the model may answer freely.
    assert tools.constraint_schema(SPECS, None, response_format=True) is None


# -- timings --------------------------------------------------------------------------


class _Encoder:
    def start(self, prompt: Any) -> bytes:
        return b""

    def feed(self, delta: Delta) -> bytes:
        return b"."

    def finish(self, final: Delta, timings: Any) -> bytes:
        return b"!"

    def error(self, code: str, message: str) -> bytes:
        return b"?"


class _Upstream:
    """The engine's SSE, noting the gateway's first-token time each time it is asked for more."""

    def __init__(self, events: list[bytes], call: Any) -> None:
        self.events = events
        self.call = call
        self.first_token_seen: list[int | None] = []

    async def _body(self) -> Any:
        for e in self.events:
            yield e
            self.first_token_seen.append(self.call.timings.first_token_ns)

    def aiter_raw(self) -> Any:
        return self._body()

    async def aclose(self) -> None:
        pass


async def test_the_first_token_of_an_emulated_call_starts_the_eval_time() -> None:
    from blazar.serve.context import Ask
    from blazar.serve.engine_call import EngineCall, TranslatedStream

    req = _req(tools=[WEATHER], tool_choice=REQUIRED)
    call = EngineCall(None, req, Ask.job())  # type: ignore[arg-type]
    upstream = _Upstream(_sse('{"to', 'ol":"get_weather",', '"arguments":{}}', finish="stop"), call)
    out = [chunk async for chunk in TranslatedStream(call, upstream, _Encoder())]  # type: ignore[arg-type]
    assert out[-1] == b"!"
    # Set by the first piece of output, though no delta could be made of it yet: Ollama's
    # eval_duration is the time from there to the end, not a few microseconds.
    assert upstream.first_token_seen[0] is not None
    assert call.timings.eval_ns > 0 and call.timings.first_token_ns == upstream.first_token_seen[0]
