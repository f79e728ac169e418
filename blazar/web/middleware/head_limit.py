"""The request head's size limit (``max_header_kb``), however its bytes arrived.

hypercorn's HTTP/1.1 parser bounds only the bytes it holds while a head is incomplete, so a
head that arrives in one read (or in pieces that each complete a buffer) can be far larger
than the limit. The gateway measures the parsed head itself, first of all its steps: the
request line and every header line, as sent. A head over the limit is answered ``431``
``HEADERS_TOO_LARGE`` before anything reads it further.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from blazar.errors import BlazarError

__all__ = ["head_refusal", "head_size"]


def head_size(scope: Mapping[str, Any]) -> int:
    """The bytes of the request line and header lines (``name: value\\r\\n``) of ``scope``."""
    # "METHOD PATH HTTP/1.1\r\n"
    line = len(scope.get("method", "")) + 1 + len(scope.get("raw_path") or b"") + 11
    if query := scope.get("query_string"):
        line += 1 + len(query)
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers") or ()
    return line + sum(len(name) + len(value) + 4 for name, value in headers)


def head_refusal(scope: Mapping[str, Any], limit: int | None) -> BlazarError | None:
    """``HEADERS_TOO_LARGE`` when the head of ``scope`` is over ``limit`` bytes; None: within."""
    if limit is None:
        return None
    size = head_size(scope)
    if size <= limit:
        return None
    return BlazarError(
        "HEADERS_TOO_LARGE",
        f"the request head is {size // 1024} KiB, more than the {limit // 1024} KiB it may be "
        "(max_header_kb): send fewer or shorter headers",
    )
