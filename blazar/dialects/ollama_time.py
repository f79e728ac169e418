"""Time on the Ollama wire, shared by its inference side and its model verbs.

``keep_alive`` arrives as a Go duration or a number of seconds; timestamps go
out as RFC 3339 in UTC with nanoseconds, the way Ollama's Go server prints them.
"""

from __future__ import annotations

import datetime as _dt
import math
import re

from blazar.dialects.neutral import DecodeError

__all__ = ["FOREVER_RFC3339", "parse_duration_s", "rfc3339", "rfc3339_ns"]

FOREVER_RFC3339 = "9999-12-31T23:59:59Z"
"""``expires_at`` of a model kept loaded forever."""

_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9}
_UNIT_NS["h"] = 3600 * 10**9
_DURATION = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


def parse_duration_s(value: str | int | float | None) -> float | None:
    """``keep_alive`` in seconds: None when not given, 0.0 to unload, -1.0 to keep forever.

    Accepts Go durations (``"5m"``, ``"1h30m"``, ``"300ms"``, ``"-1m"``) and plain
    numbers of seconds (``300``, ``"300"``), like Ollama and ``OLLAMA_KEEP_ALIVE``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise DecodeError(
            f"invalid field `keep_alive`: expected a duration string or a number of seconds, "
            f"got `{type(value).__name__}`"
        )
    if isinstance(value, int | float):
        if math.isnan(value) or math.isinf(value):
            raise DecodeError("invalid field `keep_alive`: not a finite number")
        return -1.0 if value < 0 else float(value)
    text = value.strip()
    if not text:
        return None
    if _PLAIN_NUMBER.fullmatch(text):
        seconds = float(text)
        return -1.0 if seconds < 0 else seconds
    sign, body = 1, text
    if body[0] in "+-":
        sign, body = (-1 if body[0] == "-" else 1), body[1:]
    if not _DURATION.fullmatch(body):
        raise DecodeError(
            f"invalid field `keep_alive`: {value!r} is not a duration — send seconds (300), "
            'a Go duration ("5m", "1h30m", "300ms"), 0 to unload, or -1 to keep the model loaded'
        )
    total_ns = sum(float(num) * _UNIT_NS[unit] for num, unit in _DURATION_PART.findall(body))
    if sign < 0 and total_ns > 0:
        return -1.0
    return total_ns / 1e9


def rfc3339_ns(ns: int) -> str:
    """UTC RFC 3339 with up to nine fractional digits, trailing zeros trimmed (Go's RFC3339Nano)."""
    secs, frac = divmod(ns, 1_000_000_000)
    stamp = _dt.datetime.fromtimestamp(secs, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return stamp + (("." + f"{frac:09d}".rstrip("0")) if frac else "") + "Z"


def rfc3339(ts: float) -> str:
    """``rfc3339_ns`` for a ``time.time()`` value (microsecond precision)."""
    return rfc3339_ns(round(ts * 1_000_000) * 1000)
