"""actors.http1: request heads, response heads and bodies, split anywhere."""

from __future__ import annotations

import pytest

from actors.http1 import MAX_HEAD, Body, ProtocolError, ResponseHead, body_for, parse_head, request_head


def _head(raw: bytes) -> tuple[ResponseHead | None, bytearray]:
    buf = bytearray(raw)
    return parse_head(buf), buf


def test_request_head() -> None:
    raw = request_head("POST", "/v1/chat/completions", [(b"host", b"h:1"), (b"content-length", b"2")])
    assert raw == b"POST /v1/chat/completions HTTP/1.1\r\nhost: h:1\r\ncontent-length: 2\r\n\r\n"
    for method, target, headers in (
        ("POST", "/a b", []),
        ("PO ST", "/", []),
        ("GET", "/", [(b"x", b"a\r\nb")]),
        ("GET", "/", [(b"a:b", b"c")]),
    ):
        with pytest.raises(ProtocolError):
            request_head(method, target, headers)


def test_response_head_skips_interim_and_keeps_the_rest() -> None:
    head, buf = _head(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A:  b \r\n\r\nhi"
    )
    assert head is not None
    assert head.status_code == 200 and head.get(b"x-a") == b"b" and head.keep_alive
    assert buf == b"hi"
    assert parse_head(bytearray(b"HTTP/1.1 200 OK\r\nContent-Le")) is None
    close = parse_head(bytearray(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"))
    assert close is not None and not close.keep_alive
    old = parse_head(bytearray(b"HTTP/1.0 200 OK\r\n\r\n"))
    assert old is not None and not old.keep_alive


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTX/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
    ],
)
def test_bad_heads(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_head(bytearray(raw))


def test_a_head_too_long_is_refused() -> None:
    with pytest.raises(ProtocolError):
        parse_head(bytearray(b"HTTP/1.1 200 OK\r\n" + b"x: y\r\n" * (MAX_HEAD // 6 + 1)))


def _decode_in_pieces(body: Body, raw: bytes, step: int) -> bytes:
    buf = bytearray()
    out = b""
    for i in range(0, len(raw), step):
        buf += raw[i : i + step]
        out += body.decode(buf)
    return out


CHUNKED = b"5;ext=1\r\nhello\r\n1\r\n \r\nB\r\nworld, then\r\n0\r\nX-Trailer: 1\r\n\r\n"


@pytest.mark.parametrize("step", [1, 2, 3, 7, 100])
def test_chunked_split_anywhere(step: int) -> None:
    body = Body(chunked=True)
    assert _decode_in_pieces(body, CHUNKED, step) == b"hello world, then" and body.done


def test_chunked_leaves_the_next_response_alone() -> None:
    buf = bytearray(CHUNKED + b"HTTP/1.1")
    body = Body(chunked=True)
    assert body.decode(buf) == b"hello world, then" and body.done and buf == b"HTTP/1.1"


@pytest.mark.parametrize("raw", [b"zz\r\n", b"3\r\nabcX\r\n", b"-1\r\n"])
def test_bad_chunks(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        Body(chunked=True).decode(bytearray(raw))


def test_fixed_length_and_until_eof() -> None:
    body = Body(length=5)
    assert _decode_in_pieces(body, b"helloEXTRA"[:5], 2) == b"hello" and body.done
    cut = Body(length=5)
    cut.decode(bytearray(b"he"))
    with pytest.raises(ProtocolError):
        cut.eof()
    rest = Body()
    assert rest.until_eof and rest.decode(bytearray(b"abc")) == b"abc" and not rest.done
    rest.eof()
    assert rest.done


def test_framing_rules() -> None:
    def head(raw: bytes) -> ResponseHead:
        parsed = parse_head(bytearray(raw))
        assert parsed is not None
        return parsed

    ok = b"HTTP/1.1 200 OK\r\n"
    assert body_for(head(ok + b"Transfer-Encoding: chunked\r\n\r\n"), "POST").chunked
    assert body_for(head(ok + b"Content-Length: 0\r\n\r\n"), "POST").done
    assert body_for(head(ok + b"Content-Length: 9\r\n\r\n"), "HEAD").done
    assert body_for(head(b"HTTP/1.1 204 No Content\r\n\r\n"), "POST").done
    no_length = head(ok + b"\r\n")
    assert body_for(no_length, "GET").until_eof and not no_length.keep_alive
    with pytest.raises(ProtocolError):
        body_for(head(ok + b"Content-Length: 1, 2\r\n\r\n"), "GET")
