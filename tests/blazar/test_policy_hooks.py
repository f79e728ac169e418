"""Policy hooks without a daemon: the ``[[hooks]]`` config checks, the verdicts a hook may
answer per stage, what it is sent, and the answer text read from and written back into each
dialect's answers, whole and streamed. On the real daemon: tests/e2e/test_policy_hooks_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from blazar.config import ConfigError, parse_config
from blazar.dialects import policy
from blazar.dialects.neutral import ChatRequest, Message
from blazar.dialects.responses_stream import finished_response
from blazar.errors import CATALOG, Dialect
from blazar.serve.policy import hooks

PATH = Path("config.toml")


def _hook(**fields: object) -> str:
    entry = {"name": "h", "stage": "pre", "url": "http://127.0.0.1:9/pre", **fields}
    lines = [f"{k} = {json.dumps(v)}" for k, v in entry.items() if v is not None]
    return "[[hooks]]\n" + "\n".join(lines) + "\n"


def test_the_config_takes_hooks_and_refuses_bad_ones_by_name() -> None:
    config = parse_config(_hook(routes=["/v1/chat/completions"], models=["smol*"]), PATH)
    assert config.hooks[0].on_error == "closed" and config.hooks[0].timeout_ms == 1000
    assert parse_config("", PATH).hooks == []
    for bad, said in (
        (_hook(url=None), "exactly one of url"),
        (_hook(entry="m:f"), "exactly one of url"),
        (_hook(url="ftp://x"), "http://"),
        (_hook(url=None, entry="no_function"), "module:function"),
        (_hook(timeout_ms=0), "timeout_ms"),
        (_hook(buffer_streams=True), "buffer_streams is for post hooks"),
        (_hook() + _hook(), "a name of its own"),
        (_hook(stage="during"), "stage"),
        (_hook(on_error="maybe"), "on_error"),
        (_hook(routes=["/v1/chat/completion"]), "not guarded by hooks"),  # a typo never applies
    ):
        with pytest.raises(ConfigError, match=said):
            parse_config(bad, PATH)


def test_an_entry_that_does_not_import_stops_the_start_naming_it() -> None:
    config = parse_config(_hook(url=None, entry="tests.no_such_module:check"), PATH)
    with pytest.raises(ConfigError, match=r"'h'.*cannot be imported"):
        hooks.PolicyHooks(config.hooks)
    made = hooks.PolicyHooks(
        parse_config(_hook(url=None, entry="tests.policy_hook_entry:py_pre"), PATH).hooks
    )
    assert made.pre[0].is_async and made.client is None


def test_a_hook_applies_to_its_routes_and_models() -> None:
    config = parse_config(_hook(routes=["/api/chat"], models=["smol*", "qwen"]), PATH)
    hook = hooks.Hook(config.hooks[0])
    assert hook.applies("/api/chat", "smollm2-135m") and hook.applies("/api/chat", "qwen")
    assert not hook.applies("/v1/chat/completions", "smollm2-135m")
    assert not hook.applies("/api/chat", "llama3")


def test_verdicts_per_stage() -> None:
    assert policy.decode_verdict(None, "pre") == policy.Verdict()
    assert policy.decode_verdict({}, "post").action == "allow"
    assert policy.decode_verdict({"action": "refuse", "reason": "no"}, "post").reason == "no"
    rewrite = policy.decode_verdict(
        {"action": "rewrite", "messages": [{"role": "user", "content": "x"}]}, "pre"
    )
    assert rewrite.messages == [Message(role="user", content="x")]
    for answer, stage in (
        ({"action": "redact", "text": "x"}, "pre"),
        ({"action": "rewrite", "messages": [{"role": "user"}]}, "post"),
        ({"action": "rewrite"}, "pre"),
        ({"action": "redact"}, "post"),
        ({"action": "shrug"}, "pre"),
        ({"action": "rewrite", "messages": [{"role": "wizard", "content": "x"}]}, "pre"),
        (["allow"], "pre"),
    ):
        with pytest.raises(policy.VerdictError):
            policy.decode_verdict(answer, stage)  # type: ignore[arg-type]


def test_what_a_hook_is_sent() -> None:
    req = ChatRequest(model="m", messages=[Message(role="user", content="hi")], stream=True)
    sent = policy.hook_payload(
        hook="h", stage="post", route="/v1/messages", dialect=Dialect.ANTHROPIC, key=None, trace_id="t",
        req=req, answer=(0, "hello"),
    )  # fmt: skip
    assert sent["dialect"] == "anthropic" and sent["key"] is None and sent["stream"] is True
    assert sent["request"]["messages"] == [{"role": "user", "content": "hi"}]
    assert sent["answer"] == {"choice": 0, "text": "hello"}
    json.dumps(sent)  # plain JSON, as a Python hook gets it


def test_a_rewrite_replaces_the_relayed_bodys_messages_only() -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"my secret"}],"max_tokens":3}'
    out = json.loads(policy.messages_into_body(body, [Message(role="user", content="[gone]")]))
    assert out == {"model": "m", "messages": [{"role": "user", "content": "[gone]"}], "max_tokens": 3}


def test_whole_answers_in_each_dialect() -> None:
    openai = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"}}], "usage": {}}
    anthropic = {"content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "Par"},
                             {"type": "text", "text": "is"}]}  # fmt: skip
    ollama_chat = {"message": {"role": "assistant", "content": "Paris"}, "done": True}
    ollama_generate = {"response": "Paris", "done": True}
    for dialect, doc in (
        (Dialect.OPENAI, openai),
        (Dialect.ANTHROPIC, anthropic),
        (Dialect.OLLAMA, ollama_chat),
        (Dialect.OLLAMA, ollama_generate),
    ):
        body = msgspec.json.encode(doc)
        assert policy.answer_texts(dialect, body) == ["Paris"]
        redacted = policy.with_texts(dialect, body, ["[x]"])
        assert policy.answer_texts(dialect, redacted) == ["[x]"]
    kept = json.loads(policy.with_texts(Dialect.ANTHROPIC, msgspec.json.encode(anthropic), ["[x]"]))
    assert kept["content"][0] == {"type": "thinking", "thinking": "hm"}  # only the text is replaced
    assert policy.answer_texts(Dialect.OPENAI, b'{"error": {"message": "no"}}') is None
    assert policy.answer_texts(Dialect.OPENAI, b"not json") is None


def test_streams_in_each_dialect_are_assembled_and_redacted_event_by_event() -> None:
    def sse(*docs: object, done: bool = True) -> bytes:
        return b"".join(b"data: " + msgspec.json.encode(d) + b"\n\n" for d in docs) + (
            b"data: [DONE]\n\n" if done else b""
        )

    def chunk(i: int, text: str) -> dict[str, object]:
        return {"choices": [{"index": i, "delta": {"content": text}}]}

    role = {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 3}}
    openai = sse(role, chunk(0, "Pa"), chunk(1, "Lo"), chunk(0, "ris"), chunk(1, "ndon"), usage)
    assert policy.stream_texts(Dialect.OPENAI, openai) == ["Paris", "London"]
    redacted = policy.stream_with_texts(Dialect.OPENAI, openai, ["[a]", "[b]"])
    assert policy.stream_texts(Dialect.OPENAI, redacted) == ["[a]", "[b]"]
    assert redacted.count(b"\n\n") == openai.count(b"\n\n") and redacted.endswith(b"data: [DONE]\n\n")
    assert b'"usage":{"prompt_tokens":3}' in redacted

    def event(kind: str, doc: dict[str, object]) -> bytes:
        return f"event: {kind}\n".encode() + b"data: " + msgspec.json.encode({"type": kind, **doc}) + b"\n\n"

    anthropic = (
        event("message_start", {"message": {}})
        + event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Par"}})
        + event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "is"}})
        + event("message_stop", {})
    )
    assert policy.stream_texts(Dialect.ANTHROPIC, anthropic) == ["Paris"]
    redacted = policy.stream_with_texts(Dialect.ANTHROPIC, anthropic, ["[x]"])
    assert policy.stream_texts(Dialect.ANTHROPIC, redacted) == ["[x]"]
    assert redacted.startswith(b"event: message_start\n") and redacted.endswith(
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )

    ollama = (
        b'{"message":{"role":"assistant","content":"Par"},"done":false}\n'
        b'{"message":{"role":"assistant","content":"is"},"done":false}\n{"message":{"content":""},"done":true}\n'
    )
    assert policy.stream_texts(Dialect.OLLAMA, ollama) == ["Paris"]
    redacted = policy.stream_with_texts(Dialect.OLLAMA, ollama, ["[x]"])
    assert [json.loads(line)["message"]["content"] for line in redacted.splitlines()] == ["[x]", "", ""]


def test_a_completion_is_rewritten_by_its_prompt() -> None:
    rewrite = policy.decode_verdict({"action": "rewrite", "prompt": "x"}, "pre", completion=True)
    assert rewrite.prompt == "x"
    with pytest.raises(policy.VerdictError, match="prompt"):  # messages do not rewrite a completion
        policy.decode_verdict(
            {"action": "rewrite", "messages": [{"role": "user", "content": "x"}]}, "pre", completion=True
        )
    body = b'{"model":"m","prompt":"my secret","max_tokens":3}'
    assert json.loads(policy.prompt_into_body(body, "[gone]")) == {
        "model": "m",
        "prompt": "[gone]",
        "max_tokens": 3,
    }


def test_responses_and_completions_answers_whole_and_streamed() -> None:
    message = {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "Par", "annotations": [{"type": "url_citation"}]},
        {"type": "output_text", "text": "is", "annotations": []}]}  # fmt: skip
    response = {"object": "response", "output": [{"type": "reasoning", "summary": []}, message]}
    body = msgspec.json.encode(response)
    assert policy.answer_texts("responses", body) == ["Paris"]
    redacted = json.loads(policy.with_texts("responses", body, ["[x]"]))
    assert [p["text"] for p in redacted["output"][1]["content"]] == ["[x]", ""]
    assert redacted["output"][1]["content"][0]["annotations"] == []  # they pointed into the old text
    assert redacted["output"][0] == {"type": "reasoning", "summary": []}
    completion = msgspec.json.encode(
        {"choices": [{"index": 0, "text": "Paris"}, {"index": 1, "text": "Rome"}]}
    )
    assert policy.answer_texts("completions", completion) == ["Paris", "Rome"]
    assert policy.answer_texts("completions", policy.with_texts("completions", completion, ["a", "b"])) == [
        "a",
        "b",
    ]

    def event(kind: str, **doc: object) -> bytes:
        return f"event: {kind}\n".encode() + b"data: " + msgspec.json.encode({"type": kind, **doc}) + b"\n\n"

    part = {"type": "output_text", "text": "Paris", "annotations": []}
    stream = (
        event("response.created", response={"object": "response", "output": []})
        + event("response.output_text.delta", delta="Par")
        + event("response.output_text.delta", delta="is")
        + event("response.output_text.done", text="Paris")
        + event("response.content_part.done", part=part)
        + event("response.output_item.done", item={**message, "content": [part]})
        + event(
            "response.completed", response={"object": "response", "output": [{**message, "content": [part]}]}
        )
    )
    assert policy.stream_texts("responses", stream) == ["Paris"]
    redacted_stream = policy.stream_with_texts("responses", stream, ["[x]"])
    assert policy.stream_texts("responses", redacted_stream) == ["[x]"]
    assert b"Paris" not in redacted_stream and redacted_stream.count(b"[x]") == 5
    assert redacted_stream.count(b"\n\n") == stream.count(b"\n\n")
    final = finished_response(redacted_stream)
    assert final is not None and policy.answer_texts("responses", msgspec.json.encode(final)) == ["[x]"]

    sse = (
        b"".join(
            b"data: "
            + msgspec.json.encode({"choices": [{"index": 0, "text": t, "finish_reason": None}]})
            + b"\n\n"
            for t in ("Par", "is")
        )
        + b"data: [DONE]\n\n"
    )
    assert policy.stream_texts("completions", sse) == ["Paris"]
    assert policy.stream_texts("completions", policy.stream_with_texts("completions", sse, ["[x]"])) == [
        "[x]"
    ]


def test_the_new_codes_are_in_the_catalog_and_the_docs() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    assert CATALOG["POLICY_REFUSED"].status == 403 and CATALOG["POLICY_HOOK_FAILED"].status == 503
    assert "`POLICY_REFUSED` | 403" in docs and "`POLICY_HOOK_FAILED` | 503" in docs
