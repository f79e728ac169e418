"""The pump relays engine streams from one epoll: real sockets on both sides.

The engine is a loopback HTTP/1.1 server written here that sends a chunked body as the
test releases it; the client is one end of a socket pair with small buffers, read (or
not) by the test. The gateway's own use of the pump is covered end to end by every
streamed test against a daemon (the OpenAI SDK's engine kill mid-stream among them)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from typing import NamedTuple

import pytest
import trio

from actors.upstream import UpstreamBrokenError, UpstreamError, UpstreamPool, UpstreamResponse
from blazar.web.asgi import direct
from blazar.web.asgi.pump import BROKEN, END, FAILED, Flow, current_pump

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def framed(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class Engine:
    """Answers each request with the chunks put in its connection's channel (``send``, the
    latest's): ``None`` ends the body, ``b"!"`` cuts the connection short."""

    def __init__(self) -> None:
        self.port = 0
        self.channels: list[trio.MemorySendChannel[bytes | None]] = []
        self.written = 0

    @property
    def send(self) -> trio.MemorySendChannel[bytes | None]:
        return self.channels[-1]

    async def handle(self, stream: trio.SocketStream) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            if not (data := await stream.receive_some(65536)):
                return
            buf += data
        send, parts = trio.open_memory_channel[bytes | None](10_000)
        self.channels.append(send)
        await stream.send_all(_HEAD)
        try:
            async for part in parts:
                if part is None:
                    await stream.send_all(b"0\r\n\r\n")
                    continue  # keep-alive: the connection stays open
                if part == b"!":
                    await stream.aclose()
                    return
                await stream.send_all(framed(part))
                self.written += len(part)
        except trio.BrokenResourceError:
            pass


@pytest.fixture
async def engine(nursery: trio.Nursery) -> AsyncIterator[Engine]:
    e = Engine()
    listeners = await nursery.start(trio.serve_tcp, e.handle, 0)
    e.port = listeners[0].socket.getsockname()[1]
    yield e


def client_pair(buffer: int = 4096) -> tuple[socket.socket, socket.socket]:
    """The daemon's side (non-blocking, small send buffer) and the client's."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    ours.setblocking(False)
    theirs.setblocking(False)
    return ours, theirs


def dechunk(data: bytes) -> tuple[bytes, bytes]:
    """The payload of the whole chunks at the front of ``data``, and what is left."""
    out = bytearray()
    while (i := data.find(b"\r\n")) > 0:
        size = int(data[:i], 16)
        if len(data) < i + 2 + size + 2:
            break
        assert data[i + 2 + size : i + 4 + size] == b"\r\n"
        out += data[i + 2 : i + 2 + size]
        data = data[i + 4 + size :]
    return bytes(out), data


async def read_all(sock: socket.socket, want: int) -> bytes:
    """The payload of the chunks the client receives, once there are ``want`` bytes of it
    (the pump may join or split the engine's chunks: each read is one chunk)."""
    got, raw = bytearray(), b""
    with trio.fail_after(10):
        while len(got) < want:
            await trio.lowlevel.wait_readable(sock)
            payload, raw = dechunk(raw + sock.recv(1 << 20))
            got += payload
    assert not raw
    return bytes(got)


async def open_stream(engine: Engine) -> tuple[UpstreamPool, UpstreamResponse]:
    pool = UpstreamPool("127.0.0.1", engine.port, headers={}, max_idle=4, idle_expiry_s=30)
    return pool, await pool.request("POST", "/v1/chat/completions", body=b"{}")


class Piped(NamedTuple):
    """A stream from the engine handed to the pump, and both ends of the client's socket."""

    pool: UpstreamPool
    response: UpstreamResponse
    flow: Flow
    ours: socket.socket
    theirs: socket.socket


async def open_flow(engine: Engine) -> Piped:
    pool, response = await open_stream(engine)
    ours, theirs = client_pair()
    return Piped(pool, response, current_pump().start(response, ours.fileno(), lambda _: None), ours, theirs)


async def test_chunks_are_relayed_framed_and_counted_and_the_connection_kept(
    engine: Engine, nursery: trio.Nursery
) -> None:
    pool, response = await open_stream(engine)
    ours, theirs = client_pair()
    seen: list[bytes] = []
    parts = [b'data: {"n":%d}\n\n' % i for i in range(50)]
    received: list[bytes] = []
    read = trio.Event()

    async def client() -> None:
        received.append(await read_all(theirs, sum(map(len, parts))))
        read.set()

    nursery.start_soon(client)
    flow = current_pump().start(response, ours.fileno(), seen.append)
    for part in parts:
        await engine.send.send(part)
        await trio.sleep(0.001)
    await engine.send.send(None)
    with trio.fail_after(10):
        await flow.ended.wait()
        await read.wait()
    assert flow.outcome == END
    assert received == [b"".join(parts)]
    assert b"".join(seen) == b"".join(parts)
    assert await response.receive_some() == b""  # the iteration sees the end
    assert pool.idle_count == 1  # back in the pool, out of the pump's set
    await pool.aclose()


async def test_a_slow_client_holds_the_engine_back_and_loses_nothing(engine: Engine) -> None:
    piped = await open_flow(engine)
    pool, flow, theirs = piped.pool, piped.flow, piped.theirs
    part = b"x" * 1000
    for _ in range(2000):  # 2 MB: far more than both sockets' buffers
        engine.send.send_nowait(part)
    engine.send.send_nowait(None)
    await trio.sleep(0.3)
    # Nothing is read from the engine past what the client's socket would take.
    assert engine.written < 1_500_000 and not flow.ended.is_set() and flow.pending
    body = await read_all(theirs, 2000 * len(part))
    assert body == part * 2000
    with trio.fail_after(10):
        await flow.ended.wait()
    assert flow.outcome == END
    await pool.aclose()


async def test_a_cancel_with_a_partial_chunk_writes_it_out_first(engine: Engine) -> None:
    piped = await open_flow(engine)
    pool, response, flow, theirs = piped.pool, piped.response, piped.flow, piped.theirs
    big = b"y" * 200_000
    await engine.send.send(big)
    with trio.fail_after(5):
        while not flow.pending:  # noqa: ASYNC110 (the pump sets no event for it)
            await trio.sleep(0.01)
    flow.stop_reading()  # what a cancelled request does
    assert not flow.ended.is_set()
    raw = b""
    with trio.fail_after(5):
        while not flow.ended.is_set():
            await trio.lowlevel.wait_readable(theirs)
            raw += theirs.recv(1 << 20)
    with contextlib.suppress(BlockingIOError):
        raw += theirs.recv(1 << 20)
    payload, rest = dechunk(raw)
    assert rest == b"" and payload and big.startswith(payload)  # no partial chunk is left
    assert flow.outcome is None
    await response.aclose()
    await pool.aclose()


async def test_an_engine_that_breaks_midway_fails_the_flow_and_the_read_says_why(engine: Engine) -> None:
    piped = await open_flow(engine)
    pool, response, flow, theirs = piped.pool, piped.response, piped.flow, piped.theirs
    await engine.send.send(b"data: 1\n\n")
    await engine.send.send(b"!")
    with trio.fail_after(5):
        await flow.ended.wait()
    assert flow.outcome == FAILED
    with pytest.raises(UpstreamBrokenError, match="midway"):
        await response.receive_some()
    assert await read_all(theirs, 9) == b"data: 1\n\n"
    await pool.aclose()


async def test_a_pool_closed_under_a_flow_ends_it(engine: Engine) -> None:
    piped = await open_flow(engine)
    pool, response, flow = piped.pool, piped.response, piped.flow
    await engine.send.send(b"data: 1\n\n")
    await trio.sleep(0.05)
    await pool.aclose()  # the engine is stopped
    with trio.fail_after(5):
        await flow.ended.wait()
    assert flow.outcome == FAILED
    with pytest.raises(UpstreamError):
        await response.receive_some()


async def test_a_client_that_is_gone_breaks_only_its_flow(engine: Engine) -> None:
    piped = await open_flow(engine)
    pool, response, flow, theirs = piped.pool, piped.response, piped.flow, piped.theirs
    theirs.close()
    await engine.send.send(b"data: 1\n\n")
    with trio.fail_after(5):
        await flow.ended.wait()
    assert flow.outcome == BROKEN
    await response.aclose()
    # The pump serves the next stream as before.
    pool2, response2 = await open_stream(engine)
    ours2, theirs2 = client_pair()
    flow2 = current_pump().start(response2, ours2.fileno(), lambda _: None)
    await engine.send.send(b"data: 2\n\n")
    await engine.send.send(None)
    with trio.fail_after(5):
        await flow2.ended.wait()
    assert flow2.outcome == END
    assert await read_all(theirs2, 9) == b"data: 2\n\n"
    await pool.aclose()
    await pool2.aclose()


async def test_a_cancelled_pipe_whose_client_takes_nothing_ends_the_connection(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partial chunk is waited for a bounded time, then the connection is ended: a
    client that stopped reading cannot hold the request (and its engine slot) forever."""
    monkeypatch.setattr(direct, "_DRAIN_S", 0.3)
    ours, theirs = client_pair()
    broken: list[bool] = []
    writer = direct.BodyWriter(trio.socket.from_stdlib_socket(ours), trio.Lock(), lambda: broken.append(True))
    await writer.write(b"data: first\n\n")  # a chunked body
    pool, response = await open_stream(engine)
    with trio.fail_after(5), trio.move_on_after(0.5) as scope:  # a cancel: the client left
        engine.send.send_nowait(b"z" * 500_000)  # far more than the client's socket takes
        await writer.pipe(response, lambda _: None)
    assert scope.cancelled_caught
    assert broken == [True]  # the connection is told: it carries no other answer
    with trio.fail_after(3):  # the bounded wait, then the connection's end: the client reads EOF
        while True:
            await trio.lowlevel.wait_readable(theirs)
            if not theirs.recv(1 << 20):
                break
    await response.aclose()
    await pool.aclose()
