"""Decoding request bodies with errors that name the field (shared by every dialect).

Numeric ranges are declared on the wire structs (``Annotated[float, Meta(ge=0,
le=1)]``) and checked by msgspec while it decodes; a value outside its range
becomes a ``DecodeError`` whose wording each dialect chooses (``Wording``)
from an ``OutOfRange`` that names the field, the value sent and the range.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from blazar.dialects.neutral import DecodeError

__all__ = [
    "OutOfRange",
    "Wording",
    "beyond_int64",
    "convert",
    "decode_json",
    "explain",
    "out_of_range",
    "plain_wording",
    "refuse_huge_integers",
]

T = TypeVar("T")

_AT_PATH = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$")
_MISSING = re.compile(r"Object missing required field `(?P<f>[^`]+)`")
_BOUND = re.compile(r"^Expected `(?P<kind>int|float)` (?P<op>>=|<=|>|<) \S+ - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.(?P<key>[^.\[]+)|\[(?P<index>\d+)\]")


class OutOfRange(msgspec.Struct, frozen=True, kw_only=True):
    """A number outside the range its wire struct declares."""

    path: str
    """The field, e.g. ``top_p`` or ``options.num_ctx``."""
    value: str
    """The value as the caller wrote it (JSON text)."""
    integer: bool
    above: bool
    """True when the value is above the range's top, False when below its bottom."""
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False

    @property
    def limit(self) -> str:
        """The bound that was crossed, with its comparison (``<= 1``, ``>= 0``)."""
        if self.above:
            return f"{'<' if self.high_open else '<='} {_number(self.high)}"
        return f"{'>' if self.low_open else '>='} {_number(self.low)}"

    @property
    def range(self) -> str:
        """The whole range in words: ``between 0 and 1``, ``at least 1``."""
        if self.low is not None and self.high is not None and not (self.low_open or self.high_open):
            return f"between {_number(self.low)} and {_number(self.high)}"
        parts = []
        if self.low is not None:
            parts.append(f"{'more than' if self.low_open else 'at least'} {_number(self.low)}")
        if self.high is not None:
            parts.append(f"{'less than' if self.high_open else 'at most'} {_number(self.high)}")
        return " and ".join(parts)


Wording = Callable[[OutOfRange], str]


def _number(x: float | None) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def plain_wording(r: OutOfRange) -> str:
    return f"invalid field `{r.path}`: must be {r.range}, got {r.value}"


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


def _declared(info: Any, steps: list[tuple[str | None, str | None]]) -> Any:
    """The msgspec type info at ``steps`` below ``info`` (None when the path leaves the structs)."""
    for key, index in steps:
        while isinstance(info, msgspec.inspect.UnionType):
            info = next((t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)), None)
        if key is not None and isinstance(info, msgspec.inspect.StructType):
            info = next((f.type for f in info.fields if f.encode_name == key), None)
        elif index is not None and isinstance(info, msgspec.inspect.ListType):
            info = info.item_type
        else:
            return None
    while isinstance(info, msgspec.inspect.UnionType):
        info = next(
            (t for t in info.types if isinstance(t, msgspec.inspect.IntType | msgspec.inspect.FloatType)),
            None,
        )
    return info


def _sent(body: bytes, steps: list[tuple[str | None, str | None]]) -> str:
    value: Any = msgspec.json.decode(body)
    for key, index in steps:
        value = value[key] if key is not None else value[int(index or 0)]
    return msgspec.json.encode(value).decode()


def out_of_range(exc: msgspec.ValidationError, body: bytes, kind: type[Any]) -> OutOfRange | None:
    """What a range violation reported by msgspec means, read from ``kind``'s declarations."""
    m = _BOUND.match(str(exc))
    if m is None:
        return None
    path = m.group("path")
    steps = [(s.group("key"), s.group("index")) for s in _STEP.finditer(path)]
    info = _declared(msgspec.inspect.type_info(kind), steps)
    if not isinstance(info, msgspec.inspect.IntType | msgspec.inspect.FloatType):
        return None
    try:
        value = _sent(body, steps)
    except (msgspec.DecodeError, KeyError, IndexError, TypeError):
        return None
    low, low_open = (info.gt, True) if info.gt is not None else (info.ge, False)
    high, high_open = (info.lt, True) if info.lt is not None else (info.le, False)
    return OutOfRange(
        path=path.lstrip("."),
        value=value,
        integer=m.group("kind") == "int",
        above=m.group("op") in ("<=", "<"),
        low=None if low is None else float(low),
        low_open=low_open,
        high=None if high is None else float(high),
        high_open=high_open,
    )


_INT64 = (-(2**63), 2**63 - 1)


def _watched(t: msgspec.inspect.Type) -> str | None:
    """``int`` when a field of type ``t`` may hold an integer, ``struct`` when a struct that
    has such fields; None for every other type (text, lists, free JSON)."""
    if isinstance(t, msgspec.inspect.UnionType):
        kinds = {_watched(u) for u in t.types} - {None}
        return "struct" if "struct" in kinds else ("int" if kinds else None)
    if isinstance(t, msgspec.inspect.IntType):
        return "int"
    if isinstance(t, msgspec.inspect.StructType):
        return "struct" if _fields_of(t.cls) else None
    return None


@functools.cache
def _fields_of(cls: type) -> tuple[tuple[str, str], ...]:
    """The (attribute, wire name) of ``cls``'s fields that can hold an integer, itself or in a
    struct below it: found once per class, so a request's check reads only those."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    return tuple((f.name, f.encode_name) for f in info.fields if _watched(f.type) is not None)


def beyond_int64(value: Any, path: str = "") -> str | None:
    """The wire path of the first integer field of a decoded request (``value``, a struct) that
    no wire type holds (int64), or None. Only the integer fields of the request's structs are
    read (free JSON, text and lists are not), so the check costs a few attribute reads."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return path if not _INT64[0] <= value <= _INT64[1] else None
    if isinstance(value, msgspec.Struct):
        for name, wire in _fields_of(type(value)):
            found = beyond_int64(getattr(value, name), f"{path}.{wire}" if path else wire)
            if found is not None:
                return found
    return None


def refuse_huge_integers(decoded: Any) -> None:
    """Refuse a decoded request with an integer field beyond 64 bits (``BAD_REQUEST`` naming
    the field), as the APIs' own servers do: their integers are int64 on the wire."""
    if (path := beyond_int64(decoded)) is not None:
        raise DecodeError(f"field `{path}` is beyond a 64-bit integer: send a smaller number", param=path)


def decode_json(body: bytes, kind: type[T], wording: Wording = plain_wording) -> T:
    """Decode a request body into ``kind``: unknown fields ignored, wrong types refused,
    numbers outside their declared range refused in the dialect's ``wording``, and any
    integer beyond 64 bits refused."""
    if not body.strip():
        raise DecodeError("the request body is empty: send a JSON object", code="INVALID_JSON")
    try:
        decoded = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Expected `object`, got") and "$." not in str(exc):
            raise DecodeError("the request body must be a JSON object") from exc
        bad = out_of_range(exc, body, kind)
        if bad is not None:
            raise DecodeError(wording(bad), param=bad.path) from exc
        raise DecodeError(explain(exc)) from exc
    except msgspec.DecodeError as exc:
        raise DecodeError(f"the request body is not valid JSON: {exc}", code="INVALID_JSON") from exc
    refuse_huge_integers(decoded)
    return decoded


def convert(obj: Any, kind: type[T], path: str) -> T:
    """Validate an already-decoded value (e.g. one content block) with field-named errors."""
    try:
        return msgspec.convert(obj, type=kind)
    except msgspec.ValidationError as exc:
        raise DecodeError(explain(exc, path)) from exc
