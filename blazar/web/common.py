"""Helpers shared by the gateway's route modules: bodies, errors, cleanups, JSON."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from quart import Response, request

from blazar.dialects.neutral import DecodeError
from blazar.dialects.ollama import parse_duration_s
from blazar.errors import BlazarError, Dialect, error_body, status_code_for
from blazar.web.cards import Card, StreamEnders

__all__ = [
    "JSON",
    "LOADING_NS",
    "NDJSON",
    "SSE_HEADERS",
    "Cleanup",
    "card",
    "dialect",
    "dialect_for",
    "error_response",
    "json_response",
    "keep_alive_header",
    "on_cleanup",
    "read_body",
    "set_model",
    "set_stream_enders",
    "stream_response",
]

JSON = "application/json"
LOADING_NS = 100_000_000
"""A request that waited longer than this for its engine is marked as loading
(``X-Blazar-Status: loading``, Ollama ``load_duration``)."""
NDJSON = "application/x-ndjson"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

Cleanup = Callable[[], Awaitable[None]]


def dialect_for(path: str, headers: Mapping[str, str]) -> Dialect:
    """Which error shape a request gets (DESIGN §7); ``headers`` has lower-case names."""
    if path.startswith("/v1/messages") or "anthropic-version" in headers:
        return Dialect.ANTHROPIC
    if path.startswith("/api/") and not path.startswith("/api/errors"):
        return Dialect.OLLAMA
    return Dialect.OPENAI


def dialect() -> Dialect:
    """The error shape of the current request."""
    return dialect_for(request.path, {k.lower(): v for k, v in request.headers.items()})


def error_response(code: str, message: str, *, retry_after_s: float | None = None) -> Response:
    status = status_code_for(code)
    request.scope["blazar.code"] = code  # type: ignore[typeddict-unknown-key]
    resp = Response(msgspec.json.encode(error_body(dialect(), code, message)), status, content_type=JSON)
    if retry_after_s is not None:
        resp.headers["Retry-After"] = str(max(1, round(retry_after_s)))
    return resp


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = obj if isinstance(obj, bytes) else msgspec.json.encode(obj)
    return Response(body, status, headers=headers, content_type=JSON)


def stream_response(body: Any, *, content_type: str, headers: dict[str, str] | None = None) -> Response:
    """A streamed response that no framework timeout may cut."""
    resp = Response(
        body, 200, headers={**(headers or {}), "Content-Type": content_type, "Cache-Control": "no-cache"}
    )
    resp.timeout = None
    return resp


async def read_body() -> bytes:
    """The request body, size-limited while it is read (chunked bodies too)."""
    max_body: int = request.scope["blazar.max_body"]  # type: ignore[typeddict-item]
    declared = request.content_length
    if declared is not None and declared > max_body:
        raise BlazarError("PAYLOAD_TOO_LARGE", f"body of {declared} bytes exceeds {max_body} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.body:
        size += len(chunk)
        if size > max_body:
            raise BlazarError("PAYLOAD_TOO_LARGE", f"body exceeds {max_body} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def on_cleanup(fn: Cleanup) -> None:
    """Run ``fn`` (shielded) when the server is done with this request, however it ends."""
    request.scope["blazar.cleanups"].append(fn)  # type: ignore[typeddict-item]


def set_model(name: str) -> None:
    """Name the model in the request's ledger record and live card."""
    request.scope["blazar.model"] = name  # type: ignore[typeddict-unknown-key]
    if (c := card()) is not None:
        c.model = name


def keep_alive_header(value: str) -> float | None:
    """``X-Blazar-Keep-Alive``: seconds or a duration like ``5m``; negative keeps loaded."""
    try:
        return parse_duration_s(value)
    except DecodeError as exc:
        raise BlazarError("BAD_REQUEST", f"X-Blazar-Keep-Alive: {exc.message}") from exc


def card() -> Card | None:
    """The live card of the current inference request, if it has one."""
    return request.scope.get("blazar.card")  # type: ignore[return-value]


def set_stream_enders(cancelled: Callable[[], bytes], interrupted: Callable[[], bytes]) -> None:
    """How this request's stream ends when cancelled or interrupted from another connection."""
    if (c := card()) is not None:
        c.enders = StreamEnders(cancelled=cancelled, interrupted=interrupted)
