"""Stored chat completions, sans-io: what a request keeps, and a stream assembled."""

from __future__ import annotations

import msgspec
import pytest

from blazar.dialects.neutral import DecodeError, ResponseFormat
from blazar.dialects.openai import decode_chat_request
from blazar.dialects.stored_chat import (
    StreamAssembler,
    check_metadata,
    decode_update,
    metadata_filter,
    store_fields,
    stored_messages,
)
from blazar.serve.policy import structured


def _sse(*docs: object) -> bytes:
    return b"".join(b"data: " + msgspec.json.encode(d) + b"\n\n" for d in docs) + b"data: [DONE]\n\n"


def _chunk(delta: dict[str, object], finish: str | None = None, **extra: object) -> dict[str, object]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 5,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def test_store_fields_only_when_asked() -> None:
    assert store_fields(b'{"model": "m", "messages": []}') == (False, {})
    assert store_fields(b'{"model": "m", "store": false, "metadata": {"a": "b"}}') == (False, {})
    assert store_fields(b'{"store": true, "metadata": {"a": "b"}}') == (True, {"a": "b"})
    assert store_fields(b"not json, store") == (False, {})


@pytest.mark.parametrize(
    ("metadata", "param"),
    [
        ({f"k{i}": "v" for i in range(17)}, "metadata"),
        ({"k" * 65: "v"}, "metadata." + "k" * 65),
        ({"k": "v" * 513}, "metadata.k"),
        ({"k": 3}, "metadata.k"),
    ],
)
def test_metadata_limits_are_openais(metadata: dict[str, object], param: str) -> None:
    with pytest.raises(DecodeError) as err:
        check_metadata(metadata)
    assert err.value.param == param
    with pytest.raises(DecodeError):
        store_fields(msgspec.json.encode({"store": True, "metadata": metadata}))


def test_metadata_at_the_limits_passes() -> None:
    most = {f"k{i:02}": "v" * 512 for i in range(15)} | {"k" * 64: "v"}
    assert check_metadata(most) == most


def test_update_takes_metadata_only() -> None:
    assert decode_update(b'{"metadata": {"a": "b"}}') == {"a": "b"}
    assert decode_update(b'{"metadata": null}') == {}
    with pytest.raises(DecodeError):
        decode_update(b'{"metadata": {}, "model": "x"}')
    with pytest.raises(DecodeError):
        decode_update(b"{}")


def test_metadata_filter_from_the_query() -> None:
    args = [("metadata[a]", "1"), ("model", "m"), ("metadata[b c]", "2")]
    assert metadata_filter(args) == {"a": "1", "b c": "2"}
    with pytest.raises(DecodeError):
        metadata_filter([("metadata", "x")])


def test_messages_get_ids_and_parts() -> None:
    got = stored_messages(
        "chatcmpl-9",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        ],
    )
    assert [m["id"] for m in got] == ["chatcmpl-9-0", "chatcmpl-9-1"]
    assert got[0]["content"] == "Be brief." and got[0]["content_parts"] is None
    assert got[1]["content"] == "Hi there" and len(got[1]["content_parts"]) == 2


USAGE = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


@pytest.mark.parametrize("step", [1, 5, 10_000])
def test_stream_assembles_the_completion(step: int) -> None:
    data = _sse(
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "Hé"}),
        _chunk({"content": "llo"}),
        _chunk({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{"}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}, "tool_calls"),
        {**_chunk({}), "choices": [], "usage": USAGE},
    )
    asm = StreamAssembler()
    for i in range(0, len(data), step):
        asm.feed(data[i : i + step])
    assert asm.done and not asm.failed and asm.completion_id == "chatcmpl-1"
    doc = asm.completion()
    assert doc["object"] == "chat.completion" and doc["created"] == 5 and doc["model"] == "m"
    (choice,) = doc["choices"]
    assert choice["message"]["content"] == "Héllo" and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]
    assert doc["usage"]["total_tokens"] == 7


def test_a_failed_stream_is_marked() -> None:
    asm = StreamAssembler()
    asm.feed(b'data: {"error": {"message": "boom"}}\n\n')
    assert asm.failed and not asm.done


def test_structured_receipts() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    want = structured.wanted(ResponseFormat(kind="json_schema", schema=schema))
    assert want is not None
    assert structured.valid(want, '{"n": 1}') is True and structured.valid(want, '{"n": "x"}') is False
    assert structured.wanted(ResponseFormat(kind="text")) is None
    assert structured.wanted(None, b'{"grammar": "root ::= \\"a\\""}') == structured.Wanted(None)
    from_body = structured.wanted(None, b'{"json_schema": {"type": "object"}}')
    assert from_body is not None and structured.valid(from_body, "[]") is False
    assert structured.receipt("engine-grammar", True) == "enforced=engine-grammar; valid=true"
    assert structured.receipt("none", None) == "enforced=none"
    assert structured.enforcement(None) == "none"


async def test_receipt_comes_before_done() -> None:
    async def chunks() -> object:
        yield _sse(_chunk({"content": '{"n": 2}'}, "stop"))

    want = structured.wanted(ResponseFormat(kind="json_object"))
    assert want is not None
    stream = structured.ReceiptStream(chunks(), want, "engine-grammar")  # type: ignore[arg-type]
    out = b"".join([chunk async for chunk in stream])
    note = b": x-blazar-structured-output enforced=engine-grammar; valid=true\n\ndata: [DONE]\n\n"
    assert out.endswith(note)


async def test_ollama_receipt_rides_on_the_last_line() -> None:
    lines = [{"response": '{"n"', "done": False}, {"response": ": 1}", "done": False}, {"done": True}]
    data = b"".join(msgspec.json.encode(x) + b"\n" for x in lines)

    async def chunks() -> object:
        for i in range(0, len(data), 7):  # lines split anywhere
            yield data[i : i + 7]

    want = structured.wanted(ResponseFormat(kind="json_object"))
    assert want is not None
    stream = structured.NdjsonReceipt(chunks(), want, "engine-grammar")  # type: ignore[arg-type]
    out = b"".join([chunk async for chunk in stream])
    docs = [msgspec.json.decode(line) for line in out.splitlines()]
    assert [d.get("response") for d in docs[:2]] == ['{"n"', ": 1}"]
    assert docs[-1]["blazar_structured_output"] == "enforced=engine-grammar; valid=true"


def test_metadata_counts_only_with_store() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "metadata": {"a": "b"}}
    assert decode_chat_request(msgspec.json.encode(base)).ignored == ["metadata"]
    assert decode_chat_request(msgspec.json.encode({**base, "store": True})).ignored == []
