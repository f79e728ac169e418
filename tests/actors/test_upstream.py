"""UpstreamPool against a real loopback HTTP/1.1 server written for the test."""

from __future__ import annotations

import socket
from collections.abc import Callable

import msgspec
import pytest
import trio

from actors.upstream import (
    UpstreamBrokenError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    nothing_received,
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class Server:
    """Answers by path, counts connections and notices clients that go away."""

    def __init__(self) -> None:
        self.port = 0
        self.connections = 0
        self.closed = 0
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.gate = trio.Event()
        self.disconnected = trio.Event()
        self.changed = trio.Event()

    def _touch(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        with trio.fail_after(5):
            while not predicate():
                await self.changed.wait()

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self._touch()
        buf = bytearray()
        try:
            while (req := await self._read_request(stream, buf)) is not None:
                self.requests.append(req)
                self._touch()
                if not await self._respond(stream, req):
                    return
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()
            self.closed += 1
            self._touch()

    @staticmethod
    async def _read_request(
        stream: trio.SocketStream, buf: bytearray
    ) -> tuple[str, str, dict[str, str], bytes] | None:
        while b"\r\n\r\n" not in buf:
            data = await stream.receive_some(65536)
            if not data:
                return None
            buf += data
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        first, *lines = head.decode().split("\r\n")
        method, path, _ = first.split(" ")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        size = int(headers.get("content-length", "0"))
        while len(rest) < size:
            data = await stream.receive_some(65536)
            if not data:
                return None
            rest += data
        buf[:] = rest[size:]
        return method, path, headers, rest[:size]

    async def _respond(self, stream: trio.SocketStream, req: tuple[str, str, dict[str, str], bytes]) -> bool:
        """Answers one request; False closes the connection."""
        method, path, headers, body = req
        if path == "/cl":
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        elif path == "/echo":
            doc = msgspec.json.encode({"method": method, "headers": headers, "body": body.decode()})
            await stream.send_all(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s" % (len(doc), doc))
        elif path == "/chunked":
            await stream.send_all(_CHUNKED_HEAD)
            for part in (b"a", b"bb", b"ccc"):
                await stream.send_all(_chunk(part))
            await stream.send_all(b"0\r\n\r\n")
        elif path == "/gated":
            await stream.send_all(_CHUNKED_HEAD + _chunk(b"first"))
            await self.gate.wait()
            await stream.send_all(_chunk(b"last") + b"0\r\n\r\n")
        elif path == "/hang":
            await stream.send_all(_CHUNKED_HEAD + _chunk(b"first"))
            try:
                while await stream.receive_some(65536):
                    pass
            except trio.BrokenResourceError:
                pass
            self.disconnected.set()
            return False
        elif path == "/close-after":  # like an idle timeout: closes without a Connection: close header
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return False
        elif path == "/connection-close":
            await stream.send_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
            return False
        elif path == "/truncated":
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            return False
        elif path == "/no-response":
            return False
        else:
            await stream.send_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        return True


@pytest.fixture
async def server(nursery: trio.Nursery) -> Server:
    srv = Server()
    listeners = await nursery.start(trio.serve_tcp, srv.handle, 0)
    srv.port = listeners[0].socket.getsockname()[1]
    return srv


def pool_for(srv: Server, *, max_idle: int = 8, idle_expiry_s: float = 4.0) -> UpstreamPool:
    return UpstreamPool(
        "127.0.0.1",
        srv.port,
        headers={"Authorization": "Bearer k"},
        max_idle=max_idle,
        idle_expiry_s=idle_expiry_s,
    )


async def test_keep_alive_reuses_one_connection(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5):
        for _ in range(3):
            resp = await pool.request("POST", "/cl", body=b"{}")
            assert resp.status_code == 200 and await resp.aread() == b"hello"
            await resp.aclose()
    assert server.connections == 1 and pool.connects == 1 and pool.idle_count == 1
    await pool.aclose()
    await server.wait_for(lambda: server.closed == 1)


async def test_request_head_and_body(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5):
        resp = await pool.request(
            "POST", "/echo", body=b'{"x": 1}', headers={"Content-Type": "application/json"}
        )
        doc = msgspec.json.decode(await resp.aread())
    assert resp.status_code == 201 and resp.header(b"content-length") is not None
    assert doc["method"] == "POST" and doc["body"] == '{"x": 1}'
    headers = doc["headers"]
    assert headers["authorization"] == "Bearer k" and headers["content-type"] == "application/json"
    assert headers["host"] == f"127.0.0.1:{server.port}" and headers["content-length"] == "8"
    await pool.aclose()


async def test_chunked_and_content_length_bodies(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5):
        resp = await pool.request("POST", "/chunked")
        assert resp.header(b"transfer-encoding") == b"chunked"
        assert b"".join([c async for c in resp.aiter_raw()]) == b"abbccc"
        resp = await pool.request("POST", "/chunked")
        assert await resp.aread() == b"abbccc"
        resp = await pool.request("POST", "/cl")
        assert b"".join([c async for c in resp.aiter_raw()]) == b"hello"
        assert await resp.aread() == b""  # read to its end already
    assert pool.connects == 1
    await pool.aclose()


async def test_body_arrives_as_it_is_sent(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5):
        resp = await pool.request("POST", "/gated")
        chunks = resp.aiter_raw()
        assert await chunks.__anext__() == b"first"  # before the server sends the rest
        server.gate.set()
        assert b"".join([c async for c in chunks]) == b"last"
    assert pool.idle_count == 1
    await pool.aclose()


async def test_aclose_mid_stream_closes_the_socket(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5):
        resp = await pool.request("POST", "/hang")
        assert await resp.aiter_raw().__anext__() == b"first"
        await resp.aclose()
        await resp.aclose()  # idempotent
        await server.disconnected.wait()
        with pytest.raises(UpstreamError):
            await resp.aread()
    assert pool.idle_count == 0
    await pool.aclose()


async def test_aclose_under_cancellation_still_closes(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5):
        resp = await pool.request("POST", "/hang")
        with trio.CancelScope() as scope:
            try:
                scope.cancel()
                await resp.aread()
            finally:
                await resp.aclose()
        assert scope.cancelled_caught
        await server.disconnected.wait()
    await pool.aclose()


async def test_stale_keep_alive_connection_is_retried(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5):
        resp = await pool.request("POST", "/close-after")
        assert await resp.aread() == b"ok"
        assert pool.idle_count == 1  # the server gave no sign that it would close it
        await server.wait_for(lambda: server.closed == 1)
        resp = await pool.request("POST", "/cl")
        assert await resp.aread() == b"hello"
    assert pool.connects == 2 and server.connections == 2
    assert [r[1] for r in server.requests] == ["/close-after", "/cl"]
    await pool.aclose()


async def test_retried_only_once(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5):
        resp = await pool.request("POST", "/close-after")
        assert await resp.aread() == b"ok"
        await server.wait_for(lambda: server.closed == 1)
        # The stale connection fails, the fresh one gets no response either: an error, no loop.
        with pytest.raises(UpstreamBrokenError, match="without a response"):
            await pool.request("POST", "/no-response")
    assert pool.connects == 2 and [r[1] for r in server.requests] == ["/close-after", "/no-response"]
    await pool.aclose()


async def test_connection_close_header_is_honoured(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5):
        resp = await pool.request("POST", "/connection-close")
        assert await resp.aread() == b"ok"
    assert pool.idle_count == 0
    await pool.aclose()


async def test_fresh_connection_without_response_is_an_error(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5), pytest.raises(UpstreamBrokenError, match="without a response") as info:
        await pool.request("POST", "/no-response")
    assert pool.connects == 1  # a new connection is not retried
    assert nothing_received(info.value)  # the caller may tell that nothing was answered
    await pool.aclose()


async def test_broken_mid_response(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5):
        resp = await pool.request("POST", "/truncated")
        with pytest.raises(UpstreamBrokenError, match="midway") as info:
            await resp.aread()
        await resp.aclose()
    assert not nothing_received(info.value)
    assert pool.idle_count == 0
    await pool.aclose()


async def test_connect_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        pool = UpstreamPool("127.0.0.1", port, headers={}, max_idle=4, idle_expiry_s=4.0)
        with trio.fail_after(5), pytest.raises(UpstreamConnectError, match=f"127.0.0.1:{port}") as info:
            await pool.request("POST", "/cl")
    assert nothing_received(info.value)


async def test_concurrent_requests_use_separate_connections(server: Server) -> None:
    pool = pool_for(server, max_idle=2)
    bodies: list[bytes] = []

    async def one() -> None:
        resp = await pool.request("POST", "/gated")
        bodies.append(await resp.aread())

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(one)
            await server.wait_for(lambda: len(server.requests) == 4)
            server.gate.set()
        assert bodies == [b"firstlast"] * 4
        assert server.connections == 4 and pool.connects == 4
        # At most max_idle are kept; the others are closed.
        assert pool.idle_count == 2
        await server.wait_for(lambda: server.closed == 2)
    await pool.aclose()


async def test_idle_connections_expire() -> None:
    srv = Server()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, srv.handle, 0)
        srv.port = listeners[0].socket.getsockname()[1]
        pool = pool_for(srv, idle_expiry_s=0.05)
        with trio.fail_after(5):
            for _ in range(2):
                resp = await pool.request("POST", "/cl")
                await resp.aread()
                await trio.sleep(0.1)
            assert pool.connects == 2
            await srv.wait_for(lambda: srv.closed == 1)
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_closed_pool_refuses_and_closes_active(server: Server) -> None:
    pool = pool_for(server)
    with trio.fail_after(5):
        resp = await pool.request("POST", "/hang")
        await pool.aclose()
        await server.disconnected.wait()
        with pytest.raises(UpstreamError, match="closed"):
            await pool.request("POST", "/cl")
        await resp.aclose()
