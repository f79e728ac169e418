"""The channel between the runtime and its data-plane workers (``blazar/web/asgi/channel.py``).

The runtime's side runs on a real Unix socket and the worker's side is the worker's own
pool (``blazar/daemon/worker_channel.py``); the app behind the runtime's side is a small
ASGI app that records what it was given. The whole path (real workers, the gateway, the
engine) is tested in ``tests/e2e/test_workers.py``.
"""

from __future__ import annotations

import secrets
import socket
import struct
from typing import Any

import msgspec
import pytest
import trio

from blazar.daemon.worker_channel import RuntimeChannel, connect_unix
from blazar.serve.handoff import HandoffSlot, Report, ReportAnswer
from blazar.web.asgi.call import HANDOFF_EXTENSION
from blazar.web.asgi.channel import (
    Answered,
    Body,
    ChannelClosed,
    ChannelConnection,
    Head,
    Hello,
    Open,
    Reported,
    serve_channel,
)

TOKEN = "the-token"


def _open(body: bytes = b'{"x": 1}', path: str = "/v1/chat/completions") -> Open:
    return Open(
        method="POST",
        path=path,
        raw_path=path.encode(),
        query=b"a=1",
        headers=[(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        body=body,
        client=("203.0.113.7", 5050),
        server=("127.0.0.1", 11435),
        scheme="https",
        http_version="1.1",
    )


class Recorder:
    """An ASGI app that answers each request by how it was asked, and notes what it saw."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.disconnected = trio.Event()
        self.slot: HandoffSlot | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        request = await receive()
        if scope["path"] == "/fail":
            raise RuntimeError("a bug in a route")
        if scope["path"] == "/hold":  # a stream that runs until its client goes
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            assert (await receive())["type"] == "http.disconnect"
            self.disconnected.set()
            return
        if scope["path"] == "/handoff":  # granted: the answer stays open until the report
            slot = self.slot = scope["extensions"][HANDOFF_EXTENSION]
            reports: list[Report] = []

            async def reported(report: Report) -> ReportAnswer:
                reports.append(report)
                return ReportAnswer(body=b"last:" + report.tail)

            slot.granted(reported)
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"x-blazar-handoff", b"1")]}
            )
            await send({"type": "http.response.body", "body": b'{"grant":1}\n', "more_body": True})
            await slot.wait()
            await send({"type": "http.response.body", "body": b""})
            return
        body = request["body"] + b"|" + scope["query_string"]
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-seen", b"yes")]})
        await send({"type": "http.response.body", "body": body[:4], "more_body": True})
        await send({"type": "http.response.body", "body": body[4:]})


async def _serve(nursery: trio.Nursery, app: Any, max_frame: int = 1 << 20) -> str:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0blazar-test-channel-{secrets.token_hex(6)}"
    listener.bind(name)
    await nursery.start(
        lambda task_status: serve_channel(app, TOKEN, listener, max_frame=max_frame, task_status=task_status)
    )
    return name


async def _frames_until_end(conn: ChannelConnection) -> list[Any]:
    frames = []
    while True:
        frame = await conn.read()
        frames.append(frame)
        if frame is None or (isinstance(frame, Body) and not frame.more):
            return frames


async def test_a_request_runs_as_the_worker_received_it_and_the_connection_is_kept() -> None:
    app = Recorder()
    async with trio.open_nursery() as nursery:
        channel = RuntimeChannel(await _serve(nursery, app), TOKEN)
        for n in range(2):
            conn = await channel.open(_open(body=b"body%d" % n))
            frames = await _frames_until_end(conn)
            assert frames == [
                Head(201, [(b"x-seen", b"yes")]),
                Body(b"body", True),
                Body(b"%d|a=1" % n, False),
            ]
            channel.keep(conn)
        scope = app.scopes[0]
        assert scope["client"] == ("203.0.113.7", 5050) and scope["scheme"] == "https"
        assert scope["method"] == "POST" and scope["path"] == "/v1/chat/completions"
        assert isinstance(scope["extensions"][HANDOFF_EXTENSION], HandoffSlot)
        # both requests went over the one kept connection
        assert len(channel._idle) == 1
        channel.close()
        nursery.cancel_scope.cancel()


async def test_a_closed_connection_is_the_clients_disconnect() -> None:
    app = Recorder()
    async with trio.open_nursery() as nursery:
        channel = RuntimeChannel(await _serve(nursery, app), TOKEN)
        conn = await channel.open(_open(path="/hold"))
        assert isinstance(await conn.read(), Head)
        assert await conn.read() == Body(b"first", True)
        conn.close()
        with trio.fail_after(5):
            await app.disconnected.wait()
        nursery.cancel_scope.cancel()


async def test_a_handed_off_stream_is_reported_on_its_own_connection() -> None:
    app = Recorder()
    async with trio.open_nursery() as nursery:
        channel = RuntimeChannel(await _serve(nursery, app), TOKEN)
        conn = await channel.open(_open(path="/handoff"))
        assert (await conn.read()) == Head(200, [(b"x-blazar-handoff", b"1")])
        assert (await conn.read()) == Body(b'{"grant":1}\n', True)
        await conn.write(Reported(Report(tail=b"data: [DONE]\n\n", chunks=3)))
        frames = {type(f): f for f in [await conn.read(), await conn.read()]}  # in either order
        assert frames[Answered] == Answered(ReportAnswer(body=b"last:data: [DONE]\n\n"))
        assert frames[Body] == Body(b"", False)
        nursery.cancel_scope.cancel()


async def test_an_app_that_fails_before_its_head_answers_500() -> None:
    async with trio.open_nursery() as nursery:
        channel = RuntimeChannel(await _serve(nursery, Recorder()), TOKEN)
        conn = await channel.open(_open(path="/fail"))
        head, body = await _frames_until_end(conn)
        assert isinstance(head, Head) and head.status == 500
        assert msgspec.json.decode(body.data)["error"]["blazar_code"] == "INTERNAL"
        nursery.cancel_scope.cancel()


async def test_a_connection_without_the_token_is_closed_unserved() -> None:
    app = Recorder()
    async with trio.open_nursery() as nursery:
        name = await _serve(nursery, app)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(name)
        conn = ChannelConnection(sock)
        await conn.write(Hello("not-the-token"))
        with trio.fail_after(5):
            try:  # the runtime may have closed it before the request is written
                await conn.write(_open())
                assert await conn.read() is None
            except ChannelClosed:
                pass
        assert app.scopes == []
        nursery.cancel_scope.cancel()


async def test_frames_survive_split_reads_and_a_cancelled_read() -> None:
    a, b = trio.socket.socketpair()
    reader = ChannelConnection(b)
    whole = bytearray(4)
    msgspec.msgpack.Encoder().encode_into(Body(b"x" * 100_000, True), whole, 4)
    struct.pack_into(">I", whole, 0, len(whole) - 4)
    await a.send(whole[:3])
    with trio.move_on_after(0.05):  # a read cancelled with part of a frame in hand
        await reader.read()
    async with trio.open_nursery() as nursery:

        async def rest() -> None:
            view = memoryview(whole)[3:]
            while view:
                view = view[await a.send(view) :]

        nursery.start_soon(rest)
        assert await reader.read() == Body(b"x" * 100_000, True)
    a.close()
    assert await reader.read() is None


async def test_an_oversized_or_cut_frame_breaks_the_connection() -> None:
    a, b = trio.socket.socketpair()
    await a.send(struct.pack(">I", 1 << 21))
    with pytest.raises(ChannelClosed, match="over the limit"):
        await ChannelConnection(b, max_frame=1 << 20).read()
    c, d = trio.socket.socketpair()
    await c.send(struct.pack(">I", 10) + b"abc")
    c.close()
    with pytest.raises(ChannelClosed, match="inside a frame"):
        await ChannelConnection(d).read()


def test_each_worker_holds_a_share_of_the_connections_and_a_whole_client_cap() -> None:
    from blazar.config import Config
    from blazar.daemon.workers import worker_config

    config = Config(max_connections=1024, max_connections_per_client=256)
    each = worker_config(config, 3)
    assert each.max_connections == 342 and each.max_connections_per_client == 256
    small = worker_config(Config(max_connections=300, max_connections_per_client=256), 4)
    assert small.max_connections_per_client == 75  # never above a worker's own total


async def test_a_broken_connection_ends_alone() -> None:
    """A worker that breaks the protocol, or dies mid-frame, loses its own connection; the
    channel goes on serving the others."""
    app = Recorder()
    async with trio.open_nursery() as nursery:
        name = await _serve(nursery, app)
        channel = RuntimeChannel(name, TOKEN)
        bad = await channel.open(_open(path="/hold"))
        assert isinstance(await bad.read(), Head)
        await bad.write(Head(200, []))  # not a worker's frame
        with trio.fail_after(5):
            await app.disconnected.wait()  # its request saw its client go
        cut = await channel.open(_open(path="/hold"))
        await cut.sock.send(struct.pack(">I", 100) + b"\x93")  # dies inside a frame
        cut.close()
        conn = await channel.open(_open(body=b"still"))
        frames = await _frames_until_end(conn)
        assert frames[1:] == [Body(b"stil", True), Body(b"l|a=1", False)]
        nursery.cancel_scope.cancel()


async def test_a_connect_to_a_full_backlog_is_tried_again() -> None:
    """A Unix socket's backlog does not queue a connect past it: the worker tries again until
    the runtime accepts (a burst of new streams)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0blazar-test-channel-{secrets.token_hex(6)}"
    listener.bind(name)
    listener.listen(0)
    fillers = []
    for _ in range(16):  # nobody accepts yet: fill the backlog
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        try:
            filler.connect(name)
        except BlockingIOError:
            filler.close()
            break
        fillers.append(filler)
    else:
        pytest.skip("the kernel queued every connection")
    with pytest.raises(BlockingIOError):  # never accepted: it gives up after its wait
        await connect_unix(name, wait_s=0.05)
    app = Recorder()
    async with trio.open_nursery() as nursery:

        async def accept_later() -> None:
            await trio.sleep(0.2)
            await nursery.start(
                lambda task_status: serve_channel(app, TOKEN, listener, task_status=task_status)
            )
            for filler in fillers:
                filler.close()

        nursery.start_soon(accept_later)
        channel = RuntimeChannel(name, TOKEN)
        with trio.fail_after(10):
            conn = await channel.open(_open(body=b"waited"))
            frames = await _frames_until_end(conn)
        assert frames[0] == Head(201, [(b"x-seen", b"yes")])
        nursery.cancel_scope.cancel()
