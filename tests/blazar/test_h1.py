"""The daemon's own HTTP/1.1 connection (``blazar.web.asgi.h1``), on a real socket pair:
keep-alive, pipelining, HTTP/1.0, ``100-continue``, chunked bodies both ways, refused
heads in words, the client's going, timeouts, and the hand-over of an upgrade."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from blazar.web.asgi.direct import DIRECT_BODY, WATCH_GONE
from blazar.web.asgi.h1 import H1Connection, Upgrade

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class Peer:
    """The client's end: raw bytes out, answers read back."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.buffer = b""

    async def send(self, data: bytes) -> None:
        await self.sock.send(data)

    async def until(self, marker: bytes) -> bytes:
        with trio.fail_after(5):
            while marker not in self.buffer:
                data = await self.sock.recv(65536)
                assert data, f"the connection ended before {marker!r}: {self.buffer!r}"
                self.buffer += data
        got, _, self.buffer = self.buffer.partition(marker)
        return got + marker

    async def rest(self) -> bytes:
        """Everything up to the connection's end."""
        with trio.fail_after(5):
            while data := await self.sock.recv(65536):
                self.buffer += data
        got, self.buffer = self.buffer, b""
        return got


def refusal(status: int) -> bytes:
    return b"HTTP/1.1 %d No\r\nconnection: close\r\ncontent-length: 2\r\n\r\nno" % status


@asynccontextmanager
async def serving(app: App, **options: Any) -> AsyncIterator[tuple[Peer, H1Connection, list[bool]]]:
    ours, theirs = trio.socket.socketpair()
    busy: list[bool] = []
    settings: dict[str, Any] = {"header_timeout_s": 5.0, "keep_alive_timeout_s": 5.0, "max_head": 4096}
    settings.update(options)
    connection = H1Connection(ours, app, refusal=refusal, state={}, on_busy=busy.append, **settings)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        yield Peer(theirs), connection, busy
        theirs.close()


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers what it got: the scope's request line and the body, with a declared length."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = json.dumps(
        {
            "method": scope["method"],
            "path": scope["path"],
            "query": scope["query_string"].decode(),
            "body": body.decode(),
        }
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def body_of(answer: bytes) -> Any:
    return json.loads(answer.partition(b"\r\n\r\n")[2])


async def test_requests_on_one_kept_alive_connection_and_pipelined() -> None:
    async with serving(echo) as (peer, _, busy):
        await peer.send(b"GET /a%20b?x=1 HTTP/1.1\r\nHost: h\r\n\r\n")
        first = await peer.until(b"}")
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\ndate: " in first
        assert body_of(first) == {"method": "GET", "path": "/a b", "query": "x=1", "body": ""}
        two = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcPOST /q HTTP/1.1\r\nHost: h\r\n"
        await peer.send(two + b"Transfer-Encoding: chunked\r\n\r\n2\r\nde\r\n1\r\nf\r\n0\r\n\r\n")
        assert body_of(await peer.until(b"}"))["body"] == "abc"
        assert body_of(await peer.until(b"}")) == {"method": "POST", "path": "/q", "query": "", "body": "def"}
    assert busy == [True, False] * 3


async def test_http10_and_connection_close_end_the_connection() -> None:
    async with serving(echo) as (peer, _, _):
        await peer.send(b"GET / HTTP/1.0\r\n\r\n")
        answer = await peer.rest()
        assert b"connection: close\r\n" in answer and body_of(answer)["path"] == "/"
    async with serving(echo) as (peer, _, _):
        await peer.send(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        assert b"connection: close\r\n" in await peer.rest()


async def test_a_stream_is_chunked_and_a_head_request_gets_no_body() -> None:
    async def stream(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        writer = scope["extensions"][DIRECT_BODY]
        await writer.write(b"one")
        await send({"type": "http.response.body", "body": b"two", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async with serving(stream) as (peer, _, _):
        await peer.send(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        answer = await peer.until(b"0\r\n\r\n")
        assert b"transfer-encoding: chunked\r\n" in answer
        assert answer.endswith(b"\r\n\r\n3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n")
        await peer.send(b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n")
        head = await peer.until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        await peer.send(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")  # nothing of HEAD's body came before it
        assert (await peer.until(b"0\r\n\r\n")).startswith(b"HTTP/1.1 200 ")


async def test_expect_100_continue_is_answered_when_the_body_is_asked_for() -> None:
    async with serving(echo) as (peer, _, _):
        await peer.send(b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
        assert await peer.until(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        await peer.send(b"ok")
        assert body_of(await peer.until(b"}"))["body"] == "ok"


async def test_refused_heads_are_answered_in_words_and_the_connection_ends() -> None:
    async with serving(echo) as (peer, _, _):
        await peer.send(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n")
        assert (await peer.rest()).startswith(b"HTTP/1.1 400 ")
    async with serving(echo, max_head=1024) as (peer, _, _):
        await peer.send(b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + b"y" * 2000)  # not finished
        assert (await peer.rest()).startswith(b"HTTP/1.1 431 ")


async def test_the_clients_going_is_told_to_the_request() -> None:
    told = trio.Event()
    received: list[str] = []

    async def waits(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope["extensions"][WATCH_GONE](told.set)
        await receive()  # the body
        received.append((await receive())["type"])  # then only the client's going

    async with serving(waits) as (peer, connection, _):
        await peer.send(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n")
        await trio.sleep(0.05)
        peer.sock.close()
        with trio.fail_after(5):
            await told.wait()
    assert received == ["http.disconnect"] and connection.gone


async def test_a_silent_connection_is_closed_after_the_header_timeout() -> None:
    async with serving(echo, header_timeout_s=0.2) as (peer, _, _):
        assert await peer.rest() == b""


async def test_an_app_that_fails_is_answered_500_and_a_header_with_a_line_break_is_refused() -> None:
    async def fails(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/inject":
            headers = [(b"x-bad", b"a\r\nset-cookie: b")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        raise RuntimeError("a bug")

    for path in (b"/", b"/inject"):
        async with serving(fails) as (peer, _, _):
            await peer.send(b"GET " + path + b" HTTP/1.1\r\nHost: h\r\n\r\n")
            answer = await peer.rest()
            assert answer.startswith(b"HTTP/1.1 500 ") and b"set-cookie" not in answer
            assert body_of(answer)["error"]["blazar_code"] == "INTERNAL"


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/realtime HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ],
)
async def test_a_change_of_protocol_is_handed_over_with_what_was_read(head: bytes) -> None:
    ours, theirs = trio.socket.socketpair()
    connection = H1Connection(
        ours,
        echo,
        header_timeout_s=5,
        keep_alive_timeout_s=5,
        max_head=4096,
        refusal=refusal,
        state={},
        on_busy=lambda busy: None,
    )
    await theirs.send(head + b"more")
    with pytest.raises(Upgrade) as upgrade, trio.fail_after(5):
        await connection.run()
    assert upgrade.value.data.endswith(b"more")
    assert upgrade.value.data.lower().startswith(head.split(b"\r\n")[0].lower())
    assert ours.fileno() >= 0  # the socket is the other server's now
    ours.close()
    theirs.close()
