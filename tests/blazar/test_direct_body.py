"""The body writer of the daemon's HTTP/1.1 connection (``blazar.web.asgi.direct``): each
framing on the wire, one write whole however the socket takes it, and a failed write
told to the connection once."""

from __future__ import annotations

import socket

import trio

from blazar.web.asgi.direct import CHUNKED, NO_BODY, RAW, BodyWriter


class _Setup:
    def __init__(self) -> None:
        self.ours, self.peer = trio.socket.socketpair()
        self.lock = trio.Lock()
        self.broken = 0
        self.writer = BodyWriter(self.ours, self.lock, self._broken)

    def _broken(self) -> None:
        self.broken += 1

    async def read(self, n: int) -> bytes:
        got = b""
        while len(got) < n:
            data = await self.peer.recv(1 << 16)
            assert data
            got += data
        return got


async def test_each_framing_on_the_wire() -> None:
    setup = _Setup()
    events = [b"data: {}\n\n", b"data: " + b"x" * 300 + b"\n\n"]
    for event in events:
        await setup.writer.write(event)
    expected = b"a\r\ndata: {}\n\n\r\n" + b"134\r\n" + events[1] + b"\r\n"
    assert await setup.read(len(expected)) == expected
    setup.writer.framing = RAW  # a declared length, or HTTP/1.0's body to the connection's end
    await setup.writer.write(b"as it is")
    assert await setup.read(8) == b"as it is"
    setup.writer.framing = NO_BODY  # HEAD, 204, 304: nothing goes out
    await setup.writer.write(b"never")
    setup.writer.framing = CHUNKED
    await setup.writer.write(b"z")
    assert await setup.read(6) == b"1\r\nz\r\n"
    assert setup.broken == 0


async def test_a_write_behind_a_waiting_one_goes_out_after_it() -> None:
    setup = _Setup()
    async with trio.open_nursery() as nursery:
        async with setup.lock:  # a write waiting for the socket holds it
            nursery.start_soon(setup.writer.send, b"second")
            await trio.sleep(0.05)
            await setup.ours.send(b"first ")
    assert await setup.read(12) == b"first second"


async def test_a_closed_socket_is_told_once_and_later_writes_go_nowhere() -> None:
    setup = _Setup()
    await setup.writer.write(b"one")
    setup.ours.close()
    await setup.writer.write(b"two")
    assert await setup.writer.send(b"three") is False
    assert setup.broken == 1 and setup.writer.dead


async def test_a_chunk_the_socket_cannot_take_at_once_goes_out_whole_even_when_cancelled() -> None:
    setup = _Setup()
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
    assert setup.broken == 0
