"""The llama.cpp side of translation: requests to llama.cpp, its SSE back to neutral deltas."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from blazar.dialects import anthropic, tools
from blazar.dialects.llamacpp import (
    EngineError,
    EngineStream,
    ThinkSplitter,
    apply_defaults_to_body,
    engine_request,
    fold_system_turns,
    parse_response,
)
from blazar.dialects.neutral import ChatRequest, Message, ToolCall, ToolChoice, ToolSpec
from blazar.errors import Dialect
from tests.golden import assert_golden_json

GOLDEN = Path(__file__).parent / "golden" / "llamacpp"
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CLOCK = ToolSpec(name="get_time", parameters={"type": "object", "properties": {}})


def _req(**kw: object) -> ChatRequest:
    base: dict[str, object] = {"model": "m", "messages": [Message(role="user", content="Weather in Paris?")]}
    base.update(kw)
    return ChatRequest(**base)  # type: ignore[arg-type]


def _golden(name: str, got: object) -> None:
    assert_golden_json(GOLDEN / f"{name}.expected.json", got)


def test_sampling_fields_reach_the_engine() -> None:
    path, body = engine_request(
        _req(
            max_tokens=5,
            temperature=0.1,
            top_k=3,
            min_p=0.05,
            seed=1,
            stop=["x"],
            repeat_penalty=1.1,
            stream=True,
        ),
        native_tools=False,
    )
    assert path == "/v1/chat/completions"
    assert body["stream_options"] == {"include_usage": True}
    keys = ("max_tokens", "temperature", "top_k", "min_p", "seed", "stop", "repeat_penalty")
    assert [body[k] for k in keys] == [5, 0.1, 3, 0.05, 1, ["x"], 1.1]


def test_raw_prompt_skips_the_template() -> None:
    path, body = engine_request(_req(raw_prompt="<|im_start|>user\nhi"), native_tools=False)
    assert path == "/v1/completions" and body["prompt"] == "<|im_start|>user\nhi" and "messages" not in body


def test_suffix_runs_on_infill_with_native_names() -> None:
    req = _req(raw_prompt="def f():\n    ", suffix="\n    return x\n", max_tokens=8, stream=True)
    path, body = engine_request(req, native_tools=False)
    assert path == "/infill"
    assert body["input_prefix"] == "def f():\n    " and body["input_suffix"] == "\n    return x\n"
    assert body["n_predict"] == 8 and "max_tokens" not in body
    assert "messages" not in body and "stream_options" not in body and "return_progress" not in body


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_native_completion_stream_becomes_deltas(step: int) -> None:
    events = [
        {"content": "x = ", "stop": False},
        {"content": "1", "stop": False},
        {"content": "", "stop": True, "stop_type": "limit", "tokens_evaluated": 12, "tokens_predicted": 2},
    ]
    data = b"".join(b"data: " + msgspec.json.encode(e) + b"\n\n" for e in events)
    parser = EngineStream(_req(raw_prompt="p", suffix="s"), native_tools=False)
    deltas = [d for i in range(0, len(data), step) for d in parser.feed(data[i : i + step])]
    assert "".join(d.text for d in deltas) == "x = 1" and parser.started
    final = deltas[-1]
    assert final.finish_reason == "length" and final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (12, 2)


@pytest.mark.parametrize(
    ("name", "choice"),
    [
        ("auto", None),
        ("required", ToolChoice(mode="required")),
        ("function", ToolChoice(mode="function", name="get_time")),
    ],
)
def test_emulated_tools_golden(name: str, choice: ToolChoice | None) -> None:
    history = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="Weather in Paris?"),
        Message(
            role="assistant", tool_calls=[ToolCall(id="c1", name="get_weather", arguments='{"city":"Paris"}')]
        ),
        Message(role="tool", tool_call_id="c1", content="18 C, sunny"),
    ]
    _, body = engine_request(
        _req(messages=history, tools=[WEATHER, CLOCK], tool_choice=choice), native_tools=False
    )
    _golden(f"tools_{name}", body)
    assert "response_format" in body  # auto too: a call or {"text": …}


def test_native_tools_pass_through() -> None:
    _, body = engine_request(
        _req(tools=[WEATHER], tool_choice=ToolChoice(mode="required")), native_tools=True
    )
    assert body["tools"][0]["function"]["name"] == "get_weather" and body["tool_choice"] == "required"
    assert "response_format" not in body


def test_tool_choice_none_sends_no_tools() -> None:
    _, body = engine_request(_req(tools=[WEATHER], tool_choice=ToolChoice(mode="none")), native_tools=False)
    assert "tools" not in body and "response_format" not in body and len(body["messages"]) == 1


def test_parse_output() -> None:
    specs = [WEATHER]
    call = tools.parse_output('{"name": "get_weather", "arguments": {"city": "Oslo"}}', specs, None)
    assert call.text == "" and call.calls[0].name == "get_weather"
    assert msgspec.json.decode(call.calls[0].arguments) == {"city": "Oslo"}
    fenced = tools.parse_output('```json\n{"name": "get_weather", "arguments": {}}\n```', specs, None)
    assert fenced.calls and fenced.calls[0].arguments == "{}"
    prose = tools.parse_output("It is sunny.", specs, None)
    assert prose.text == "It is sunny." and prose.calls == []
    unknown = tools.parse_output('{"name": "rm_rf", "arguments": {}}', specs, None)
    assert unknown.calls == [] and unknown.text


def _sse(*events: object) -> bytes:
    return b"".join(b"data: " + msgspec.json.encode(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _chunk(content: str | None = None, finish: str | None = None, **delta: object) -> dict[str, object]:
    d = dict(delta)
    if content is not None:
        d["content"] = content
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


USAGE = {
    "choices": [],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}},
}


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_stream_parsing_survives_any_split(step: int) -> None:
    data = _sse(
        _chunk("Hé"), _chunk("llo <thi"), _chunk("nk>hmm</think> wörld"), _chunk(finish="length"), USAGE
    )
    parser = EngineStream(_req(), native_tools=False)
    deltas = [d for i in range(0, len(data), step) for d in parser.feed(data[i : i + step])]
    assert "".join(d.text for d in deltas) == "Héllo  wörld"
    assert "".join(d.thinking for d in deltas) == "hmm"
    final = deltas[-1]
    assert final.finish_reason == "length" and final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.cached_tokens) == (9, 3, 4)
    assert parser.done


def test_stream_counts_reasoning_tokens() -> None:
    """llama.cpp counts no reasoning tokens: one per event that carried thinking, at most
    the output tokens; a count the engine gives wins."""
    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 6}}
    thinking = [_chunk(reasoning_content=piece) for piece in ("Let", " me", " see")]
    final = EngineStream(_req(), native_tools=False).feed(
        _sse(*thinking, _chunk("Hi"), _chunk(" there"), _chunk(finish="stop"), usage)
    )[-1]
    assert final.usage is not None and final.usage.reasoning_tokens == 3
    tagged = EngineStream(_req(), native_tools=False).feed(
        _sse(_chunk("<think>"), _chunk("hmm"), _chunk("</think>"), _chunk("Hi"), _chunk(finish="stop"), usage)
    )[-1]
    assert tagged.usage is not None and tagged.usage.reasoning_tokens == 1  # the tags carry no text
    capped = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}
    final = EngineStream(_req(), native_tools=False).feed(_sse(*thinking, _chunk(finish="stop"), capped))[-1]
    assert final.usage is not None and final.usage.reasoning_tokens == 2
    told = {"choices": [], "usage": {**usage["usage"], "completion_tokens_details": {"reasoning_tokens": 5}}}
    final = EngineStream(_req(), native_tools=False).feed(_sse(*thinking, _chunk(finish="stop"), told))[-1]
    assert final.usage is not None and final.usage.reasoning_tokens == 5
    plain = EngineStream(_req(), native_tools=False).feed(_sse(_chunk("Hi"), _chunk(finish="stop"), usage))[
        -1
    ]
    assert plain.usage is not None and plain.usage.reasoning_tokens == 0


def test_stream_asks_for_and_reads_the_prompt_progress() -> None:
    _, body = engine_request(_req(stream=True), native_tools=False)
    assert body["return_progress"] is True
    progress = {"total": 34, "cache": 33, "processed": 33, "time_ms": 0}
    parser = EngineStream(_req(), native_tools=False)
    assert parser.prompt is None and not parser.seen_event
    # The first event (sent before the prompt is evaluated) already says the size.
    head = b"data: " + msgspec.json.encode({**_chunk(role="assistant"), "prompt_progress": progress})
    assert parser.feed(head) == []
    assert parser.prompt is None and not parser.seen_event  # not a whole event yet
    assert parser.feed(b"\n\n") == []
    assert parser.seen_event and parser.prompt is not None
    assert (parser.prompt.prompt_tokens, parser.prompt.cached_tokens) == (34, 33)
    later = {**_chunk(), "prompt_progress": {**progress, "processed": 34}}
    deltas = parser.feed(_sse(later, _chunk("Hi"), _chunk(finish="stop"), USAGE))
    assert [d.text for d in deltas] == ["Hi", ""] and parser.prompt.cached_tokens == 33


def test_stream_native_tool_call_fragments_keep_their_index() -> None:
    def call(index: int, **fn: str) -> dict[str, object]:
        head = {"id": f"id{index}"} if "name" in fn else {}
        return {"index": index, **head, "function": fn}

    data = _sse(
        _chunk(tool_calls=[call(0, name="a", arguments="")]),
        _chunk(tool_calls=[call(1, name="b", arguments='{"x"')]),
        _chunk(tool_calls=[call(0, arguments='{"y": 1}')]),
        _chunk(tool_calls=[call(1, arguments=": 2}")]),
        _chunk(finish="tool_calls"),
        USAGE,
    )
    deltas = EngineStream(_req(tools=[WEATHER]), native_tools=True).feed(data)
    merged: dict[int, str] = {}
    for d in deltas:
        for c in d.tool_calls:
            merged[c.index] = merged.get(c.index, "") + c.arguments
    assert merged == {0: '{"y": 1}', 1: '{"x": 2}'}
    assert deltas[-1].finish_reason == "tool_calls"


def test_stream_emulated_tool_call_becomes_call_fragments() -> None:
    data = _sse(
        _chunk('{"tool": "get_weather", '),
        _chunk('"arguments": {"city": "Rome"}}'),
        _chunk(finish="stop"),
        USAGE,
    )
    req = _req(tools=[WEATHER], tool_choice=ToolChoice(mode="required"))
    deltas = EngineStream(req, native_tools=False).feed(data)
    assert all(d.text == "" for d in deltas)
    fragments = [c for d in deltas for c in d.tool_calls]
    assert fragments[0].name == "get_weather" and fragments[0].id
    assert msgspec.json.decode("".join(c.arguments for c in fragments)) == {"city": "Rome"}
    assert deltas[-1].finish_reason == "tool_calls"


def test_stream_error_event_raises() -> None:
    parser = EngineStream(_req(), native_tools=False)
    with pytest.raises(EngineError, match="boom"):
        parser.feed(b'data: {"error": {"message": "boom"}}\n\n')


def test_think_splitter_holds_partial_tags() -> None:
    s = ThinkSplitter()
    pieces = [s.feed(p) for p in ["a<", "th", "ink>b</th", "ink>c<"]]
    pieces.append(s.flush())
    assert "".join(p[0] for p in pieces) == "ac<" and "".join(p[1] for p in pieces) == "b"


def test_parse_response_with_cached_usage() -> None:
    doc = {
        "id": "chatcmpl-1",
        "model": "m",
        "created": 1,
        "choices": [{"message": {"content": "<think>x</think>Hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 6}},
    }
    resp = parse_response(doc, _req(), native_tools=False)
    assert (resp.text, resp.thinking, resp.finish_reason) == ("Hi", "x", "stop")
    assert resp.usage.cached_tokens == 6


def test_context_overflow_becomes_prompt_too_long() -> None:
    from blazar.dialects.llamacpp import classify_error

    body = (
        b'{"error":{"code":400,"message":"request (5031 tokens) exceeds the context size (4096 tokens)",'
        b'"type":"exceed_context_size_error","n_prompt_tokens":5031,"n_ctx":4096}}'
    )
    err = classify_error(400, body)
    assert err.code == "PROMPT_TOO_LONG" and err.param == "messages"
    assert "5031" in err.message and "4096" in err.message and "num_ctx" in err.message
    # Each API's own words lead (clients read the counts from them); the advice follows.
    anthropic_words = err.message_for(Dialect.ANTHROPIC)
    assert anthropic_words.startswith("prompt is too long: 5031 tokens > 4096 maximum — ")
    assert "num_ctx" in anthropic_words
    assert err.message_for(Dialect.OPENAI).startswith(
        "This model's maximum context length is 4096 tokens. However, your messages resulted in 5031 tokens."
    )
    assert err.message_for(Dialect.OLLAMA) == err.message
    bad, failed = classify_error(400, b'{"error":{"message":"bad"}}'), classify_error(500, b"oops")
    assert (bad.code, bad.message, failed.code, failed.message) == (
        "BAD_REQUEST",
        "bad",
        "BAD_GATEWAY",
        "oops",
    )


def test_model_defaults_fill_a_relayed_openai_body() -> None:
    defaults = {"temperature": 0.2, "num_predict": 8, "top_k": 5, "stop": "<|end|>", "num_ctx": 4096}
    body = msgspec.json.encode(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.9, "top_k": None}
    )
    doc = msgspec.json.decode(apply_defaults_to_body(body, system="Be brief.", defaults=defaults))
    assert doc["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert doc["temperature"] == 0.9  # the request wins
    assert doc["max_tokens"] == 8 and doc["top_k"] == 5 and doc["stop"] == ["<|end|>"]
    assert "num_ctx" not in doc  # a context size restarts the engine: not a request field


def test_model_defaults_leave_what_the_request_says() -> None:
    own = {"model": "m", "messages": [{"role": "developer", "content": "Terse."}], "max_completion_tokens": 3}
    body = msgspec.json.encode(own)
    assert apply_defaults_to_body(body, system="Be brief.", defaults={"num_predict": 8}) is body
    prompt = msgspec.json.encode({"model": "m", "prompt": "Hi"})  # /v1/completions: no messages
    doc = msgspec.json.decode(
        apply_defaults_to_body(prompt, system="Be brief.", defaults={"num_predict": -1})
    )
    assert doc == {"model": "m", "prompt": "Hi"}  # a negative num_predict means no cap


def _roles(messages: list[Message]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in messages]


def test_system_turns_fold_into_user_text_where_the_template_takes_none() -> None:
    m = Message
    convo = [
        m(role="system", content="S1"),
        m(role="system", content="S2"),
        m(role="user", content="U1"),
        m(role="system", content="after U1"),
        m(role="assistant", content="A1"),
        m(role="system", content="before U2"),
        m(role="user", content="U2"),
        m(role="assistant", content="A2"),
        m(role="system", content="last"),
    ]
    r = "<system-reminder>\n{}\n</system-reminder>".format
    assert _roles(fold_system_turns(convo)) == [
        ("system", "S1\n\nS2"),
        ("user", f"U1\n\n{r('after U1')}"),
        ("assistant", "A1"),
        ("user", f"{r('before U2')}\n\nU2"),
        ("assistant", "A2"),
        ("user", r("last")),
    ]
    plain = [m(role="system", content="S"), m(role="user", content="U")]
    assert fold_system_turns(plain) == plain


def test_claude_code_replay_reaches_the_engine_in_either_form() -> None:
    body = (GOLDEN.parent / "anthropic" / "claude_code_mid_conversation_system.request.json").read_bytes()
    req = anthropic.decode_messages_request(body)
    _, kept = engine_request(req, native_tools=True, system_turns=True)
    assert [x["role"] for x in kept["messages"]] == ["system", "user", "system"]
    _, folded = engine_request(req, native_tools=True, system_turns=False)
    assert [x["role"] for x in folded["messages"]] == ["system", "user"]
    last = folded["messages"][-1]["content"]
    assert last.startswith("<system-reminder>\nAs you answer") and "What does this repository do?" in last
    assert last.endswith(
        "<system-reminder>\nThe following skills are available for use with the Skill tool:"
        "\n- review: Review a pull request\n</system-reminder>"
    )


def test_the_context_advice_offers_only_what_can_work() -> None:
    from blazar.dialects.llamacpp import classify_error

    def over(n: int, ctx: int) -> bytes:
        return msgspec.json.encode(
            {"error": {"type": "exceed_context_size_error", "n_prompt_tokens": n, "n_ctx": ctx}}
        )

    # Room left below the training length: raising the context helps, up to that length.
    message = classify_error(400, over(5031, 4096), ctx_limit=8192, model="smol").message
    assert "raise the context, at most to 8192" in message and '[models."smol"]' in message
    # Already at the training length: only a shorter prompt or an extension can help.
    for body in (over(9000, 8192), over(9000, 4096)):
        message = classify_error(400, body, ctx_limit=8192, model="smol").message
        assert "raise the context" not in message and "rope_scaling" in message and "8192" in message
    message = classify_error(400, over(20000, 16384), ctx_limit=16384, extended=True, model="smol").message
    assert "raise the context" not in message and "rope_scale" in message


def test_the_output_cap_fills_only_a_missing_limit() -> None:
    from blazar.dialects.llamacpp import cap_output, cap_output_in_body

    body = msgspec.json.encode({"model": "m", "messages": []})
    capped, applied = cap_output_in_body(body, 64)
    assert applied and msgspec.json.decode(capped)["max_tokens"] == 64
    assert cap_output_in_body(body, None) == (body, False)
    for own in ({"max_tokens": 5}, {"max_completion_tokens": 5}, {"n_predict": -1}):
        given = msgspec.json.encode({"model": "m", "prompt": "x", **own})
        assert cap_output_in_body(given, 64) == (given, False)
    req, applied = cap_output(_req(), 64)
    assert applied and req.max_tokens == 64
    assert cap_output(msgspec.structs.replace(_req(), max_tokens=3), 64)[0].max_tokens == 3
