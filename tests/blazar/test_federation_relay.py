"""The relay against real servers on loopback: a peer that cannot be reached before the answer
starts is passed over for the next (and marked down); the answer's bytes are the peer's."""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import msgspec
import pytest
import trio

from actors.config import Remote
from actors.peer import RELAYED_HEADER
from actors.peers import Peers
from actors.runtime import Runtime
from blazar.errors import BlazarError, Dialect
from blazar.serve.federation import peer_targets, relay, split_remote, stream_error
from blazar.web.asgi.call import Call
from tests.support import ROOT, free_port, self_signed_cert, unreachable_url

REPLY = "relayed bytes"


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, str(ROOT / "bench" / "instant_upstream.py")),
            *("--port", str(port), "--alias", "tiny", "--reply", REPLY),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        yield port
    finally:
        proc.kill()
        proc.wait()


def _call(body: dict[str, object], *, path: str = "/v1/chat/completions") -> Call:
    scope = {
        "method": "POST",
        "path": path,
        "headers": [
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer the-callers-own-key"),
        ],
        "client": ("127.0.0.1", 5555),
    }
    call = Call(scope, trace_id="blz-test-1", max_body=1 << 20)
    call.body = msgspec.json.encode(body)
    return call


async def _until(cond: Callable[[], bool]) -> None:
    with trio.fail_after(30):
        while True:
            if cond():
                return
            await trio.sleep(0.02)


async def _drain(body: bytes | AsyncIterator[bytes]) -> bytes:
    if isinstance(body, bytes):
        return body
    return b"".join([chunk async for chunk in body])


async def test_a_peer_unreachable_before_the_answer_is_passed_over_for_the_next(upstream: int) -> None:
    peers = Peers(
        [
            Remote(name="dead", url=unreachable_url(), poll_s=60, poll_max_s=60),
            Remote(name="live", url=f"http://127.0.0.1:{upstream}", poll_s=60, poll_max_s=60),
        ]
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.run)
        dead, live = peers.actors["dead"], peers.actors["live"]
        await _until(lambda: live.state == "up")
        dead.state = "up"  # as if its last poll had found it, just before it went away
        call = _call({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True})
        with call, trio.fail_after(30):
            reply = await relay(call, [(dead, "tiny"), (live, "tiny")])
            assert reply.status == 200 and reply.content_type.startswith("text/event-stream")
            assert reply.headers is not None and reply.headers["X-Blazar-Peer"] == "live"
            assert reply.headers["X-Blazar-Peers-Passed"] == "dead"
            text = (await _drain(reply.body)).decode()
        assert "relayed" in text and text.rstrip().endswith("data: [DONE]")
        await _until(lambda: dead.state == "down")  # the relay told it
        nursery.cancel_scope.cancel()


async def test_a_remote_model_name_is_rewritten_for_the_peer(upstream: int) -> None:
    peers = Peers([Remote(name="live", url=f"http://127.0.0.1:{upstream}", poll_s=60, poll_max_s=60)])
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.run)
        call = _call({"model": "remote:live/tiny", "messages": [{"role": "user", "content": "hi"}]})
        with call, trio.fail_after(30):
            reply = await relay(call, [(peers.actors["live"], "tiny")])
        doc = msgspec.json.decode(await _drain(reply.body))
        assert doc["choices"][0]["message"]["content"] == REPLY
        nursery.cancel_scope.cancel()


async def test_no_peer_reachable_is_peer_unavailable() -> None:
    peers = Peers([Remote(name="dead", url=unreachable_url(), poll_s=60, poll_max_s=60)])
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.run)
        call = _call({"model": "tiny", "messages": []})
        with call, pytest.raises(BlazarError) as e, trio.fail_after(30):
            await relay(call, [(peers.actors["dead"], "tiny")])
        assert e.value.code == "PEER_UNAVAILABLE" and "dead" in e.value.message
        nursery.cancel_scope.cancel()


def test_remote_names_and_stream_errors() -> None:
    assert split_remote("remote:b/qwen3:8b") == ("b", "qwen3:8b")
    assert split_remote("qwen3") is None
    with pytest.raises(BlazarError):
        split_remote("remote:b")
    assert stream_error(Dialect.OPENAI, "PEER_FAILED", "x").startswith(b"data: {")
    assert stream_error(Dialect.ANTHROPIC, "PEER_FAILED", "x").startswith(b"event: error\ndata: ")
    line = stream_error(Dialect.OLLAMA, "PEER_FAILED", "x")
    assert msgspec.json.decode(line) == {"error": "x", "blazar_code": "PEER_FAILED"}
    assert RELAYED_HEADER == "x-blazar-relayed-by"


async def test_remote_with_a_dns_remote_s_name_goes_to_one_of_its_peers(upstream: int) -> None:
    remote = Remote(name="pool", dns="localhost", port=upstream, poll_s=0.2, poll_max_s=1, resolve_s=60)
    peers = Peers([remote])
    runtime = cast(Runtime, SimpleNamespace(peers=peers))
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.run)
        await _until(
            lambda: "pool-127.0.0.1" in peers.actors and peers.actors["pool-127.0.0.1"].state == "up"
        )
        call = _call({"model": "remote:pool/tiny", "messages": []})
        ((actor, model),) = peer_targets(runtime, call, "pool", "tiny")
        assert (actor.peer, model) == ("pool-127.0.0.1", "tiny")
        with pytest.raises(BlazarError) as e:
            peer_targets(runtime, call, "pool", "not-there")
        assert e.value.code == "PEER_UNAVAILABLE"
        with pytest.raises(BlazarError) as e:
            peer_targets(runtime, call, "elsewhere", "tiny")
        assert e.value.code == "PEER_NOT_FOUND" and "pool-127.0.0.1" in e.value.message
        nursery.cancel_scope.cancel()


async def test_a_plain_http_peer_is_relayed_over_its_kept_connections(upstream: int) -> None:
    """The relay's own pool (not httpx) carries a plain-HTTP peer's requests, and keeps its
    connection for the next one."""
    peers = Peers([Remote(name="live", url=f"http://127.0.0.1:{upstream}/", poll_s=60, poll_max_s=60)])
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.run)
        live = peers.actors["live"]
        assert live.relay_pool is not None
        pool, prefix = live.relay_pool
        assert prefix == ""
        for stream in (True, False, True):
            call = _call({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
            with call, trio.fail_after(30):
                reply = await relay(call, [(live, "tiny")])
                text = (await _drain(reply.body)).decode()
            assert REPLY.split()[0] in text
        assert pool.connects == 1
        nursery.cancel_scope.cancel()


async def _tls_peer(cert: Path, key: Path, seen: list[bytes], task_status: trio.TaskStatus[int]) -> None:
    """A TLS server that answers every request with one short event stream."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    events = b'data: {"choices":[{"delta":{"content":"over tls"}}]}\n\ndata: [DONE]\n\n'

    async def answer(stream: trio.SSLStream[trio.SocketStream]) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some()
        head, _, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        while length is not None and len(body) < int(length[1]):
            body += await stream.receive_some()
        seen.append(head)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(events), events)
        )
        await stream.aclose()

    listeners = await trio.open_ssl_over_tcp_listeners(0, context, host="127.0.0.1")
    task_status.started(listeners[0].transport_listener.socket.getsockname()[1])
    await trio.serve_listeners(answer, listeners)


async def test_a_tls_peer_is_relayed_through_its_trusted_client(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    seen: list[bytes] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_tls_peer, cert, key, seen)
        remote = Remote(
            name="tls", url=f"https://localhost:{port}", ca_file=str(cert), key="k1", poll_s=60, poll_max_s=60
        )
        peers = Peers([remote])
        await nursery.start(peers.run)
        actor = peers.actors["tls"]
        assert actor.relay_pool is None  # TLS stays with httpx and its trust settings
        call = _call({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True})
        with call, trio.fail_after(30):
            reply = await relay(call, [(actor, "tiny")])
            text = (await _drain(reply.body)).decode()
        assert "over tls" in text and text.rstrip().endswith("data: [DONE]")
        relayed = next(h for h in seen if h.startswith(b"POST /v1/chat/completions"))
        assert b"authorization: bearer k1" in relayed.lower()  # this daemon's key for the peer
        assert b"the-callers-own-key" not in relayed  # the caller's key is never forwarded
        nursery.cancel_scope.cancel()
