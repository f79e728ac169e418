"""Golden files for the Anthropic dialect.

Requests: each ``golden/anthropic/NAME.request.json`` has a ``NAME.expected.json``
(the decoded neutral request, or the error code and message); names starting
with ``count_`` go through the count_tokens decoder. Streams: each case below is
fed to ``StreamEncoder`` and compared byte for byte with ``stream_NAME.sse``.
Responses: each case is compared with ``response_NAME.json``. Regenerate after
an intended change with
``BLAZAR_REGEN_GOLDEN=1 pytest tests/blazar/test_anthropic_dialect.py``.

When the official ``anthropic`` SDK is installed, the stream and response
goldens are also read back through it (its SSE decoder and accumulator).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from blazar.dialects import anthropic
from blazar.dialects.neutral import (
    ChatRequest,
    ChatResponse,
    DecodeError,
    Delta,
    FinishReason,
    Message,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from tests.golden import assert_golden, assert_golden_json, decoded

GOLDEN = Path(__file__).parent / "golden" / "anthropic"
CASES = sorted(p.name.removesuffix(".request.json") for p in GOLDEN.glob("*.request.json"))


def _json(doc: object) -> bytes:
    return msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n"


# --- requests -----------------------------------------------------------------


def _decode(name: str, body: bytes) -> dict[str, object]:
    decoder = (
        anthropic.decode_count_tokens_request
        if name.startswith("count_")
        else anthropic.decode_messages_request
    )
    return decoded(decoder, body)


@pytest.mark.parametrize("name", CASES)
def test_request_golden(name: str) -> None:
    got = _decode(name, (GOLDEN / f"{name}.request.json").read_bytes())
    assert_golden_json(GOLDEN / f"{name}.expected.json", got)


def test_every_request_case_has_a_golden_answer() -> None:
    assert len(CASES) >= 30
    assert all((GOLDEN / f"{c}.expected.json").exists() for c in CASES)


def _request_file(name: str) -> bytes:
    return (GOLDEN / f"{name}.request.json").read_bytes()


def test_key_rules_hold() -> None:
    with pytest.raises(DecodeError, match=r"missing required field `max_tokens`"):
        anthropic.decode_messages_request(_request_file("missing_max_tokens"))
    assert anthropic.decode_count_tokens_request(_request_file("missing_max_tokens")).max_tokens is None
    with pytest.raises(DecodeError, match=r"must be less than `max_tokens`"):
        anthropic.decode_messages_request(_request_file("thinking_budget_ge_max_tokens"))
    with pytest.raises(DecodeError, match=r"`tool_choice.name`"):
        anthropic.decode_messages_request(_request_file("tool_choice_tool_nameless"))
    with pytest.raises(DecodeError) as exc:
        anthropic.decode_messages_request(_request_file("malformed"))
    assert exc.value.code == "INVALID_JSON"
    req = anthropic.decode_messages_request(_request_file("tool_round_trip"))
    roles = [m.role for m in req.messages]
    assert roles == ["user", "assistant", "tool", "tool", "user", "assistant", "tool"]
    assert req.messages[1].tool_calls[0].arguments == '{"city":"Paris"}'
    assert req.messages[2].tool_name == "get_weather" and req.messages[2].tool_call_id == "toolu_01"
    assert req.include_usage


def test_thinking_budget_is_readable() -> None:
    assert anthropic.decode_messages_request(_request_file("thinking_enabled")).think_budget == 2048
    assert anthropic.decode_messages_request(_request_file("minimal")).think_budget is None


def test_finish_reason_mapping_round_trips() -> None:
    for neutral in ("stop", "length", "tool_calls", "stop_sequence"):
        assert anthropic.neutral_finish(anthropic.stop_reason(neutral)) == neutral
    assert anthropic.stop_reason(None) == "end_turn"
    assert anthropic.stop_reason("stop", used_tools=True) == "tool_use"
    assert anthropic.neutral_finish("refusal") == "stop"
    assert anthropic.neutral_finish("model_context_window_exceeded") == "length"


def test_small_encoders() -> None:
    assert anthropic.encode_count_tokens(42) == b'{"input_tokens":42}'
    doc = msgspec.json.decode(anthropic.encode_error("MODEL_NOT_FOUND", "no such model"))
    assert doc["type"] == "error" and doc["error"]["type"] == "not_found_error"
    assert anthropic.message_id_for("chatcmpl-abc") == "msg_abc"
    assert anthropic.message_id_for("msg_x") == "msg_x"


# --- streams ------------------------------------------------------------------

_USAGE = Usage(prompt_tokens=30, completion_tokens=9, cached_tokens=8)


def _req(think: bool | None = None) -> ChatRequest:
    return ChatRequest(
        model="smollm2",
        messages=[Message(role="user", content="hi")],
        stream=True,
        max_tokens=2048,
        think=think,
    )


def _tc(index: int, args: str = "", *, call_id: str | None = None, name: str | None = None) -> ToolCallDelta:
    return ToolCallDelta(index=index, id=call_id, name=name, arguments=args)


STREAMS: dict[str, tuple[ChatRequest, list[Delta]]] = {
    "text_only": (
        _req(),
        [
            Delta(text="Hel"),
            Delta(text="lo"),
            Delta(text="!"),
            Delta(finish_reason="stop", usage=_USAGE),
        ],
    ),
    "thinking_text": (
        _req(think=True),
        [
            Delta(thinking="Let me"),
            Delta(thinking=" think."),
            Delta(text="Four"),
            Delta(text="."),
            Delta(finish_reason="stop", usage=_USAGE),
        ],
    ),
    "thinking_hidden": (
        _req(think=None),
        [
            Delta(thinking="Let me think."),
            Delta(text="Four."),
            Delta(finish_reason="stop", usage=_USAGE),
        ],
    ),
    "two_tools_interleaved": (
        _req(),
        [
            Delta(tool_calls=[_tc(0, call_id="call_a", name="get_weather")]),
            Delta(tool_calls=[_tc(0, '{"ci')]),
            Delta(tool_calls=[_tc(1, '{"tz"', call_id="call_b", name="get_time")]),
            Delta(tool_calls=[_tc(0, 'ty": "Pa')]),
            Delta(tool_calls=[_tc(1, ': "UTC"')]),
            Delta(tool_calls=[_tc(0, 'ris"}')]),
            Delta(tool_calls=[_tc(1, "}")]),
            Delta(finish_reason="tool_calls", usage=_USAGE),
        ],
    ),
    "two_tools_sequential": (
        _req(),
        [
            Delta(tool_calls=[_tc(0, call_id="call_a", name="get_weather")]),
            Delta(tool_calls=[_tc(0, '{"city":')]),
            Delta(tool_calls=[_tc(0, ' "Paris"}')]),
            Delta(tool_calls=[_tc(1, "{", call_id="call_b", name="get_time")]),
            Delta(tool_calls=[_tc(1, "}")]),
            Delta(finish_reason="tool_calls", usage=_USAGE),
        ],
    ),
    "tool_after_text": (
        _req(think=True),
        [
            Delta(thinking="Need the weather."),
            Delta(text="Let me check."),
            Delta(tool_calls=[_tc(0, '{"city": "Paris"}', call_id="call_a", name="get_weather")]),
            Delta(finish_reason="stop", usage=_USAGE),
        ],
    ),
    "empty_answer": (_req(), [Delta(finish_reason="length")]),
}


def _render(request: ChatRequest, deltas: list[Delta]) -> bytes:
    enc = anthropic.StreamEncoder(message_id="chatcmpl-test1", model="smollm2", request=request)
    out = enc.start(Usage(prompt_tokens=30))
    finish: FinishReason | None = None
    usage: Usage | None = None
    for delta in deltas:
        out += enc.feed(delta)
        finish = delta.finish_reason or finish
        usage = delta.usage or usage
    return out + enc.finish(finish, usage)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_stream_golden(name: str) -> None:
    assert_golden(GOLDEN / f"stream_{name}.sse", _render(*STREAMS[name]))


def _events(sse: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in sse.decode().split("\n\n"):
        if not chunk:
            continue
        name_line, data_line = chunk.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        data = msgspec.json.decode(data_line[6:])
        assert data["type"] == name_line[7:]
        events.append((name_line[7:], data))
    return events


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_stream_is_well_formed(name: str) -> None:
    events = _events(_render(*STREAMS[name]))
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    open_index: int | None = None
    next_index = 0
    for kind, data in events[2:-2]:
        if kind == "content_block_start":
            assert open_index is None and data["index"] == next_index
            open_index, next_index = data["index"], next_index + 1
        else:
            assert data["index"] == open_index
            if kind == "content_block_stop":
                open_index = None
    assert open_index is None and next_index >= 1


def test_stream_tool_use_forced_and_usage() -> None:
    events = dict(_events(_render(*STREAMS["tool_after_text"])))
    assert events["message_delta"]["delta"]["stop_reason"] == "tool_use"
    assert events["message_delta"]["usage"] == {
        "input_tokens": 22,
        "output_tokens": 9,
        "cache_read_input_tokens": 8,
        "cache_creation_input_tokens": 0,
    }


def test_stream_stop_sequence_and_error() -> None:
    enc = anthropic.StreamEncoder(message_id="msg_1", model="m", request=_req())
    out = enc.feed(Delta(text="a"))  # start() is implied
    out += enc.finish("stop_sequence", None, stop_sequence="END")
    delta = dict(_events(out))["message_delta"]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert delta["usage"] == {"output_tokens": 0}
    enc = anthropic.StreamEncoder(message_id="msg_2", model="m", request=_req())
    enc.start()
    enc.feed(Delta(text="partial"))
    err = enc.error("ENGINE_CRASHED", "the engine stopped")
    assert err.startswith(b"event: error\ndata: ") and err.endswith(b"\n\n")
    body = msgspec.json.decode(err.split(b"data: ", 1)[1])
    assert body["error"]["type"] == "api_error" and body["blazar_code"] == "ENGINE_CRASHED"
    with pytest.raises(RuntimeError):
        enc.feed(Delta(text="more"))


# --- responses ----------------------------------------------------------------

_RESP = ChatResponse(id="chatcmpl-r1", model="smollm2", created=1700000000, usage=_USAGE)

RESPONSES: dict[str, tuple[ChatResponse, ChatRequest, str | None]] = {
    "text": (msgspec.structs.replace(_RESP, text="Hello there."), _req(), None),
    "tool_use": (
        msgspec.structs.replace(
            _RESP,
            text="",
            tool_calls=[
                ToolCall(id="call_a", name="get_weather", arguments='{"city": "Paris"}'),
                ToolCall(id="call_b", name="get_time", arguments="{not json"),
            ],
            finish_reason="tool_calls",
        ),
        _req(),
        None,
    ),
    "thinking": (
        msgspec.structs.replace(_RESP, thinking="Two and two.", text="4", finish_reason="length"),
        _req(think=True),
        None,
    ),
    "thinking_hidden": (
        msgspec.structs.replace(_RESP, thinking="Two and two.", text="4"),
        _req(think=None),
        None,
    ),
    "stop_sequence": (
        msgspec.structs.replace(_RESP, text="abc", finish_reason="stop_sequence"),
        _req(),
        "END",
    ),
}


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_response_golden(name: str) -> None:
    resp, req, stop_seq = RESPONSES[name]
    got = anthropic.encode_response(resp, request=req, stop_sequence=stop_seq)
    assert_golden(GOLDEN / f"response_{name}.json", _json(msgspec.json.decode(got)))


# --- the official SDK reads what we write ----


def _sdk_client(body: bytes, content_type: str) -> Any:
    """An SDK client whose transport answers every call with ``body``."""
    import anthropic as sdk
    from anthropic import _base_client as base

    httpx_mod = base.httpx2 if hasattr(base, "httpx2") else base.httpx  # newer SDKs vendor httpx2

    def handler(request: Any) -> Any:
        return httpx_mod.Response(
            200, content=body, headers={"content-type": content_type, "request-id": "r"}
        )

    return sdk.Anthropic(
        api_key="k",
        base_url="http://blazar.test",
        max_retries=0,
        http_client=httpx_mod.Client(transport=httpx_mod.MockTransport(handler)),
    )


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_sdk_accumulates_stream(name: str) -> None:
    client = _sdk_client(_render(*STREAMS[name]), "text/event-stream")
    with client.messages.stream(
        model="smollm2", max_tokens=2048, messages=[{"role": "user", "content": "hi"}]
    ) as s:
        final = s.get_final_message()
    resp, _, _ = _equivalent_response(name)
    expected = msgspec.json.decode(anthropic.encode_response(resp, request=STREAMS[name][0]))
    got = final.to_dict()
    assert got["content"] == expected["content"]
    assert got["stop_reason"] == expected["stop_reason"]
    assert got["usage"] == expected["usage"]


def _equivalent_response(name: str) -> tuple[ChatResponse, ChatRequest, None]:
    """The non-stream answer a stream case adds up to."""
    request, deltas = STREAMS[name]
    args: dict[int, list[str]] = {}
    ids: dict[int, tuple[str, str]] = {}
    for d in deltas:
        for tc in d.tool_calls:
            args.setdefault(tc.index, []).append(tc.arguments)
            if tc.id and tc.name:
                ids[tc.index] = (tc.id, tc.name)
    finish = next((d.finish_reason for d in deltas if d.finish_reason), "stop")
    resp = msgspec.structs.replace(
        _RESP,
        text="".join(d.text for d in deltas),
        thinking="".join(d.thinking for d in deltas),
        tool_calls=[ToolCall(id=ids[i][0], name=ids[i][1], arguments="".join(a)) for i, a in args.items()],
        finish_reason=finish,
        usage=next((d.usage for d in deltas if d.usage), Usage(prompt_tokens=30)),  # as start() said
    )
    return resp, request, None


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_sdk_parses_response(name: str) -> None:
    resp, req, stop_seq = RESPONSES[name]
    body = anthropic.encode_response(resp, request=req, stop_sequence=stop_seq)
    client = _sdk_client(body, "application/json")
    msg = client.messages.create(model="smollm2", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert msg.to_dict() == msgspec.json.decode(body)


def test_sdk_raises_on_error_event() -> None:
    import anthropic as sdk

    enc = anthropic.StreamEncoder(message_id="msg_e", model="smollm2", request=_req())
    body = enc.start() + enc.feed(Delta(text="par")) + enc.error("ENGINE_CRASHED", "the engine stopped")
    client = _sdk_client(body, "text/event-stream")
    with (
        pytest.raises(sdk.APIStatusError, match="the engine stopped"),
        client.messages.stream(
            model="smollm2", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        ) as s,
    ):
        s.get_final_message()


def test_claude_codes_attribution_block_is_kept_out_of_the_prompt() -> None:
    """Claude Code's first system block changes with every prompt (a version and a hash): at
    the head of the prompt it left no prefix for the engine's cache to reuse."""
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3.a1b; cc_entrypoint=cli;"},
        {"type": "text", "text": "You are Claude Code."},
    ]
    body = {"model": "m", "max_tokens": 8, "system": system, "messages": [{"role": "user", "content": "hi"}]}
    req = anthropic.decode_messages_request(msgspec.json.encode(body))
    assert req.messages[0].role == "system" and req.messages[0].content == "You are Claude Code."
