"""A small HTTP/1.1 client on ``asyncio`` streams, for the async client.

One connection per request (``Connection: close``): the daemon is local and its answers
are long-lived streams, so pooling buys little, and closing the socket is how a cancelled
task tells the daemon to stop generating. Bodies are read by ``Content-Length``, chunked
transfer coding, or until the connection closes.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Awaitable, Dict, Optional, Tuple, TypeVar
from urllib.parse import urlsplit

from ._errors import SDK_BAD_RESPONSE, SDK_CONNECTION, SDK_STREAM_CUT, SDK_TIMEOUT, BlazarError
from ._wire import Request

__all__ = ["AsyncResponse", "open_request"]

T = TypeVar("T")
_MAX_HEAD = 64 * 1024


async def _timed(aw: Awaitable[T], timeout: Optional[float], what: str) -> T:
    try:
        return await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError as exc:
        raise BlazarError(f"{what}: no data within {timeout} s", blazar_code=SDK_TIMEOUT) from exc


class AsyncResponse:
    def __init__(
        self,
        status: int,
        headers: Dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        timeout: Optional[float],
    ) -> None:
        self.status = status
        self.headers = headers
        self._reader = reader
        self._writer = writer
        self._timeout = timeout
        self._buffer = bytearray()
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._left: Optional[int] = int(length) if length is not None and length.isdigit() else None
        self._eof = False

    async def _fill(self) -> bool:
        """Read more of the body into the buffer; False at its end."""
        if self._eof:
            return False
        try:
            if self._chunked:
                size_line = await _timed(self._reader.readline(), self._timeout, "reading the answer")
                if not size_line:
                    raise BlazarError(
                        "the connection closed inside a chunked body", blazar_code=SDK_STREAM_CUT
                    )
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while (await self._reader.readline()).strip():  # trailers
                        pass
                    self._eof = True
                    return False
                data = await _timed(self._reader.readexactly(size + 2), self._timeout, "reading the answer")
                self._buffer += data[:-2]
                return True
            if self._left is not None:
                if self._left == 0:
                    self._eof = True
                    return False
                data = await _timed(
                    self._reader.read(min(self._left, 65536)), self._timeout, "reading the answer"
                )
                if not data:
                    raise BlazarError(
                        "the connection closed before the whole body", blazar_code=SDK_STREAM_CUT
                    )
                self._left -= len(data)
                self._buffer += data
                return True
            data = await _timed(self._reader.read(65536), self._timeout, "reading the answer")
            if not data:
                self._eof = True
                return False
            self._buffer += data
            return True
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            raise BlazarError(f"the answer broke off: {exc}", blazar_code=SDK_STREAM_CUT) from exc

    async def read(self) -> bytes:
        while await self._fill():
            pass
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    async def read_some(self) -> bytes:
        """What has arrived of the body (at least one byte), or b"" at its end."""
        if not self._buffer and not await self._fill():
            return b""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    async def readline(self) -> bytes:
        """The next line of the body with its newline, or what is left (b"" at the end)."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                return line
            if not await self._fill():
                line = bytes(self._buffer)
                self._buffer.clear()
                return line

    def close(self) -> None:
        self._writer.close()


def _address(base_url: str) -> Tuple[str, int, Optional[ssl.SSLContext], str]:
    parts = urlsplit(base_url)
    tls = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if tls else 80)
    return host, port, ssl.create_default_context() if tls else None, parts.netloc


async def open_request(
    base_url: str, request: Request, headers: Dict[str, str], timeout: Optional[float]
) -> AsyncResponse:
    """Send ``request`` and read the answer's head; the body is read from the response."""
    host, port, context, netloc = _address(base_url)
    prefix = urlsplit(base_url).path.rstrip("/")
    try:
        reader, writer = await _timed(
            asyncio.open_connection(host, port, ssl=context, limit=_MAX_HEAD),
            timeout,
            f"connecting to {base_url}",
        )
    except OSError as exc:
        raise BlazarError(
            f"cannot reach the daemon at {base_url}: {exc} — is `blazar serve` running?",
            blazar_code=SDK_CONNECTION,
        ) from exc
    try:
        all_headers = {"host": netloc, "connection": "close", "user-agent": "blazar-sdk"}
        all_headers.update(request.headers)
        all_headers.update(headers)
        body = request.body or b""
        if request.body is not None or request.method in ("POST", "PUT", "PATCH"):
            all_headers["content-length"] = str(len(body))
        head = f"{request.method} {prefix}{request.target} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in all_headers.items()
        )
        writer.write(head.encode("latin-1") + b"\r\n" + body)
        await _timed(writer.drain(), timeout, "sending the request")
        while True:
            status_line = await _timed(reader.readline(), timeout, "waiting for the answer")
            parts = status_line.decode("latin-1").split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise BlazarError(f"not an HTTP answer: {status_line[:100]!r}", blazar_code=SDK_BAD_RESPONSE)
            status = int(parts[1])
            answer_headers: Dict[str, str] = {}
            while True:
                line = await _timed(reader.readline(), timeout, "reading the answer's headers")
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                answer_headers[name.strip().lower()] = value.strip()
            if status >= 200 or status == 101:
                return AsyncResponse(status, answer_headers, reader, writer, timeout)
    except BaseException:
        writer.close()
        raise
