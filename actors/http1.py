"""Sans-io HTTP/1.1 framing for the upstream client: request heads out, response heads
and bodies in.

The gateway's hot path talks to engine children it started itself, one request
per connection at a time. This is the part of HTTP/1.1 that needs: a request
head, a response head (1xx skipped), and a body framed by Content-Length, the
chunked transfer coding, or the end of the connection. It works on a
``bytearray`` the caller fills from the socket, and decodes a relayed stream
chunk in a few bytearray operations (a general state machine costs several
times that per chunk: BENCHMARK.md). Anything malformed raises
``ProtocolError``; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MAX_HEAD", "Body", "ProtocolError", "ResponseHead", "body_for", "parse_head", "request_head"]

MAX_HEAD = 64 * 1024
"""A response head longer than this is refused."""
_MAX_LINE = 4096


class ProtocolError(Exception):
    """The peer broke HTTP/1.1 framing, or a request could not be framed."""


def request_head(method: str, target: str, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """``METHOD target HTTP/1.1`` and the header lines, CRLF-terminated."""
    if not method.isalpha() or not target.startswith("/") or any(c in target for c in " \r\n\0"):
        raise ProtocolError(f"cannot send {method!r} {target!r}")
    lines = [f"{method} {target} HTTP/1.1".encode()]
    for name, value in headers:
        line = name + b": " + value
        if not name or b":" in name or b"\r" in line or b"\n" in line or b"\0" in line:
            raise ProtocolError(f"invalid header {name!r}")
        lines.append(line)
    lines.append(b"\r\n")
    return b"\r\n".join(lines)


class ResponseHead:
    __slots__ = ("headers", "keep_alive", "status_code")

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], keep_alive: bool) -> None:
        self.status_code = status_code
        self.headers = headers
        """(lower-case name, value) pairs, in order."""
        self.keep_alive = keep_alive

    def get(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


def parse_head(buf: bytearray) -> ResponseHead | None:
    """Take one final (non-1xx) response head off the front of ``buf``; None while
    it is incomplete. Interim 1xx heads are dropped."""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                raise ProtocolError(f"response head longer than {MAX_HEAD} bytes")
            return None
        lines = bytes(buf[:end]).split(b"\r\n")
        del buf[: end + 4]
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
            raise ProtocolError(f"bad status line {lines[0][:100]!r}")
        status = int(code)
        if 100 <= status < 200:
            continue
        headers = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip() or name[:1] in b" \t":
                raise ProtocolError(f"bad header line {line[:100]!r}")
            headers.append((name.lower(), value.strip(b" \t")))
        head = ResponseHead(status, headers, keep_alive=version == b"HTTP/1.1")
        connection = head.get(b"connection")
        if connection is not None and b"close" in connection.lower():
            head.keep_alive = False
        return head


class Body:
    """Decodes one response body from the connection's buffer.

    ``decode(buf)`` takes what it can off ``buf`` and returns the body bytes in it;
    ``done`` once the body is complete. ``until_eof``: the body ends with the
    connection (``eof()`` then completes it), so the connection cannot be reused.
    """

    __slots__ = ("_crlf", "_left", "_trailer", "chunked", "done", "until_eof")

    def __init__(self, *, length: int | None = None, chunked: bool = False) -> None:
        self.chunked = chunked
        self.until_eof = length is None and not chunked
        self._left = length if length is not None else 0  # of the current chunk, when chunked
        self._crlf = False
        self._trailer = False
        self.done = length == 0 and not chunked

    def decode(self, buf: bytearray) -> bytes:
        if self.done or not buf:
            return b""
        if self.until_eof:
            data = bytes(buf)
            buf.clear()
            return data
        if not self.chunked:
            n = min(self._left, len(buf))
            data = bytes(buf[:n])
            del buf[:n]
            self._left -= n
            self.done = self._left == 0
            return data
        return self._chunks(buf)

    def eof(self) -> None:
        """The connection ended: complete for an until-EOF body, else it was cut short."""
        if not self.until_eof and not self.done:
            raise ProtocolError("the connection closed before the end of the body")
        self.done = True

    def _chunks(self, buf: bytearray) -> bytes:
        out: list[bytes] = []
        while buf:
            if self._left:
                n = min(self._left, len(buf))
                out.append(bytes(buf[:n]))
                del buf[:n]
                self._left -= n
                self._crlf = self._left == 0
                continue
            if self._crlf:
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                del buf[:2]
                self._crlf = False
                continue
            i = buf.find(b"\r\n")
            if i < 0:
                if len(buf) > _MAX_LINE:
                    raise ProtocolError("chunk size line too long")
                break
            line = bytes(buf[:i])
            if self._trailer:
                del buf[: i + 2]
                if not line:  # the empty line after the last chunk and its trailers
                    self.done = True
                    break
                continue
            size = line.split(b";", 1)[0].strip()
            try:
                left = int(size, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {line[:40]!r}") from None
            if left < 0:
                raise ProtocolError(f"bad chunk size {line[:40]!r}")
            end = i + 2 + left
            if left and buf.startswith(b"\r\n", end):
                # The whole chunk has arrived (as a relayed stream's usually has): take it at once.
                out.append(bytes(buf[i + 2 : end]))
                del buf[: end + 2]
                continue
            del buf[: i + 2]
            self._left = left
            self._trailer = left == 0
        return out[0] if len(out) == 1 else b"".join(out)


def body_for(head: ResponseHead, method: str) -> Body:
    """How this response's body is framed (RFC 9112 §6.3)."""
    if method == "HEAD" or head.status_code in (204, 304):
        return Body(length=0)
    coding = head.get(b"transfer-encoding")
    if coding is not None:
        if coding.lower().rsplit(b",", 1)[-1].strip() == b"chunked":
            return Body(chunked=True)
        head.keep_alive = False
        return Body()
    length = head.get(b"content-length")
    if length is not None:
        values = {v.strip() for v in length.split(b",")}
        if len(values) != 1 or not next(iter(values)).isdigit():
            raise ProtocolError(f"bad Content-Length {length[:40]!r}")
        return Body(length=int(next(iter(values))))
    head.keep_alive = False
    return Body()
