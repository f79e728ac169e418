"""Decoding request bodies with errors that name the field (shared by every dialect)."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from blazar.dialects.neutral import DecodeError

__all__ = ["decode_json", "explain"]

T = TypeVar("T")

_AT_PATH = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$")
_MISSING = re.compile(r"Object missing required field `(?P<f>[^`]+)`")


def explain(exc: msgspec.ValidationError, prefix: str = "") -> str:
    """msgspec's message, rewritten to name the field (``prefix`` roots nested paths)."""
    m = _AT_PATH.match(str(exc))
    assert m is not None
    what, path = m.group("what"), (m.group("path") or "").lstrip(".")
    path = ".".join(p for p in (prefix, path) if p).replace(".[", "[")
    missing = _MISSING.match(what)
    if missing:
        field = f"{path}.{missing.group('f')}" if path else missing.group("f")
        return f"missing required field `{field}`"
    return f"invalid field `{path or 'body'}`: {what[0].lower()}{what[1:]}"


def decode_json(body: bytes, kind: type[T]) -> T:
    """Decode a request body into ``kind``: unknown fields ignored, wrong types refused."""
    if not body.strip():
        raise DecodeError("the request body is empty: send a JSON object", code="INVALID_JSON")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Expected `object`, got") and "$." not in str(exc):
            raise DecodeError("the request body must be a JSON object") from exc
        raise DecodeError(explain(exc)) from exc
    except msgspec.DecodeError as exc:
        raise DecodeError(f"the request body is not valid JSON: {exc}", code="INVALID_JSON") from exc


def convert(obj: Any, kind: type[T], path: str) -> T:
    """Validate an already-decoded value (e.g. one content block) with field-named errors."""
    try:
        return msgspec.convert(obj, type=kind)
    except msgspec.ValidationError as exc:
        raise DecodeError(explain(exc, path)) from exc
