"""The wire layer of batch jobs: OpenAI Files + Batches and Anthropic Message Batches.

Sans-io: input files and request bodies are validated into neutral Structs, and a
jobs store's records are rendered into the objects the official SDKs parse. A batch's
status is decided from facts by pure functions (``tally``, ``*_counts``, ``*_status``).
Each request's own body is validated only when it runs, by its route's decoder; a
failure becomes a line of the error file (OpenAI) or an ``errored`` result (Anthropic).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, get_args

import msgspec

from blazar.dialects._wire import decode_json
from blazar.dialects.neutral import DecodeError
from blazar.dialects.ollama_time import rfc3339

__all__ = [
    "ANTHROPIC_MAX_REQUESTS", "BATCH_ENDPOINTS", "BATCH_FILE_TTL_S", "CANCELLED_CODE", "CANCELLED_MESSAGE",
    "EXPIRED_CODE", "EXPIRED_MESSAGE", "OPENAI_MAX_LINES", "BatchCounts", "BatchCreate", "BatchEndpoint",
    "BatchErrorEntry", "BatchFileError", "BatchLine", "BatchRecord", "BatchStatus", "BatchUsage",
    "FileRecord", "FileUpload", "ItemState", "MessageBatchCounts", "MessageBatchRecord",
    "MessageBatchRequest", "ProcessingStatus", "ResultKind", "Tally", "anthropic_counts",
    "anthropic_status", "check_batch_endpoint", "decode_batch_create",
    "decode_file_form", "decode_message_batch_create", "encode_anthropic_page",
    "encode_batch", "encode_error_line", "encode_file", "encode_file_deleted", "encode_message_batch",
    "encode_message_batch_deleted", "encode_openai_page", "encode_output_line", "encode_result_line",
    "file_error_entry", "openai_counts", "openai_status", "pending_fate", "tally", "to_jsonl",
    "validate_batch_jsonl",
]  # fmt: skip

BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
BATCH_ENDPOINTS: tuple[str, ...] = get_args(BatchEndpoint)
BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
ProcessingStatus = Literal["in_progress", "canceling", "ended"]
ItemState = Literal["pending", "running", "succeeded", "failed", "cancelled", "expired"]
ResultKind = Literal["succeeded", "errored", "canceled", "expired"]
FilePurpose = Literal["batch", "batch_output", "user_data"]

OPENAI_MAX_LINES = 50_000
"""OpenAI's limit on the requests of one batch input file."""
ANTHROPIC_MAX_REQUESTS = 100_000
BATCH_FILE_TTL_S = 30 * 24 * 3600
"""How long an uploaded batch file lives without ``expires_after`` (OpenAI's default)."""
EXPIRED_CODE = "batch_expired"
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
CANCELLED_CODE = "batch_cancelled"
CANCELLED_MESSAGE = "This request was not executed because the batch was cancelled."

_METADATA_KEYS, _METADATA_KEY_CHARS, _METADATA_VALUE_CHARS = 16, 64, 512
_EXPIRES_MIN_S, _EXPIRES_MAX_S = 3600, 30 * 24 * 3600
_CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


# -- neutral types -------------------------------------------------------------


class BatchFileError(DecodeError):
    """A batch input file that cannot run: ``line`` is 1-based (None for the whole file),
    ``param`` the field within it, ``reason`` a snake_case code for the ``errors`` of the
    failed batch."""

    def __init__(
        self, message: str, *, reason: str, line: int | None = None, param: str | None = None, code: str = ""
    ) -> None:
        super().__init__(message, code=code or "BATCH_FILE_INVALID", param=param)
        self.reason = reason
        self.line = line


class BatchLine(msgspec.Struct, frozen=True, kw_only=True):
    """One request of an OpenAI batch input file (``line`` is its 1-based number)."""

    line: int
    custom_id: str
    url: str
    body: dict[str, Any]
    model: str
    method: str = "POST"


class BatchCreate(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/batches``; ``output_expires_after_s`` counts from each output file's creation."""

    input_file_id: str
    endpoint: BatchEndpoint
    completion_window: Literal["24h"] = "24h"
    metadata: dict[str, str] | None = None
    output_expires_after_s: int | None = None


class FileUpload(msgspec.Struct, frozen=True, kw_only=True):
    """The text fields of ``POST /v1/files`` (the file part is the route's to read)."""

    purpose: FilePurpose
    expires_after_s: int = BATCH_FILE_TTL_S


class FileRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    expires_at: int | None = None


class BatchCounts(msgspec.Struct, frozen=True, kw_only=True):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchErrorEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a batch's ``errors``: why its input file failed validation, or (``disk_full``)
    why a running batch is paused for now."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None


class BatchUsage(msgspec.Struct, frozen=True, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


class BatchRecord(msgspec.Struct, frozen=True, kw_only=True):
    """An OpenAI batch as the jobs store keeps it; timestamps are Unix seconds."""

    id: str
    endpoint: str
    input_file_id: str
    status: BatchStatus
    created_at: int
    completion_window: str = "24h"
    request_counts: BatchCounts = BatchCounts()
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[BatchErrorEntry] = []
    metadata: dict[str, str] | None = None
    model: str | None = None
    usage: BatchUsage | None = None
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None


class MessageBatchRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One request of ``POST /v1/messages/batches`` (``index`` is its place in ``requests``)."""

    index: int
    custom_id: str
    params: dict[str, Any]
    model: str


class MessageBatchCounts(msgspec.Struct, frozen=True, kw_only=True):
    processing: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


class MessageBatchRecord(msgspec.Struct, frozen=True, kw_only=True):
    """An Anthropic message batch as the jobs store keeps it; timestamps are ``time.time()``
    values (the wire gets RFC 3339)."""

    id: str
    processing_status: ProcessingStatus
    created_at: float
    expires_at: float
    request_counts: MessageBatchCounts = MessageBatchCounts()
    ended_at: float | None = None
    cancel_initiated_at: float | None = None
    archived_at: float | None = None


class Tally(msgspec.Struct, frozen=True, kw_only=True):
    """How many items of a batch are in each ``ItemState``."""

    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0

    @property
    def total(self) -> int:
        return self.pending + self.running + self.succeeded + self.failed + self.cancelled + self.expired

    @property
    def unfinished(self) -> int:
        return self.pending + self.running


# -- shared helpers ------------------------------------------------------------

_KINDS = (
    (bool, "a boolean"), (int, "an integer"), (float, "a decimal"),
    (str, "a string"), (list, "an array"), (dict, "an object"),
)  # fmt: skip


def _kind(value: Any) -> str:
    """A JSON value's type in OpenAI's words (``an integer``, ``a string``)."""
    return next((name for t, name in _KINDS if isinstance(value, t)), "null")


def _bad_type(param: str, expected: str, value: Any) -> DecodeError:
    text = f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead."
    return DecodeError(text, param=param)


def _bad_value(param: str, value: Any, allowed: Iterable[str], advice: str = "") -> DecodeError:
    listed, tail = ", ".join(f"'{v}'" for v in allowed), f" — {advice}" if advice else ""
    text = f"Invalid value for '{param}': {value!r}. Supported values are: {listed}.{tail}"
    return DecodeError(text, param=param)


def _missing(param: str) -> DecodeError:
    return DecodeError(f"Missing required parameter: '{param}'.", param=param)


def _int_in_range(value: Any, param: str, low: int, high: int) -> int:
    """``value`` if it is an integer in ``[low, high]``, refused in OpenAI's wording if not."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad_type(param, "an integer", value)
    if value < low or value > high:
        side, limit = ("below minimum", f">= {low}") if value < low else ("above maximum", f"<= {high}")
        text = f"Invalid '{param}': integer {side} value. Expected a value {limit}, but got {value} instead."
        raise DecodeError(text, param=param)
    return value


# -- OpenAI: batch input files -------------------------------------------------

_LINE_FIELDS: tuple[tuple[str, type, str, str], ...] = (
    ("custom_id", str, "a string", "give each request a unique string custom_id"),
    ("method", str, '"POST"', 'batch requests are always "POST"'),
    ("url", str, "a string", f"use one of {', '.join(BATCH_ENDPOINTS)}"),
    ("body", dict, "an object", "put the request's JSON body under `body`"),
)
_MODEL_FIX = "name an installed model (see `blazar list`)"


def _line_error(n: int, reason: str, what: str, fix: str, param: str | None = None) -> BatchFileError:
    return BatchFileError(f"line {n}: {what} — {fix}", reason=reason, line=n, param=param)


def _decode_line(n: int, raw: bytes) -> BatchLine:
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        fix = "write one JSON object per line"
        raise _line_error(n, "invalid_json_line", f"not valid JSON ({exc})", fix) from exc
    if not isinstance(obj, dict):
        what = f"expected a JSON object, got {_kind(obj)}"
        raise _line_error(n, "invalid_json_line", what, "write one request object per line")
    for name, kind, expected, fix in _LINE_FIELDS:
        if name not in obj:
            raise _line_error(n, f"missing_{name}", f"missing `{name}`", fix, name)
        if not isinstance(obj[name], kind):
            what = f"`{name}` must be {expected}, got {_kind(obj[name])}"
            raise _line_error(n, f"invalid_{name}", what, fix, name)
    custom_id, method, url, body = obj["custom_id"], obj["method"], obj["url"], obj["body"]
    if not custom_id:
        raise _line_error(n, "invalid_custom_id", "`custom_id` is empty", _LINE_FIELDS[0][3], "custom_id")
    if method != "POST":
        what = f"method {method!r} is not supported"
        raise _line_error(n, "invalid_method", what, _LINE_FIELDS[1][3], "method")
    if url not in BATCH_ENDPOINTS:
        raise _line_error(n, "invalid_url", f"url {url!r} is not supported", _LINE_FIELDS[2][3], "url")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        if "model" not in body:
            what = "missing `body.model`"
        elif isinstance(model, str):
            what = "`body.model` is empty"
        else:
            what = f"`body.model` must be a string, got {_kind(model)}"
        raise _line_error(n, "invalid_model", what, _MODEL_FIX, "body.model")
    return BatchLine(line=n, custom_id=custom_id, url=url, body=body, model=model, method=method)


def validate_batch_jsonl(data: bytes, *, max_lines: int = OPENAI_MAX_LINES) -> list[BatchLine]:
    """The requests of an OpenAI batch input file, or a ``BatchFileError`` (code
    ``BATCH_FILE_INVALID``) naming the first bad line and what to do.

    One JSON object per line (``\\n`` or ``\\r\\n``); blank lines may end the file but not
    separate requests. ``custom_id`` is unique and every line uses the same ``url``.
    """
    rows = data.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    while rows and not rows[-1].strip():
        rows.pop()
    if not rows:
        raise BatchFileError("the file has no requests — write one request per line", reason="empty_file")
    if len(rows) > max_lines:
        raise BatchFileError(
            f"the file has {len(rows)} requests, more than the {max_lines} one batch takes — "
            "split it into several batches",
            reason="too_many_requests",
            line=max_lines + 1,
        )
    lines: list[BatchLine] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(rows, start=1):
        if not raw.strip():
            raise _line_error(n, "blank_line", "blank line", "remove blank lines between requests")
        item = _decode_line(n, raw)
        if (first := seen.setdefault(item.custom_id, n)) != n:
            what = f"duplicate custom_id {item.custom_id!r} (first seen on line {first})"
            fix = "each request needs a unique custom_id"
            raise _line_error(n, "duplicate_custom_id", what, fix, "custom_id")
        if lines and item.url != lines[0].url:
            what = f"url {item.url!r} differs from {lines[0].url!r} on line {lines[0].line}"
            fix = "every request in one batch file must use the same url"
            raise _line_error(n, "mismatched_url", what, fix, "url")
        lines.append(item)
    return lines


def check_batch_endpoint(lines: Sequence[BatchLine], endpoint: str) -> None:
    """Refuse (code ``BATCH_ENDPOINT_MISMATCH``) a file whose requests do not target the
    batch's ``endpoint``, naming the first such line."""
    for item in lines:
        if item.url != endpoint:
            raise BatchFileError(
                f"line {item.line}: url {item.url!r} does not match the batch's endpoint {endpoint!r} — "
                f"create the batch with endpoint {item.url!r}, or upload a file of {endpoint!r} requests",
                reason="mismatched_endpoint",
                line=item.line,
                param="url",
                code="BATCH_ENDPOINT_MISMATCH",
            )


def file_error_entry(exc: BatchFileError) -> BatchErrorEntry:
    """The ``errors`` entry of a batch whose input file failed validation."""
    return BatchErrorEntry(code=exc.reason, message=exc.message, line=exc.line, param=exc.param)


# -- OpenAI: request bodies and forms ------------------------------------------


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad_type("metadata", "an object", value)
    if len(value) > _METADATA_KEYS:
        text = f"Invalid 'metadata': too many properties. Expected an object with at most {_METADATA_KEYS} "
        text += f"properties, but got an object with {len(value)} properties instead."
        raise DecodeError(text, param="metadata")
    for key, item in value.items():
        param = f"metadata.{key}"
        if len(key) > _METADATA_KEY_CHARS:
            text = f"Invalid 'metadata': key {key[:16]!r}… has {len(key)} characters, more than "
            raise DecodeError(f"{text}{_METADATA_KEY_CHARS} — shorten the key", param="metadata")
        if not isinstance(item, str):
            raise _bad_type(param, "a string", item)
        if len(item) > _METADATA_VALUE_CHARS:
            text = f"Invalid '{param}': string too long. Expected a string with maximum length "
            text += f"{_METADATA_VALUE_CHARS}, but got a string with length {len(item)} instead."
            raise DecodeError(text, param=param)
    return value


def _expires_after(value: Any, param: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad_type(param, "an object", value)
    if value.get("anchor") != "created_at":
        raise _bad_value(f"{param}.anchor", value.get("anchor"), ["created_at"])
    if "seconds" not in value:
        raise _missing(f"{param}.seconds")
    return _int_in_range(value["seconds"], f"{param}.seconds", _EXPIRES_MIN_S, _EXPIRES_MAX_S)


def decode_batch_create(body: bytes) -> BatchCreate:
    """``POST /v1/batches``; errors carry ``param`` and OpenAI's wording."""
    raw = decode_json(body, dict[str, Any])
    for name in ("input_file_id", "endpoint", "completion_window"):
        if name not in raw:
            raise _missing(name)
        if not isinstance(raw[name], str):
            raise _bad_type(name, "a string", raw[name])
    if not raw["input_file_id"].strip():
        advice = "pass the id of a file uploaded with purpose 'batch'"
        raise DecodeError(f"Invalid 'input_file_id': empty string — {advice}", param="input_file_id")
    endpoint = raw["endpoint"]
    if endpoint not in BATCH_ENDPOINTS:
        raise _bad_value("endpoint", endpoint, BATCH_ENDPOINTS, "Blazar runs batches for these endpoints")
    if raw["completion_window"] != "24h":
        raise _bad_value("completion_window", raw["completion_window"], ["24h"])
    return BatchCreate(
        input_file_id=raw["input_file_id"],
        endpoint=endpoint,
        metadata=_metadata(raw.get("metadata")),
        output_expires_after_s=_expires_after(raw.get("output_expires_after"), "output_expires_after"),
    )


def decode_file_form(form: Mapping[str, str]) -> FileUpload:
    """The text fields of a ``POST /v1/files`` multipart form: ``purpose``, and
    ``expires_after[anchor]`` / ``expires_after[seconds]`` as the SDK flattens them."""
    purpose = form.get("purpose")
    if purpose is None:
        raise _missing("purpose")
    kind: FilePurpose
    if purpose == "batch":
        kind = "batch"
    elif purpose == "user_data":
        kind = "user_data"
    else:
        raise _bad_value(
            "purpose", purpose, ["batch", "user_data"], "Blazar keeps files for batches and user data"
        )
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return FileUpload(purpose=kind, expires_after_s=BATCH_FILE_TTL_S if kind == "batch" else 0)
    try:
        seconds_n = int(seconds or "")
    except ValueError:
        raise _bad_type("expires_after.seconds", "an integer", seconds) from None
    ttl = _expires_after({"anchor": anchor, "seconds": seconds_n}, "expires_after")
    return FileUpload(purpose=kind, expires_after_s=ttl or BATCH_FILE_TTL_S)


# -- list pages and JSON Lines ------------------------------------------------


def _ends(data: Sequence[Mapping[str, Any]]) -> tuple[str | None, str | None]:
    return (data[0]["id"], data[-1]["id"]) if data else (None, None)


def encode_openai_page(data: Sequence[Mapping[str, Any]], *, has_more: bool) -> dict[str, Any]:
    first, last = _ends(data)
    return {"object": "list", "data": list(data), "first_id": first, "last_id": last, "has_more": has_more}


def encode_anthropic_page(data: Sequence[Mapping[str, Any]], *, has_more: bool) -> dict[str, Any]:
    first, last = _ends(data)
    return {"data": list(data), "has_more": has_more, "first_id": first, "last_id": last}


# -- OpenAI: encoders ----------------------------------------------------------


def encode_file(rec: FileRecord) -> dict[str, Any]:
    """The ``File`` object (``status`` is always ``processed``: validation happens when a
    batch is created from the file)."""
    return {"id": rec.id, "object": "file", **msgspec.to_builtins(rec), "status": "processed"}


def encode_file_deleted(file_id: str) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "deleted": True}


def encode_batch(rec: BatchRecord) -> dict[str, Any]:
    """The ``Batch`` object; every field is present, unset ones as null."""
    errors = None
    if rec.errors:
        errors = {"object": "list", "data": [msgspec.to_builtins(e) for e in rec.errors]}
    usage = None
    if (u := rec.usage) is not None:
        usage = {
            "input_tokens": u.input_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.output_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.input_tokens + u.output_tokens,
        }
    wire = {"id": rec.id, "object": "batch", **msgspec.to_builtins(rec)}
    return wire | {"errors": errors, "usage": usage}


def encode_output_line(
    *, id: str, custom_id: str, status_code: int, body: Any, request_id: str | None = None
) -> dict[str, Any]:
    """A line of the output file: a request that ran (``id`` is ``batch_req_…``)."""
    response = {"status_code": status_code, "request_id": request_id, "body": body}
    return {"id": id, "custom_id": custom_id, "response": response, "error": None}


def encode_error_line(
    *,
    id: str,
    custom_id: str,
    code: str,
    message: str,
    status_code: int | None = None,
    body: Any = None,
    request_id: str | None = None,
) -> dict[str, Any]:
    """A line of the error file: with ``status_code`` for a request that ran and was
    refused, without for one that never ran (``EXPIRED_CODE``, ``CANCELLED_CODE``)."""
    response = None
    if status_code is not None:
        response = {"status_code": status_code, "request_id": request_id, "body": body}
    error = {"code": code, "message": message}
    return {"id": id, "custom_id": custom_id, "response": response, "error": error}


def to_jsonl(rows: Iterable[Any]) -> bytes:
    """JSON Lines: one compact JSON document per line, each ending in ``\\n``."""
    return b"".join(msgspec.json.encode(row) + b"\n" for row in rows)


# -- Anthropic -----------------------------------------------------------------


def _request(i: int, item: Any, seen: dict[str, int]) -> MessageBatchRequest:
    at = f"requests[{i}]"
    if not isinstance(item, dict):
        raise DecodeError(f"invalid field `{at}`: expected an object, got {_kind(item)}", param=at)
    for name in ("custom_id", "params"):
        if name not in item:
            raise DecodeError(f"missing required field `{at}.{name}`", param=f"{at}.{name}")
    custom_id, params = item["custom_id"], item["params"]
    param = f"{at}.custom_id"
    if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
        shown = repr(custom_id) if isinstance(custom_id, str) else _kind(custom_id)
        rule = "1 to 64 characters of letters, digits, '_' or '-'"
        raise DecodeError(f"invalid field `{param}`: {shown} must be {rule}", param=param)
    if (first := seen.setdefault(custom_id, i)) != i:
        raise DecodeError(
            f"invalid field `{param}`: duplicate custom_id {custom_id!r} (first seen at "
            f"requests[{first}]) — each request needs a unique custom_id",
            param=param,
        )
    if not isinstance(params, dict):
        text = f"invalid field `{at}.params`: expected an object, got {_kind(params)}"
        raise DecodeError(text, param=f"{at}.params")
    model = params.get("model")
    if not isinstance(model, str) or not model.strip():
        got = _kind(model) if "model" in params else "nothing"
        text = f"invalid field `{at}.params.model`: expected a model name, got {got} — {_MODEL_FIX}"
        raise DecodeError(text, param=f"{at}.params.model")
    if params.get("stream") not in (None, False):
        text = f"invalid field `{at}.params.stream`: batch requests cannot stream — remove `stream`"
        raise DecodeError(text, param=f"{at}.params.stream")
    return MessageBatchRequest(index=i, custom_id=custom_id, params=params, model=model)


def decode_message_batch_create(
    body: bytes, *, max_requests: int = ANTHROPIC_MAX_REQUESTS
) -> list[MessageBatchRequest]:
    """``POST /v1/messages/batches``; errors name ``requests[i]…`` in message and ``param``.

    Each ``params`` is checked only for a ``model`` and no streaming: as at Anthropic, the
    rest is validated when the request runs, and a failure becomes its ``errored`` result."""
    raw = decode_json(body, dict[str, Any])
    if "requests" not in raw:
        raise DecodeError("missing required field `requests`", param="requests")
    requests = raw["requests"]
    if not isinstance(requests, list):
        text = f"invalid field `requests`: expected an array, got {_kind(requests)}"
        raise DecodeError(text, param="requests")
    if not requests:
        raise DecodeError("field `requests` is empty: send at least one request", param="requests")
    if len(requests) > max_requests:
        raise DecodeError(
            f"field `requests` has {len(requests)} requests, more than the {max_requests} one batch "
            "takes — split them into several batches",
            param="requests",
        )
    seen: dict[str, int] = {}
    return [_request(i, item, seen) for i, item in enumerate(requests)]


def encode_message_batch(rec: MessageBatchRecord, *, base_url: str) -> dict[str, Any]:
    """The ``MessageBatch`` object. ``results_url`` lies under ``base_url`` (the address the
    caller reached) and is set only once processing has ended, as the SDK's ``results()``
    expects."""
    results_url = None
    if rec.processing_status == "ended":
        results_url = f"{base_url.rstrip('/')}/v1/messages/batches/{rec.id}/results"
    wire = {"id": rec.id, "type": "message_batch", **msgspec.to_builtins(rec), "results_url": results_url}
    for name in ("created_at", "expires_at", "ended_at", "cancel_initiated_at", "archived_at"):
        wire[name] = None if wire[name] is None else rfc3339(wire[name])
    return wire


def encode_message_batch_deleted(batch_id: str) -> dict[str, Any]:
    return {"id": batch_id, "type": "message_batch_deleted"}


def encode_result_line(
    custom_id: str,
    kind: ResultKind,
    *,
    message: Mapping[str, Any] | None = None,
    error: Mapping[str, Any] | None = None,
    request_id: str | None = None,
) -> dict[str, Any]:
    """A line of a message batch's results. ``message`` is the Messages API response of a
    ``succeeded`` request; ``error`` the error object of an ``errored`` one
    (``{"type": "invalid_request_error", "message": …}``; extra keys such as
    ``blazar_code`` are kept)."""
    result: dict[str, Any] = {"type": kind}
    if (kind == "succeeded" and message is None) or (kind == "errored" and error is None):
        raise ValueError(f"a {kind} result needs its {'message' if kind == 'succeeded' else 'error'}")
    if message is not None and kind == "succeeded":
        result["message"] = dict(message)
    elif error is not None and kind == "errored":
        result["error"] = {"type": "error", "error": dict(error)}
        if request_id is not None:
            result["error"]["request_id"] = request_id
    return {"custom_id": custom_id, "result": result}


# -- item states and batch status ----------------------------------------------


def tally(states: Iterable[ItemState]) -> Tally:
    return Tally(**Counter[str](states))


def openai_counts(t: Tally) -> BatchCounts:
    """OpenAI's ``request_counts``: ``completed`` ran and succeeded, ``failed`` ran and
    failed; requests cancelled or expired before they ran count in ``total`` only."""
    return BatchCounts(total=t.total, completed=t.succeeded, failed=t.failed)


def anthropic_counts(t: Tally) -> MessageBatchCounts:
    """Anthropic's ``request_counts``, which always sum to the number of requests."""
    return MessageBatchCounts(
        processing=t.unfinished,
        succeeded=t.succeeded,
        errored=t.failed,
        canceled=t.cancelled,
        expired=t.expired,
    )


def pending_fate(*, cancel_requested: bool, expired: bool) -> ItemState | None:
    """What a request that has not started becomes: ``cancelled`` once the batch is being
    cancelled, ``expired`` once its window has passed, else None (it stays pending)."""
    if cancel_requested:
        return "cancelled"
    return "expired" if expired else None


def openai_status(
    t: Tally,
    *,
    validation: Literal["pending", "passed", "failed"] = "passed",
    cancel_requested: bool = False,
    expired: bool = False,
    files_written: bool = False,
) -> BatchStatus:
    """A batch's status from the facts: whether its input file validated, whether a cancel
    was asked for or the window passed, how many requests are unfinished (``t``), and
    whether the output and error files are written.

    validating → in_progress → finalizing → completed; the other ends are failed (bad
    input file), cancelling → cancelled, and expired (window passed, files written)."""
    if validation == "failed":
        return "failed"
    settled = t.unfinished == 0 and files_written
    if cancel_requested:
        return "cancelled" if settled else "cancelling"
    if validation == "pending":
        return "validating"
    if expired and settled:
        return "expired"
    if t.unfinished:
        return "in_progress"
    return "completed" if files_written else "finalizing"


def anthropic_status(t: Tally, *, cancel_requested: bool = False, ended: bool = True) -> ProcessingStatus:
    """``ended`` once no request is unfinished and the batch itself has ended (``ended``: its
    results are written and ``ended_at`` is set; between its last request and that it is still
    in progress), else ``canceling`` after a cancel, else ``in_progress``."""
    if t.unfinished == 0 and ended:
        return "ended"
    return "canceling" if cancel_requested else "in_progress"
