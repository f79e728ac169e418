"""The direct body writer (``blazar.web.asgi.direct``): the bytes it puts on the socket are
the ones h11 would have, and whatever it cannot do goes the server's ordinary way."""

from __future__ import annotations

import socket
from typing import Any

import h11
import trio

from blazar.web.asgi.direct import BodyWriter


def _h11(version: bytes = b"1.1") -> h11.Connection:
    """A server-side h11 connection whose answer's head is out: ready for body data."""
    conn = h11.Connection(h11.SERVER)
    head = b"POST /v1/chat/completions HTTP/" + version + b"\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
    conn.receive_data(head)
    assert isinstance(conn.next_event(), h11.Request)
    assert isinstance(conn.next_event(), h11.EndOfMessage)
    conn.send(h11.Response(status_code=200, headers=[("content-type", "text/event-stream")]))
    return conn


class _Setup:
    def __init__(self, conn: h11.Connection | None) -> None:
        self.ours, self.peer = trio.socket.socketpair()
        self.lock = trio.Lock()
        self.ordinary: list[bytes] = []
        self.writer = BodyWriter(self.ours, self.lock, lambda: conn, self.send)

    async def send(self, message: dict[str, Any]) -> None:
        assert message["type"] == "http.response.body" and message["more_body"] is True
        self.ordinary.append(message["body"])

    async def read(self, n: int) -> bytes:
        got = b""
        while len(got) < n:
            data = await self.peer.recv(1 << 16)
            assert data
            got += data
        return got


async def test_chunks_are_framed_as_h11_frames_them() -> None:
    setup = _Setup(_h11())
    events = [b"data: {}\n\n", b"data: " + b"x" * 300 + b"\n\n", b"data: [DONE]\n\n"]
    reference = _h11()
    expected = b"".join(reference.send(h11.Data(data=e)) for e in events)
    for event in events:
        await setup.writer.write(event)
    assert await setup.read(len(expected)) == expected
    assert setup.ordinary == []


async def test_an_http10_body_stays_h11s_for_every_chunk() -> None:
    setup = _Setup(_h11(b"1.0"))
    await setup.writer.write(b"first")
    await setup.writer.write(b"second")
    assert await setup.read(5) == b"first"  # h11's own framing (none: to the connection's end)
    assert setup.ordinary == [b"second"]


async def test_a_held_send_lock_or_no_h11_connection_sends_the_ordinary_way() -> None:
    setup = _Setup(_h11())
    async with setup.lock:
        await setup.writer.write(b"while locked")
    assert setup.ordinary == [b"while locked"]
    other = _Setup(None)  # an HTTP/2 connection: no h11 connection
    await other.writer.write(b"h2")
    assert other.ordinary == [b"h2"]


async def test_a_closed_socket_sends_the_ordinary_way() -> None:
    setup = _Setup(_h11())
    await setup.writer.write(b"one")
    setup.ours.close()
    await setup.writer.write(b"two")
    await setup.writer.write(b"three")
    assert setup.ordinary == [b"two", b"three"]


async def test_a_chunk_the_socket_cannot_take_at_once_goes_out_whole_even_when_cancelled() -> None:
    setup = _Setup(_h11())
    setup.ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = b"y" * (1 << 20)
    expected = b"%x\r\n%b\r\n" % (len(big), big)
    got: list[bytes] = []

    async def slow_reader() -> None:
        total = 0
        while total < len(expected):
            await trio.sleep(0.001)
            data = await setup.peer.recv(1 << 14)
            got.append(data)
            total += len(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_reader)
        with trio.CancelScope() as scope:
            scope.cancel()  # a cancel may not cut a chunk in two
            await setup.writer.write(big)
    assert b"".join(got) == expected
    assert not setup.lock.locked()
    assert setup.ordinary == []
