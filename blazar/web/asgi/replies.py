"""Helpers shared by the gateway's route modules: bodies, errors, cleanups, JSON.

Quart is imported by the helpers for the framework's routes only, when they run: the
gateway's own routes use these helpers before Quart is imported (``blazar.web.front``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

import msgspec

from actors.runtime import Runtime
from blazar.dialects.neutral import DecodeError
from blazar.dialects.ollama_time import parse_duration_s
from blazar.errors import BlazarError, error_body, status_code_for
from blazar.errors.describe import ErrorReply, describe_error
from blazar.serve.reply import JSON, LOADING_NS, dialect_for, stream_reply
from blazar.web.asgi.call import Call, Cleanup, Reply, current

if TYPE_CHECKING:
    from quart import Response

__all__ = [
    "AUTH_KEY",
    "CARDS_KEY",
    "JSON",
    "LOADING_NS",
    "NDJSON",
    "RUNTIME_KEY",
    "Cleanup",
    "app_runtime",
    "dialect_for",
    "error_reply",
    "error_response",
    "exception_reply",
    "json_reply",
    "json_response",
    "keep_alive_header",
    "on_cleanup",
    "read_body",
    "response_of",
    "set_model",
    "stream_reply",
    "stream_response",
]

log = logging.getLogger("blazar.web")

NDJSON = "application/x-ndjson"
RUNTIME_KEY = "blazar.runtime"
"""Where ``create_app`` keeps the runtime among the app's extensions."""
CARDS_KEY = "blazar.cards"
"""…and the live and recently finished request cards."""
AUTH_KEY = "blazar.auth"
"""…and the gateway's key step (``Auth``), for the routes that report on keys."""


def error_reply(
    call: Call, code: str, message: str, *, retry_after_s: float | None = None, param: str | None = None
) -> Reply:
    """The error answer in the caller's dialect; the code goes into the ledger."""
    err = ErrorReply(
        status=status_code_for(code), code=code, message=message, retry_after_s=retry_after_s, param=param
    )
    return _reply_of(call, err)


def _reply_of(call: Call, err: ErrorReply) -> Reply:
    call.code, call.error = err.code, err.message
    dialect = dialect_for(call.path, call.headers)
    body = msgspec.json.encode(error_body(dialect, err.code, err.message, param=err.param))
    retry_after = err.retry_after
    return Reply(body, err.status, headers={"Retry-After": retry_after} if retry_after is not None else None)


def exception_reply(call: Call, exc: Exception) -> Reply:
    """The answer to an exception raised by any route, framework or gateway: ours carry
    their code; anything else is a bug, logged and answered 500 ``INTERNAL``."""
    described = describe_error(exc, dialect_for(call.path, call.headers))
    if described is None:
        log.error("unhandled error in %s %s (%s)", call.method, call.path, call.trace_id, exc_info=exc)
        message = f"internal error ({type(exc).__name__}); trace id {call.trace_id}"
        described = ErrorReply(status=status_code_for("INTERNAL"), code="INTERNAL", message=message)
    return _reply_of(call, described)


def response_of(reply: Reply) -> Response:
    """A whole-body ``Reply`` as the framework's response."""
    from quart import Response

    assert isinstance(reply.body, bytes)
    headers = dict(reply.headers or {})
    return Response(reply.body, reply.status, headers=headers, content_type=reply.content_type)


def error_response(code: str, message: str, *, retry_after_s: float | None = None) -> Response:
    return response_of(error_reply(current(), code, message, retry_after_s=retry_after_s))


def json_reply(obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    """A JSON answer of one of the gateway's own routes (``obj`` may be encoded already)."""
    return Reply(obj if isinstance(obj, bytes) else msgspec.json.encode(obj), status, headers=headers)


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    from quart import Response

    body = obj if isinstance(obj, bytes) else msgspec.json.encode(obj)
    return Response(body, status, headers=headers, content_type=JSON)


def stream_response(body: Any, *, content_type: str, headers: dict[str, str] | None = None) -> Response:
    """``stream_reply`` as the framework's response, which no framework timeout may cut: one
    helper decides a stream's headers (without X-Accel-Buffering, a buffering proxy held back
    the events of a job's or a background response's stream)."""
    from quart import Response

    reply = stream_reply(body, content_type=content_type, headers=headers)
    resp = Response(body, reply.status, headers={**(reply.headers or {}), "Content-Type": content_type})
    resp.timeout = None
    return resp


async def read_body() -> bytes:
    """The request body (of a framework route), size-limited while it is read (chunked bodies too)."""
    from quart import request

    call = current()
    if (declared := request.content_length) is not None:
        call.check_length(declared)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.body:
        size += len(chunk)
        call.check_length(size)
        chunks.append(chunk)
    return b"".join(chunks)


def app_runtime() -> Runtime:
    """The runtime behind the app serving this request: framework routes are module-level
    functions and reach it through the app context rather than closing over it."""
    from quart import current_app

    return cast(Runtime, current_app.extensions[RUNTIME_KEY])


def on_cleanup(fn: Cleanup) -> None:
    """Run ``fn`` (shielded) when the server is done with this request, however it ends."""
    current().on_cleanup(fn)


def set_model(name: str) -> None:
    """Name the model in the request's ledger record and live card."""
    current().set_model(name)


def requested_lane(headers: Mapping[str, str]) -> str | None:
    """The lane a request asks for (``x-blazar-engine``), which the model's ``lanes`` must allow."""
    return headers.get("x-blazar-engine") or None


def keep_alive_header(value: str) -> float | None:
    """``X-Blazar-Keep-Alive``: seconds or a duration like ``5m``; negative keeps loaded."""
    try:
        return parse_duration_s(value)
    except DecodeError as exc:
        raise BlazarError("BAD_REQUEST", f"X-Blazar-Keep-Alive: {exc.message}") from exc


def query_int(name: str, default: int, high: int) -> int:
    """An integer query parameter of a framework route, from 1 to ``high``."""
    from quart import request

    raw = request.args.get(name, str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= high:
        raise DecodeError(f"invalid query `{name}`: {raw!r} is not an integer from 1 to {high}", param=name)
    return int(raw)


def query_order(default: Literal["asc", "desc"] = "desc") -> Literal["asc", "desc"]:
    """The ``order`` query parameter of a list route."""
    from quart import request

    order = request.args.get("order", default)
    if order == "asc":
        return "asc"
    if order == "desc":
        return "desc"
    raise DecodeError(f"invalid query `order`: {order!r} is not asc or desc", param="order")
