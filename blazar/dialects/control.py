"""A chat request's control vectors: ``control_vectors`` and ``control_vector_layers``.

``POST /v1/chat/completions/control`` takes OpenAI's chat body plus::

    "control_vectors": [{"name": "happy", "strength": 0.8}, {"path": "/abs/v.gguf", "strength": -0.5}],
    "control_vector_layers": [10, 20]

Each entry names a vector of the model (``blazar control list``) or a control vector file on
the daemon's machine, and the strength it is added with (a number; 1 by default). The layer
range is optional (default: every layer the vectors have). ``split`` checks the types and
returns the choices and the chat body without these two fields (what the engine is sent).
Whether the vectors exist and fit the model is the runtime's to check. Sans-io.
"""

from __future__ import annotations

from typing import Any

import msgspec

from blazar.errors import BlazarError

__all__ = ["Steering", "Vector", "split"]


class Vector(msgspec.Struct, frozen=True, kw_only=True):
    name: str | None = None
    path: str | None = None
    strength: float = 1.0


class Steering(msgspec.Struct, frozen=True, kw_only=True):
    vectors: list[Vector]
    layers: tuple[int, int] | None = None


_EXAMPLE = 'give a list like [{"name": "VECTOR", "strength": 0.8}]'


def _vector(i: int, entry: Any) -> Vector:
    field = f"control_vectors[{i}]"
    if not isinstance(entry, dict):
        raise BlazarError("BAD_REQUEST", f"invalid field `{field}`: {_EXAMPLE}", param=field)
    unknown = sorted(set(entry) - {"name", "path", "strength"})
    if unknown:
        raise BlazarError(
            "BAD_REQUEST",
            f"invalid field `{field}`: unknown key `{unknown[0]}` "
            "(an entry has `name` or `path`, and `strength`)",
            param=f"{field}.{unknown[0]}",
        )
    strength = entry.get("strength", 1.0)
    if isinstance(strength, bool) or not isinstance(strength, (int, float)):
        raise BlazarError(
            "BAD_REQUEST",
            f"invalid field `{field}.strength`: expected a number, "
            f"got {type(strength).__name__} {strength!r}",
            param=f"{field}.strength",
        )
    name, path = entry.get("name"), entry.get("path")
    if (name is None) == (path is None):
        raise BlazarError(
            "BAD_REQUEST",
            f"invalid field `{field}`: name the vector by `name` or by `path` (one of them)",
            param=field,
        )
    for key, value in (("name", name), ("path", path)):
        if value is not None and (not isinstance(value, str) or not value):
            raise BlazarError(
                "BAD_REQUEST",
                f"invalid field `{field}.{key}`: expected a non-empty string",
                param=f"{field}.{key}",
            )
    return Vector(name=name, path=path, strength=float(strength))


def _layers(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    ok = (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in value)
    )
    if not ok or value[0] > value[1]:
        raise BlazarError(
            "BAD_REQUEST",
            f"invalid field `control_vector_layers`: expected [START, END], two whole numbers with "
            f"START <= END, got {value!r}",
            param="control_vector_layers",
        )
    return value[0], value[1]


def split(body: bytes) -> tuple[Steering, bytes]:
    """The request's steering, and its body without it (the rest is checked as OpenAI chat)."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise BlazarError("BAD_REQUEST", f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BlazarError("BAD_REQUEST", "the body must be a JSON object (an OpenAI chat request)")
    given = doc.pop("control_vectors", None)
    if not isinstance(given, list) or not given:
        raise BlazarError(
            "BAD_REQUEST",
            f"`control_vectors` is missing or empty: {_EXAMPLE} (plain chat is POST /v1/chat/completions)",
            param="control_vectors",
        )
    vectors = [_vector(i, entry) for i, entry in enumerate(given)]
    layers = _layers(doc.pop("control_vector_layers", None))
    return Steering(vectors=vectors, layers=layers), msgspec.json.encode(doc)
