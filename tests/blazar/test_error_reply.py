"""One error protocol: every error raised on purpose maps to one reply, wherever it surfaces."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import msgspec
import pytest

import actors.errors
import registry.errors
from actors.errors import AdmissionRejected, BlazarRuntimeError, MaxLoadedModels, ModelBusy
from blazar.cli import _one_line
from blazar.dialects.neutral import DecodeError
from blazar.errors import CATALOG, BlazarError, Dialect
from blazar.errors.describe import ErrorReply, describe_error
from blazar.serve.reply import dialect_for
from blazar.web.asgi.call import Call
from blazar.web.asgi.replies import exception_reply
from registry.errors import ModelNotFound, RegistryError


def _classes(module: object, base: type[Exception]) -> list[type[Exception]]:
    return [c for _, c in inspect.getmembers(module, inspect.isclass) if issubclass(c, base)]


@pytest.mark.parametrize(
    "cls", _classes(actors.errors, BlazarRuntimeError) + _classes(registry.errors, RegistryError)
)
def test_every_error_class_has_a_catalogued_code(cls: type[BlazarRuntimeError | RegistryError]) -> None:
    assert cls.code in CATALOG
    assert cls.retry_after_s is None  # set per instance, where waiting helps


def _r(status: int, code: str, message: str, retry_after_s: float | None = None) -> ErrorReply:
    return ErrorReply(status=status, code=code, message=message, retry_after_s=retry_after_s)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (MaxLoadedModels("all busy", retry_after_s=2.4), _r(503, "MAX_LOADED_MODELS", "all busy", 2.4)),
        (AdmissionRejected("QUEUE_FULL", "full", retry_after_s=7), _r(429, "QUEUE_FULL", "full", 7)),
        (ModelBusy("serving"), _r(409, "MODEL_BUSY", "serving")),
        (ModelNotFound("x"), _r(404, "MODEL_NOT_FOUND", ModelNotFound("x").message)),
        (BlazarError("RATE_LIMITED", "slow down", retry_after_s=3), _r(429, "RATE_LIMITED", "slow down", 3)),
        (DecodeError("messages: required"), _r(400, "BAD_REQUEST", "messages: required")),
    ],
)
def test_describe_error(exc: Exception, expected: ErrorReply) -> None:
    assert describe_error(exc) == expected


def test_an_uncatalogued_code_is_a_bug_but_keeps_its_message() -> None:
    class Odd(BlazarRuntimeError):
        code = "NOT_A_CODE"

    assert describe_error(Odd("what happened")) == ErrorReply(
        status=500, code="INTERNAL", message="what happened"
    )
    assert describe_error(ValueError("bug")) is None


@pytest.mark.parametrize(
    "exc",
    [
        MaxLoadedModels("every loaded model is busy", retry_after_s=2.4),
        ModelNotFound("nope"),
        ModelBusy("busy"),
    ],
)
def test_the_gateway_and_the_cli_say_the_same(exc: BlazarRuntimeError | RegistryError) -> None:
    expected = describe_error(exc)
    assert expected is not None
    call = Call({"method": "POST", "path": "/api/chat", "headers": []}, trace_id="t", max_body=1)
    reply = exception_reply(call, exc)
    assert reply.status == expected.status and call.code == expected.code
    assert msgspec.json.decode(reply.body) == {"error": expected.message, "blazar_code": expected.code}
    assert (reply.headers or {}).get("Retry-After") == expected.retry_after
    line = _one_line(exc)
    assert line.startswith(expected.message)
    if expected.retry_after is not None:
        assert line.endswith(f"(retry in {expected.retry_after} s)")


def test_a_dialect_gets_its_own_wording_and_the_field_to_blame() -> None:
    exc = BlazarError(
        "BAD_REQUEST", "top_p: out of range", param="top_p", wordings={Dialect.ANTHROPIC: "bad top_p"}
    )
    assert describe_error(exc) == ErrorReply(
        status=400, code="BAD_REQUEST", message="top_p: out of range", param="top_p"
    )
    described = describe_error(exc, Dialect.ANTHROPIC)
    assert described is not None and described.message == "bad top_p"
    decoded = describe_error(DecodeError("n: must be >= 1", param="n"))
    assert decoded is not None and decoded.param == "n"


def test_a_failure_in_a_task_tree_is_named_not_its_group() -> None:
    inner = ModelNotFound("no model named 'x' — see `blazar list`")
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [inner])])
    assert _one_line(nested) == _one_line(inner)
    assert "ExceptionGroup" not in _one_line(
        ExceptionGroup("two", [OSError(98, "Address in use"), ValueError()])
    )


_OLLAMA_ROUTES = {
    "/api/version", "/api/tags", "/api/ps", "/api/show", "/api/chat", "/api/generate", "/api/embed",
    "/api/embeddings", "/api/pull", "/api/push", "/api/delete", "/api/copy", "/api/create",
    "/api/blobs/{digest}", "/api/rerank",
}  # fmt: skip
"""Ollama's routes (and the Ollama-style rerank): errors in Ollama's envelope."""


def _documented_api_routes() -> set[str]:
    text = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    return {m.group(1) for m in re.finditer(r"^### `(?:[A-Z]+ )+(/api/[^` ]*)`", text, re.M)}


def test_every_documented_api_route_gets_its_envelope() -> None:
    """Ollama's routes answer errors in Ollama's shape; Blazar's own routes under /api/ (the
    console, capacity, peers, MCP, evict, …) in the native one, as docs/errors.md says."""
    routes = _documented_api_routes()
    assert {"/api/chat", "/api/capacity", "/api/mcp", "/api/evict"} <= routes, routes
    for route in sorted(routes):
        path = route.replace("{digest}", "sha256:ab").replace("{name}", "m").replace("{trace_id}", "t")
        path = path.replace("{model}", "m")
        expected = Dialect.OLLAMA if route in _OLLAMA_ROUTES else Dialect.OPENAI
        assert dialect_for(path, {}) is expected, route
    assert dialect_for("/api/not-a-route", {}) is Dialect.OLLAMA  # an Ollama client's unknown route
