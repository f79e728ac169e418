"""The batch wire layer: input-file validation (with line numbers), create-request
decoding, encoders checked against the official SDKs' models, and the status functions."""

from __future__ import annotations

from typing import Any, get_args

import anthropic.types.messages as am
import msgspec
import openai.types as ot
import pydantic
import pytest
from anthropic.pagination import SyncPage
from openai.pagination import SyncCursorPage
from openai.types.chat import ChatCompletion

from blazar.dialects import anthropic as anthropic_dialect
from blazar.dialects import batches as b
from blazar.dialects import openai as openai_dialect
from blazar.dialects.neutral import ChatRequest, ChatResponse, DecodeError, Message, Usage

CHAT = "/v1/chat/completions"


def line(custom_id: Any = "a", *, url: Any = CHAT, method: Any = "POST", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": method, "url": url, "body": {"model": "m", **body}}


def jsonl(*rows: Any) -> bytes:
    return b"".join((r if isinstance(r, bytes) else msgspec.json.encode(r)) + b"\n" for r in rows)


def file_error(data: bytes, **kw: Any) -> b.BatchFileError:
    with pytest.raises(b.BatchFileError) as info:
        b.validate_batch_jsonl(data, **kw)
    return info.value


# -- input files ----------------------------------------------------------------


def test_valid_file_keeps_order_line_numbers_and_bodies() -> None:
    data = jsonl(line("a", messages=[]), line("b", temperature=0.5)) + b"\n\n  \n"
    got = b.validate_batch_jsonl(data, max_lines=10)
    assert [(x.line, x.custom_id, x.url, x.model, x.method) for x in got] == [
        (1, "a", CHAT, "m", "POST"),
        (2, "b", CHAT, "m", "POST"),
    ]
    assert got[1].body == {"model": "m", "temperature": 0.5}


def test_crlf_bom_and_missing_final_newline_are_accepted() -> None:
    data = b"\xef\xbb\xbf" + msgspec.json.encode(line("a")) + b"\r\n" + msgspec.json.encode(line("b"))
    assert [x.custom_id for x in b.validate_batch_jsonl(data)] == ["a", "b"]


def test_every_endpoint_is_accepted() -> None:
    for url in b.BATCH_ENDPOINTS:
        assert b.validate_batch_jsonl(jsonl(line(url=url)))[0].url == url
    assert set(b.BATCH_ENDPOINTS) == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
    }


def test_duplicate_custom_id_names_both_lines() -> None:
    exc = file_error(jsonl(line("a"), line("b"), line("a")))
    assert exc.message == (
        "line 3: duplicate custom_id 'a' (first seen on line 1) — each request needs a unique custom_id"
    )
    assert (exc.code, exc.line, exc.param, exc.reason) == (
        "BATCH_FILE_INVALID",
        3,
        "custom_id",
        "duplicate_custom_id",
    )


BAD_LINES: list[tuple[Any, str, str | None, str]] = [
    (b"{not json", "invalid_json_line", None, "not valid JSON"),
    (b'{"custom_id": "\xff"}', "invalid_json_line", None, "not valid JSON (Invalid UTF-8"),
    ([1, 2], "invalid_json_line", None, "expected a JSON object, got an array"),
    ("text", "invalid_json_line", None, "expected a JSON object, got a string"),
    (
        {k: v for k, v in line().items() if k != "custom_id"},
        "missing_custom_id",
        "custom_id",
        "missing `custom_id`",
    ),
    (line(7), "invalid_custom_id", "custom_id", "`custom_id` must be a string, got an integer"),
    (line(""), "invalid_custom_id", "custom_id", "`custom_id` is empty"),
    ({k: v for k, v in line().items() if k != "method"}, "missing_method", "method", "missing `method`"),
    (line(method="GET"), "invalid_method", "method", "method 'GET' is not supported"),
    (line(method=None), "invalid_method", "method", '`method` must be "POST", got null'),
    ({k: v for k, v in line().items() if k != "url"}, "missing_url", "url", "missing `url`"),
    (line(url="/v1/moderations"), "invalid_url", "url", "url '/v1/moderations' is not supported"),
    (line(url=["/v1/x"]), "invalid_url", "url", "`url` must be a string, got an array"),
    ({k: v for k, v in line().items() if k != "body"}, "missing_body", "body", "missing `body`"),
    ({**line(), "body": "{}"}, "invalid_body", "body", "`body` must be an object, got a string"),
    ({**line(), "body": {}}, "invalid_model", "body.model", "missing `body.model`"),
    (
        {**line(), "body": {"model": 3}},
        "invalid_model",
        "body.model",
        "`body.model` must be a string, got an integer",
    ),
    ({**line(), "body": {"model": " "}}, "invalid_model", "body.model", "`body.model` is empty"),
]


@pytest.mark.parametrize(("bad", "reason", "param", "what"), BAD_LINES)
def test_bad_line_is_refused_with_its_number(bad: Any, reason: str, param: str | None, what: str) -> None:
    exc = file_error(jsonl(line("x"), line("y"), bad, line("z")))
    assert exc.message.startswith(f"line 3: {what}")
    assert " — " in exc.message  # says what to do
    assert (exc.code, exc.line, exc.param, exc.reason) == ("BATCH_FILE_INVALID", 3, param, reason)
    assert isinstance(exc, DecodeError)


def test_blank_line_between_requests_is_refused() -> None:
    exc = file_error(jsonl(line("a")) + b"   \n" + jsonl(line("b")))
    assert exc.line == 2 and exc.reason == "blank_line"
    assert exc.message == "line 2: blank line — remove blank lines between requests"


def test_empty_file_is_refused() -> None:
    for data in (b"", b"\n", b"  \r\n\n"):
        exc = file_error(data)
        assert exc.reason == "empty_file" and exc.line is None and exc.code == "BATCH_FILE_INVALID"


def test_too_many_lines_is_refused() -> None:
    data = jsonl(*(line(str(i)) for i in range(4)))
    assert len(b.validate_batch_jsonl(data, max_lines=4)) == 4
    exc = file_error(data, max_lines=3)
    assert exc.reason == "too_many_requests" and exc.line == 4
    assert "4 requests, more than the 3" in exc.message and "split" in exc.message


def test_lines_must_share_one_url() -> None:
    exc = file_error(jsonl(line("a"), line("b"), line("c", url="/v1/embeddings")))
    assert exc.message == (
        "line 3: url '/v1/embeddings' differs from '/v1/chat/completions' on line 1 — "
        "every request in one batch file must use the same url"
    )
    assert (exc.line, exc.param, exc.reason) == (3, "url", "mismatched_url")


def test_endpoint_check_names_the_line() -> None:
    lines = b.validate_batch_jsonl(jsonl(line("a", url="/v1/embeddings"), line("b", url="/v1/embeddings")))
    b.check_batch_endpoint(lines, "/v1/embeddings")
    with pytest.raises(b.BatchFileError) as info:
        b.check_batch_endpoint(lines, CHAT)
    exc = info.value
    assert exc.code == "BATCH_ENDPOINT_MISMATCH" and exc.line == 1 and exc.param == "url"
    assert exc.message.startswith("line 1: url '/v1/embeddings' does not match the batch's endpoint")
    entry = b.file_error_entry(exc)
    assert (entry.code, entry.line, entry.param, entry.message) == (
        "mismatched_endpoint",
        1,
        "url",
        exc.message,
    )


def test_failed_validation_renders_as_batch_errors() -> None:
    exc = file_error(jsonl(line("a"), line("a")))
    rec = b.BatchRecord(
        id="batch_1", endpoint=CHAT, input_file_id="file-1", status="failed", created_at=10, failed_at=11,
        errors=[b.file_error_entry(exc)],
    )  # fmt: skip
    batch = ot.Batch.model_validate(b.encode_batch(rec))
    assert batch.status == "failed" and batch.errors is not None and batch.errors.object == "list"
    assert batch.errors.data is not None
    (err,) = batch.errors.data
    assert (err.code, err.line, err.param) == ("duplicate_custom_id", 2, "custom_id")
    assert err.message == exc.message


# -- POST /v1/batches -----------------------------------------------------------


def create(**fields: Any) -> bytes:
    base = {"input_file_id": "file-1", "endpoint": CHAT, "completion_window": "24h"}
    return msgspec.json.encode({k: v for k, v in {**base, **fields}.items() if v is not ...})


def create_error(body: bytes) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        b.decode_batch_create(body)
    return info.value


def test_create_decodes_all_fields() -> None:
    got = b.decode_batch_create(
        create(
            metadata={"k": "v" * 512, **{f"k{i}": "" for i in range(15)}},
            output_expires_after={"anchor": "created_at", "seconds": 3600},
            unknown_field=1,
        )
    )
    assert got.input_file_id == "file-1" and got.endpoint == CHAT and got.completion_window == "24h"
    assert got.metadata is not None and len(got.metadata) == 16 and got.metadata["k"] == "v" * 512
    assert got.output_expires_after_s == 3600
    plain = b.decode_batch_create(create())
    assert plain.metadata is None and plain.output_expires_after_s is None


CREATE_ERRORS: list[tuple[dict[str, Any], str, str]] = [
    ({"input_file_id": ...}, "input_file_id", "Missing required parameter: 'input_file_id'."),
    ({"endpoint": ...}, "endpoint", "Missing required parameter: 'endpoint'."),
    ({"completion_window": ...}, "completion_window", "Missing required parameter: 'completion_window'."),
    (
        {"input_file_id": 5},
        "input_file_id",
        "Invalid type for 'input_file_id': expected a string, but got an integer",
    ),
    ({"input_file_id": ""}, "input_file_id", "Invalid 'input_file_id': empty string"),
    (
        {"endpoint": "/v1/moderations"},
        "endpoint",
        "Invalid value for 'endpoint': '/v1/moderations'. Supported",
    ),
    ({"completion_window": "48h"}, "completion_window", "Invalid value for 'completion_window': '48h'."),
    ({"metadata": []}, "metadata", "Invalid type for 'metadata': expected an object, but got an array"),
    ({"metadata": {f"k{i}": "" for i in range(17)}}, "metadata", "Invalid 'metadata': too many properties."),
    ({"metadata": {"k" * 65: ""}}, "metadata", "Invalid 'metadata': key"),
    (
        {"metadata": {"k": 1}},
        "metadata.k",
        "Invalid type for 'metadata.k': expected a string, but got an integer",
    ),
    ({"metadata": {"k": "v" * 513}}, "metadata.k", "Invalid 'metadata.k': string too long."),
    ({"output_expires_after": 5}, "output_expires_after", "Invalid type for 'output_expires_after'"),
    ({"output_expires_after": {"seconds": 3600}}, "output_expires_after.anchor", "Invalid value for"),
    ({"output_expires_after": {"anchor": "created_at"}}, "output_expires_after.seconds", "Missing required"),
    (
        {"output_expires_after": {"anchor": "created_at", "seconds": 60}},
        "output_expires_after.seconds",
        "Invalid 'output_expires_after.seconds': integer below minimum value. Expected a value >= 3600, "
        "but got 60 instead.",
    ),
    (
        {"output_expires_after": {"anchor": "created_at", "seconds": 2592001}},
        "output_expires_after.seconds",
        "Invalid 'output_expires_after.seconds': integer above maximum value. Expected a value <= 2592000",
    ),
    (
        {"output_expires_after": {"anchor": "created_at", "seconds": True}},
        "output_expires_after.seconds",
        "Invalid",
    ),
]


@pytest.mark.parametrize(("fields", "param", "start"), CREATE_ERRORS)
def test_create_errors_name_the_param(fields: dict[str, Any], param: str, start: str) -> None:
    exc = create_error(create(**fields))
    assert exc.param == param
    assert exc.message.startswith(start), exc.message
    assert exc.code == "BAD_REQUEST"


def test_create_refuses_bodies_that_are_not_objects() -> None:
    assert create_error(b"").code == "INVALID_JSON"
    assert create_error(b"{").code == "INVALID_JSON"
    assert "JSON object" in create_error(b"[1]").message


def test_create_error_lists_supported_endpoints() -> None:
    exc = create_error(create(endpoint="/v1/images/edits"))
    assert all(f"'{e}'" in exc.message for e in b.BATCH_ENDPOINTS)


# -- POST /v1/files form fields -------------------------------------------------


def test_file_form() -> None:
    assert b.decode_file_form({"purpose": "user_data"}) == b.FileUpload(
        purpose="user_data", expires_after_s=0
    )
    assert b.decode_file_form({"purpose": "batch"}) == b.FileUpload(
        purpose="batch", expires_after_s=30 * 86400
    )
    got = b.decode_file_form(
        {"purpose": "batch", "expires_after[anchor]": "created_at", "expires_after[seconds]": "7200"}
    )
    assert got.expires_after_s == 7200


@pytest.mark.parametrize(
    ("form", "param"),
    [
        ({}, "purpose"),
        ({"purpose": "fine-tune"}, "purpose"),
        ({"purpose": "batch", "expires_after[seconds]": "7200"}, "expires_after.anchor"),
        ({"purpose": "batch", "expires_after[anchor]": "created_at"}, "expires_after.seconds"),
        (
            {"purpose": "batch", "expires_after[anchor]": "created_at", "expires_after[seconds]": "x"},
            "expires_after.seconds",
        ),
        (
            {"purpose": "batch", "expires_after[anchor]": "created_at", "expires_after[seconds]": "10"},
            "expires_after.seconds",
        ),
    ],
)
def test_file_form_errors(form: dict[str, str], param: str) -> None:
    with pytest.raises(DecodeError) as info:
        b.decode_file_form(form)
    assert info.value.param == param


# -- OpenAI encoders against the SDK's models -----------------------------------


def no_stray_keys(encoded: dict[str, Any], model: type[pydantic.BaseModel]) -> None:
    """The SDK models allow extra keys, so also check every key is one they declare."""
    assert set(encoded) <= set(model.model_fields), set(encoded) - set(model.model_fields)


def test_file_object_parses() -> None:
    rec = b.FileRecord(
        id="file-abc", bytes=42, created_at=100, filename="in.jsonl", purpose="batch", expires_at=200
    )
    encoded = b.encode_file(rec)
    got = ot.FileObject.model_validate(encoded)
    assert (got.id, got.bytes, got.created_at, got.filename) == ("file-abc", 42, 100, "in.jsonl")
    assert (got.object, got.purpose, got.status, got.expires_at) == ("file", "batch", "processed", 200)
    no_stray_keys(encoded, ot.FileObject)
    out = ot.FileObject.model_validate(b.encode_file(msgspec.structs.replace(rec, purpose="batch_output")))
    assert out.purpose == "batch_output" and out.expires_at == 200
    deleted = ot.FileDeleted.model_validate(b.encode_file_deleted("file-abc"))
    assert (deleted.id, deleted.deleted, deleted.object) == ("file-abc", True, "file")


TIMES = (
    "in_progress_at", "expires_at", "finalizing_at", "completed_at",
    "failed_at", "expired_at", "cancelling_at", "cancelled_at",
)  # fmt: skip


def test_batch_object_parses_with_every_field() -> None:
    rec = b.BatchRecord(
        id="batch_abc",
        endpoint=CHAT,
        input_file_id="file-in",
        status="completed",
        created_at=1,
        request_counts=b.BatchCounts(total=3, completed=2, failed=1),
        output_file_id="file-out",
        error_file_id="file-err",
        metadata={"k": "v"},
        model="qwen",
        usage=b.BatchUsage(input_tokens=10, output_tokens=5, cached_tokens=4, reasoning_tokens=2),
    )
    rec = msgspec.structs.replace(rec, **{name: i for i, name in enumerate(TIMES, start=2)})
    encoded = b.encode_batch(rec)
    no_stray_keys(encoded, ot.Batch)
    assert set(ot.Batch.model_fields) - set(encoded) == set()  # every field is sent, unset ones as null
    got = ot.Batch.model_validate(encoded)
    assert (got.id, got.object, got.status, got.endpoint, got.completion_window) == (
        "batch_abc", "batch", "completed", CHAT, "24h",
    )  # fmt: skip
    assert (got.input_file_id, got.output_file_id, got.error_file_id) == ("file-in", "file-out", "file-err")
    assert got.request_counts is not None
    assert (got.request_counts.total, got.request_counts.completed, got.request_counts.failed) == (3, 2, 1)
    assert [getattr(got, n) for n in TIMES] == list(range(2, 2 + len(TIMES)))
    assert got.metadata == {"k": "v"} and got.model == "qwen" and got.errors is None
    assert got.usage is not None and got.usage.total_tokens == 15
    assert got.usage.input_tokens_details.cached_tokens == 4
    assert got.usage.output_tokens_details.reasoning_tokens == 2


@pytest.mark.parametrize("status", get_args(b.BatchStatus))
def test_every_batch_status_parses(status: b.BatchStatus) -> None:
    rec = b.BatchRecord(id="batch_1", endpoint=CHAT, input_file_id="file-1", status=status, created_at=1)
    encoded = b.encode_batch(rec)
    got = ot.Batch.model_validate(encoded)
    assert got.status == status
    assert encoded["usage"] is None and encoded["errors"] is None and all(encoded[n] is None for n in TIMES)


def test_sdk_rejects_a_wrong_status() -> None:
    """Guards the round trips above: the SDK's models really validate."""
    encoded = b.encode_batch(
        b.BatchRecord(id="batch_1", endpoint=CHAT, input_file_id="f", status="failed", created_at=1)
    )
    with pytest.raises(pydantic.ValidationError):
        ot.Batch.model_validate({**encoded, "status": "done"})


def test_openai_list_page() -> None:
    rec = b.BatchRecord(id="batch_1", endpoint=CHAT, input_file_id="f", status="validating", created_at=1)
    items = [b.encode_batch(rec), b.encode_batch(msgspec.structs.replace(rec, id="batch_2"))]
    page = b.encode_openai_page(items, has_more=True)
    assert page["object"] == "list" and page["first_id"] == "batch_1" and page["last_id"] == "batch_2"
    parsed = SyncCursorPage[ot.Batch].model_validate(page)
    assert [x.id for x in parsed.data] == ["batch_1", "batch_2"] and parsed.has_more is True
    assert b.encode_openai_page([], has_more=False) == {
        "object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False,
    }  # fmt: skip


def test_output_line_carries_the_chat_completion() -> None:
    resp = ChatResponse(
        id="chatcmpl-1", model="m", created=5, text="hi", usage=Usage(prompt_tokens=3, completion_tokens=1)
    )
    body = msgspec.json.decode(openai_dialect.encode_chat_response(resp, model="m"))
    row = b.encode_output_line(
        id="batch_req_1", custom_id="a", status_code=200, body=body, request_id="req_1"
    )
    assert row == {
        "id": "batch_req_1",
        "custom_id": "a",
        "response": {"status_code": 200, "request_id": "req_1", "body": body},
        "error": None,
    }
    decoded = msgspec.json.decode(b.to_jsonl([row]))
    assert ChatCompletion.model_validate(decoded["response"]["body"]).choices[0].message.content == "hi"


def test_error_lines() -> None:
    never_ran = b.encode_error_line(
        id="batch_req_2", custom_id="b", code=b.EXPIRED_CODE, message=b.EXPIRED_MESSAGE
    )
    assert never_ran == {
        "id": "batch_req_2",
        "custom_id": "b",
        "response": None,
        "error": {"code": "batch_expired", "message": b.EXPIRED_MESSAGE},
    }
    body = msgspec.json.decode(openai_dialect.encode_error("MODEL_NOT_FOUND", "model 'x' is not installed"))
    refused = b.encode_error_line(
        id="batch_req_3", custom_id="c", code="model_not_found", message="model 'x' is not installed",
        status_code=404, body=body, request_id="req_3",
    )  # fmt: skip
    assert refused["response"] == {"status_code": 404, "request_id": "req_3", "body": body}
    assert refused["error"] == {"code": "model_not_found", "message": "model 'x' is not installed"}


def test_to_jsonl_writes_one_line_per_row() -> None:
    data = b.to_jsonl([{"a": 1}, {"b": "x\ny"}])
    assert data == b'{"a":1}\n{"b":"x\\ny"}\n'
    assert b.to_jsonl([]) == b""


# -- Anthropic ------------------------------------------------------------------


def mb_body(*requests: Any) -> bytes:
    return msgspec.json.encode({"requests": list(requests)})


def mb_req(custom_id: Any = "a", **params: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "params": {"model": "m", "max_tokens": 8, "messages": [], **params}}


def mb_error(body: bytes, **kw: Any) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        b.decode_message_batch_create(body, **kw)
    return info.value


def test_message_batch_create() -> None:
    got = b.decode_message_batch_create(mb_body(mb_req("a-1_B"), mb_req("x" * 64, stream=False)))
    assert [(r.index, r.custom_id, r.model) for r in got] == [(0, "a-1_B", "m"), (1, "x" * 64, "m")]
    assert got[0].params == {"model": "m", "max_tokens": 8, "messages": []}


MB_ERRORS: list[tuple[Any, str, str]] = [
    ({"custom_id": "a"}, "requests[1].params", "missing required field `requests[1].params`"),
    ({"params": {}}, "requests[1].custom_id", "missing required field `requests[1].custom_id`"),
    ("x", "requests[1]", "invalid field `requests[1]`: expected an object, got a string"),
    (mb_req(""), "requests[1].custom_id", "invalid field `requests[1].custom_id`: '' must be 1 to 64"),
    (mb_req("x" * 65), "requests[1].custom_id", "invalid field `requests[1].custom_id`: 'xxx"),
    (mb_req("a b"), "requests[1].custom_id", "invalid field `requests[1].custom_id`: 'a b' must be"),
    (mb_req(12), "requests[1].custom_id", "invalid field `requests[1].custom_id`: an integer must be"),
    (
        mb_req("first"),
        "requests[1].custom_id",
        "invalid field `requests[1].custom_id`: duplicate custom_id 'first' (first seen at requests[0])",
    ),
    (
        {"custom_id": "b", "params": []},
        "requests[1].params",
        "invalid field `requests[1].params`: expected an object",
    ),
    (
        {"custom_id": "b", "params": {}},
        "requests[1].params.model",
        "invalid field `requests[1].params.model`: expected",
    ),
    (
        {"custom_id": "b", "params": {"model": 1}},
        "requests[1].params.model",
        "invalid field `requests[1].params.model`",
    ),
    (mb_req("b", stream=True), "requests[1].params.stream", "invalid field `requests[1].params.stream`"),
]


@pytest.mark.parametrize(("bad", "param", "start"), MB_ERRORS)
def test_message_batch_errors_name_the_index(bad: Any, param: str, start: str) -> None:
    exc = mb_error(mb_body(mb_req("first"), bad, mb_req("last")))
    assert exc.param == param
    assert exc.message.startswith(start), exc.message


def test_message_batch_request_list_checks() -> None:
    assert mb_error(b"{}").param == "requests"
    assert (
        mb_error(b'{"requests": {}}').message == "invalid field `requests`: expected an array, got an object"
    )
    assert mb_error(mb_body()).message == "field `requests` is empty: send at least one request"
    assert len(b.decode_message_batch_create(mb_body(mb_req("a"), mb_req("b")), max_requests=2)) == 2
    exc = mb_error(mb_body(mb_req("a"), mb_req("b"), mb_req("c")), max_requests=2)
    assert exc.param == "requests" and "3 requests, more than the 2" in exc.message
    assert b.ANTHROPIC_MAX_REQUESTS == 100_000


def message_batch(**kw: Any) -> b.MessageBatchRecord:
    base: dict[str, Any] = {
        "id": "msgbatch_1",
        "processing_status": "in_progress",
        "created_at": 1724179044.1,
    }
    return b.MessageBatchRecord(**{**base, "expires_at": base["created_at"] + 86400, **kw})


def test_message_batch_object_parses() -> None:
    counts = b.MessageBatchCounts(processing=1, succeeded=2, errored=3, canceled=4, expired=5)
    encoded = b.encode_message_batch(message_batch(request_counts=counts), base_url="http://127.0.0.1:11435")
    no_stray_keys(encoded, am.MessageBatch)
    assert set(am.MessageBatch.model_fields) == set(encoded)
    got = am.MessageBatch.model_validate(encoded)
    assert (got.id, got.type, got.processing_status) == ("msgbatch_1", "message_batch", "in_progress")
    assert encoded["created_at"] == "2024-08-20T18:37:24.1Z"
    assert got.created_at.timestamp() == pytest.approx(1724179044.1)
    assert (got.expires_at - got.created_at).total_seconds() == pytest.approx(86400)
    assert got.results_url is None and got.ended_at is None and got.archived_at is None
    assert got.request_counts.model_dump() == msgspec.to_builtins(counts)


def test_ended_message_batch_has_results_url_and_stamps() -> None:
    rec = message_batch(processing_status="ended", ended_at=1724179100.0, cancel_initiated_at=1724179090.25)
    encoded = b.encode_message_batch(rec, base_url="http://127.0.0.1:11435/")
    got = am.MessageBatch.model_validate(encoded)
    assert got.results_url == "http://127.0.0.1:11435/v1/messages/batches/msgbatch_1/results"
    assert got.ended_at is not None and got.ended_at.timestamp() == 1724179100.0
    assert encoded["cancel_initiated_at"] == "2024-08-20T18:38:10.25Z"
    for status in ("in_progress", "canceling", "ended"):
        assert (
            am.MessageBatch.model_validate(
                b.encode_message_batch(message_batch(processing_status=status), base_url="http://h")
            ).processing_status
            == status
        )


def test_anthropic_list_page_and_deleted() -> None:
    items = [
        b.encode_message_batch(message_batch(id=i), base_url="http://h") for i in ("msgbatch_2", "msgbatch_1")
    ]
    page = b.encode_anthropic_page(items, has_more=False)
    parsed = SyncPage[am.MessageBatch].model_validate(page)
    assert [x.id for x in parsed.data] == ["msgbatch_2", "msgbatch_1"]
    assert (parsed.first_id, parsed.last_id, parsed.has_more) == ("msgbatch_2", "msgbatch_1", False)
    assert "object" not in page
    deleted = am.DeletedMessageBatch.model_validate(b.encode_message_batch_deleted("msgbatch_1"))
    assert (deleted.id, deleted.type) == ("msgbatch_1", "message_batch_deleted")


def test_result_lines_parse() -> None:
    request = ChatRequest(model="m", messages=[Message(role="user", content="hi")], max_tokens=8)
    resp = ChatResponse(
        id="msg_1", model="m", created=1, text="hello", usage=Usage(prompt_tokens=2, completion_tokens=1)
    )
    message = msgspec.json.decode(anthropic_dialect.encode_response(resp, request=request))
    ok = am.MessageBatchIndividualResponse.model_validate(
        b.encode_result_line("a", "succeeded", message=message)
    )
    assert ok.custom_id == "a" and ok.result.type == "succeeded"
    assert (
        isinstance(ok.result, am.MessageBatchSucceededResult) and ok.result.message.content[0].type == "text"
    )

    error = msgspec.json.decode(
        anthropic_dialect.encode_error("MODEL_NOT_FOUND", "model 'x' is not installed")
    )["error"]
    row = b.encode_result_line("b", "errored", error=error, request_id="req_9")
    bad = am.MessageBatchIndividualResponse.model_validate(row)
    assert isinstance(bad.result, am.MessageBatchErroredResult)
    assert bad.result.error.error.type == "not_found_error" and bad.result.error.request_id == "req_9"
    assert bad.result.error.error.message == "model 'x' is not installed"
    assert row["result"]["error"]["error"]["blazar_code"] == "MODEL_NOT_FOUND"

    kinds: tuple[b.ResultKind, ...] = ("canceled", "expired")
    for kind in kinds:
        row = b.encode_result_line("c", kind)
        assert row == {"custom_id": "c", "result": {"type": kind}}
        assert am.MessageBatchIndividualResponse.model_validate(row).result.type == kind


def test_result_line_needs_its_payload() -> None:
    with pytest.raises(ValueError, match="message"):
        b.encode_result_line("a", "succeeded")
    with pytest.raises(ValueError, match="error"):
        b.encode_result_line("a", "errored")


# -- counts and status ----------------------------------------------------------


def test_tally_and_counts() -> None:
    t = b.tally(["pending", "running", "running", "succeeded", "failed", "cancelled", "expired", "succeeded"])
    assert t == b.Tally(pending=1, running=2, succeeded=2, failed=1, cancelled=1, expired=1)
    assert (t.total, t.unfinished) == (8, 3)
    assert b.openai_counts(t) == b.BatchCounts(total=8, completed=2, failed=1)
    mc = b.anthropic_counts(t)
    assert mc == b.MessageBatchCounts(processing=3, succeeded=2, errored=1, canceled=1, expired=1)
    assert sum(msgspec.to_builtins(mc).values()) == t.total
    assert b.tally([]) == b.Tally()


def test_pending_fate() -> None:
    assert b.pending_fate(cancel_requested=False, expired=False) is None
    assert b.pending_fate(cancel_requested=True, expired=False) == "cancelled"
    assert b.pending_fate(cancel_requested=False, expired=True) == "expired"
    assert b.pending_fate(cancel_requested=True, expired=True) == "cancelled"


RUNNING = b.Tally(pending=2, running=1, succeeded=1)
DONE = b.Tally(succeeded=3, failed=1)


@pytest.mark.parametrize(
    ("t", "kw", "want"),
    [
        (RUNNING, {"validation": "pending"}, "validating"),
        (RUNNING, {"validation": "failed"}, "failed"),
        (b.Tally(pending=4), {"validation": "failed", "cancel_requested": True}, "failed"),
        (RUNNING, {}, "in_progress"),
        (DONE, {}, "finalizing"),
        (DONE, {"files_written": True}, "completed"),
        (RUNNING, {"cancel_requested": True}, "cancelling"),
        (b.Tally(pending=4), {"validation": "pending", "cancel_requested": True}, "cancelling"),
        (b.Tally(succeeded=1, cancelled=3), {"cancel_requested": True}, "cancelling"),
        (b.Tally(succeeded=1, cancelled=3), {"cancel_requested": True, "files_written": True}, "cancelled"),
        (b.Tally(running=1, expired=2), {"expired": True}, "in_progress"),
        (b.Tally(succeeded=1, expired=2), {"expired": True}, "finalizing"),
        (b.Tally(succeeded=1, expired=2), {"expired": True, "files_written": True}, "expired"),
        (
            b.Tally(succeeded=1, cancelled=2),
            {"expired": True, "cancel_requested": True, "files_written": True},
            "cancelled",
        ),
    ],
)
def test_openai_status(t: b.Tally, kw: dict[str, Any], want: str) -> None:
    assert b.openai_status(t, **kw) == want


def test_openai_status_walks_the_happy_path() -> None:
    steps: list[list[b.ItemState]] = [
        ["pending", "pending"],
        ["running", "pending"],
        ["succeeded", "running"],
        ["succeeded", "failed"],
    ]
    seen = [b.openai_status(b.tally(steps[0]), validation="pending")]
    seen += [b.openai_status(b.tally(states)) for states in steps]
    seen.append(b.openai_status(b.tally(steps[-1]), files_written=True))
    assert seen == ["validating", "in_progress", "in_progress", "in_progress", "finalizing", "completed"]


@pytest.mark.parametrize(
    ("t", "cancel", "want"),
    [
        (RUNNING, False, "in_progress"),
        (RUNNING, True, "canceling"),
        (DONE, False, "ended"),
        (b.Tally(succeeded=1, cancelled=3), True, "ended"),
        (b.Tally(expired=2), False, "ended"),
    ],
)
def test_anthropic_status(t: b.Tally, cancel: bool, want: str) -> None:
    assert b.anthropic_status(t, cancel_requested=cancel) == want


def test_anthropic_batch_is_ended_only_once_the_batch_itself_has_ended() -> None:
    done = b.Tally(succeeded=2)
    assert done.unfinished == 0
    # its last request answered, its results not written yet: still in progress
    assert b.anthropic_status(done, ended=False) == "in_progress"
    assert b.anthropic_status(done, cancel_requested=True, ended=False) == "canceling"
    assert b.anthropic_status(done, ended=True) == "ended"
