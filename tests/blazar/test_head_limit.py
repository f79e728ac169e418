"""The request head's size as the gateway measures it, against ``max_header_kb``."""

from __future__ import annotations

from blazar.web.middleware.head_limit import head_refusal, head_size


def _scope(
    *headers: tuple[bytes, bytes], path: bytes = b"/v1/models", query: bytes = b""
) -> dict[str, object]:
    return {"method": "GET", "raw_path": path, "query_string": query, "headers": list(headers)}


def test_the_head_counts_the_request_line_and_every_header_line() -> None:
    scope = _scope((b"host", b"127.0.0.1"), (b"x-a", b"b"), query=b"limit=5")
    # "GET /v1/models?limit=5 HTTP/1.1\r\n" + "host: 127.0.0.1\r\n" + "x-a: b\r\n"
    assert head_size(scope) == len(b"GET /v1/models?limit=5 HTTP/1.1\r\n") + len(
        b"host: 127.0.0.1\r\n"
    ) + len(b"x-a: b\r\n")


def test_a_head_over_the_limit_is_refused_naming_the_setting() -> None:
    big = _scope((b"x-big", b"a" * 70_000))
    refusal = head_refusal(big, 64 * 1024)
    assert refusal is not None and refusal.code == "HEADERS_TOO_LARGE" and "max_header_kb" in refusal.message
    assert head_refusal(_scope((b"x-ok", b"a" * 60_000)), 64 * 1024) is None
    assert head_refusal(big, None) is None
