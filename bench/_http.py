"""A small raw HTTP/1.1 client on asyncio streams, cheap enough not to be the bottleneck.

One ``Connection`` is one keep-alive socket. A reply records when its head, its
first body bytes and its end arrived (``time.perf_counter``, which is
CLOCK_MONOTONIC on Linux and so comparable across processes), and, when asked,
every body piece with its arrival time, so that token events can be timed after
the fact without parsing anything while the bytes arrive.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "Connection",
    "HttpError",
    "Reply",
    "build_request",
    "events",
    "split_url",
    "token_times",
]

_LIMIT = 1 << 22


class HttpError(Exception):
    pass


def split_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def build_request(
    method: str,
    path: str,
    *,
    host: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Accept: */*"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


@dataclass(slots=True)
class Reply:
    status: int = 0
    t_start: float = 0.0
    t_head: float = 0.0
    t_first: float = 0.0
    t_end: float = 0.0
    nbytes: int = 0
    npieces: int = 0
    body: bytes = b""
    pieces: list[tuple[float, bytes]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """One keep-alive connection; ``request`` reconnects when the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=_LIMIT)

    def abort(self) -> None:
        """Drop the socket at once (a client that goes away mid-stream)."""
        if self.writer is not None:
            self.writer.transport.abort()
        self.reader = self.writer = None

    async def aclose(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        self.reader = self.writer = None

    async def request(
        self, raw: bytes, *, keep: bool = False, keep_pieces: bool = False, stop_after: int = 0
    ) -> Reply:
        """Send ``raw`` and read the reply. ``keep`` keeps the body, ``keep_pieces`` each timed
        piece; ``stop_after`` > 0 aborts the connection after that many body pieces."""
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        reply = Reply(t_start=time.perf_counter())
        self.writer.write(raw)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            # A keep-alive socket the server had closed: one retry on a fresh one.
            await self.aclose()
            await self.open()
            assert self.reader is not None and self.writer is not None
            reply.t_start = time.perf_counter()
            self.writer.write(raw)
            head = await self.reader.readuntil(b"\r\n\r\n")
        reply.t_head = time.perf_counter()
        lines = head.decode("latin-1").split("\r\n")
        try:
            reply.status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError) as exc:
            raise HttpError(f"bad status line {lines[0]!r}") from exc
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name:
                reply.headers[name.strip().lower()] = value.strip()
        close = reply.headers.get("connection", "").lower() == "close"
        reader = self.reader
        parts: list[bytes] = []
        if reply.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                data = (await reader.readexactly(size + 2))[:-2]
                now = time.perf_counter()
                if not reply.npieces:
                    reply.t_first = now
                reply.npieces += 1
                reply.nbytes += size
                if keep_pieces:
                    reply.pieces.append((now, data))
                if keep:
                    parts.append(data)
                if stop_after and reply.npieces >= stop_after:
                    reply.t_end = time.perf_counter()
                    reply.body = b"".join(parts)
                    self.abort()
                    return reply
        elif "content-length" in reply.headers:
            n = int(reply.headers["content-length"])
            data = await reader.readexactly(n) if n else b""
            reply.t_first = time.perf_counter()
            reply.nbytes, reply.npieces = n, 1
            if keep_pieces:
                reply.pieces.append((reply.t_first, data))
            parts.append(data)
        else:
            data = await reader.read()
            reply.t_first = time.perf_counter()
            reply.nbytes, reply.npieces = len(data), 1
            parts.append(data)
            close = True
        reply.t_end = time.perf_counter()
        if keep:
            reply.body = b"".join(parts)
        if close:
            await self.aclose()
        return reply


def events(pieces: list[tuple[float, bytes]], *, ndjson: bool) -> list[tuple[float, bytes]]:
    """Split timed body pieces into events (SSE blocks or NDJSON lines), each timed by the
    piece that completed it."""
    sep = b"\n" if ndjson else b"\n\n"
    out: list[tuple[float, bytes]] = []
    buf = b""
    for t, data in pieces:
        buf += data.replace(b"\r\n", b"\n")
        while True:
            i = buf.find(sep)
            if i < 0:
                break
            block, buf = buf[:i], buf[i + len(sep) :]
            if block.strip():
                out.append((t, block))
    if buf.strip():
        out.append((pieces[-1][0], buf))
    return out


def _has_text(doc: Any) -> bool:
    """Does one decoded event carry generated text, in any of the three dialects?"""
    if not isinstance(doc, dict):
        return False
    if "choices" in doc:  # OpenAI chunk
        for choice in doc.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") or choice.get("text"):
                return True
        return False
    if doc.get("type") == "content_block_delta":  # Anthropic
        delta = doc.get("delta") or {}
        return bool(delta.get("text") or delta.get("thinking") or delta.get("partial_json"))
    if "message" in doc or "response" in doc:  # Ollama
        if doc.get("done"):
            return False
        message = doc.get("message") or {}
        return bool(message.get("content") or message.get("thinking") or doc.get("response"))
    return False


def token_times(pieces: list[tuple[float, bytes]], *, ndjson: bool) -> list[float]:
    """Arrival times of the events that carry generated text (one per token on llama.cpp)."""
    times: list[float] = []
    for t, block in events(pieces, ndjson=ndjson):
        if ndjson:
            payload = block
        else:
            data = [ln[5:].strip() for ln in block.split(b"\n") if ln.startswith(b"data:")]
            if not data or data[0] == b"[DONE]":
                continue
            payload = b"".join(data)
        try:
            doc = json.loads(payload)
        except ValueError:
            continue
        if _has_text(doc):
            times.append(t)
    return times
