"""Peer actors against real servers on loopback: the instant upstream as a pass-through peer
found through DNS (``localhost``), and a port where nothing listens."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import trio

from actors.config import Remote
from actors.peer import PollNow
from actors.peers import Peers
from tests.stub_dns import stub_dns
from tests.support import ROOT, free_port, unreachable_url


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "instant_upstream.py"), "--port", str(port), "--alias", "tiny"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:  # listening before the tests poll it
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


async def _until(cond: Callable[[], bool], what: str) -> None:
    with trio.fail_after(30):
        while True:
            if cond():
                return
            await trio.sleep(0.05)


async def test_a_dns_remote_makes_a_peer_per_address_and_reads_a_plain_server_as_pass_through(
    upstream: int,
) -> None:
    remote = Remote(name="pool", dns="localhost", port=upstream, poll_s=0.2, resolve_s=0.2)
    peers = Peers([remote])
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.run)
        await _until(lambda: "pool-127.0.0.1" in peers.actors, "the DNS answer")
        actor = peers.actors["pool-127.0.0.1"]
        assert actor.url == f"http://127.0.0.1:{upstream}"
        view = await actor.ask(PollNow())
        assert view.state == "up" and view.kind == "openai"
        assert view.snapshot is not None and view.snapshot.has("tiny") and view.snapshot.free_bytes is None
        assert view.snapshot_age_s is not None and view.snapshot_age_s < 5
        # the name stops answering with that address: its peer is dropped
        await peers.reconcile(remote, [])
        assert "pool-127.0.0.1" not in peers.actors
        nursery.cancel_scope.cancel()


async def test_a_peer_nobody_answers_for_is_down_and_polled_with_a_backoff() -> None:
    peers = Peers([Remote(name="gone", url=unreachable_url(), poll_s=0.1, poll_max_s=0.4)])
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.run)
        actor = peers.actors["gone"]
        view = await actor.ask(PollNow())
        assert view.state == "down" and view.snapshot is None and "connect" in (view.last_error or "")
        await _until(lambda: actor.failures >= 4, "more failed polls")
        stats = actor.statistics()
        assert stats.state == "down" and stats.polls >= 4
        (listed,) = await peers.poll_all()
        assert listed.name == "gone" and listed.state == "down"
        nursery.cancel_scope.cancel()


def test_no_remote_no_peer() -> None:
    peers = Peers([])
    assert not peers and peers.views() == []


async def test_a_restarted_peer_actor_has_a_usable_client_again(upstream: int) -> None:
    peers = Peers([Remote(name="one", url=f"http://127.0.0.1:{upstream}", poll_s=60, poll_max_s=60)])
    actor = peers.actors.get("one")
    assert actor is None  # made when the group runs
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.run)
        actor = peers.actors["one"]
        await actor.client.aclose()  # as a crashed run's on_stop leaves it
        await actor.on_start()
        assert not actor.client.is_closed
        assert (await actor.ask(PollNow())).state == "up"
        nursery.cancel_scope.cancel()


async def _serve_capacity(
    instance: str,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A server on ``host``:``port`` that answers every request with a Blazar capacity
    document of boot ``instance``."""
    body = (
        b'{"daemon": "blazar", "version": "0.1.0", "instance": "' + instance.encode() + b'", '
        b'"census": {}, "models": [], "installed": [{"name": "tiny", "size_bytes": 1}]}'
    )
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )

    async def handle(stream: trio.SocketStream) -> None:
        data = b""
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
            while b"\r\n\r\n" in data:
                _, data = data.split(b"\r\n\r\n", 1)
                await stream.send_all(answer)

    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


async def test_a_peer_that_publishes_this_daemons_boot_id_is_itself() -> None:
    # A Kubernetes headless service lists every pod, this one's too: the peer whose capacity
    # carries this daemon's own boot id is marked `self`, never `up`.
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_serve_capacity, "boot-a")
        remote = Remote(name="pool", dns="localhost", port=port, poll_s=0.2, resolve_s=60)
        own = Peers([remote], instance="boot-a")
        other = Peers([remote], instance="boot-b")
        await nursery.start(own.run)
        await nursery.start(other.run)
        await _until(lambda: "pool-127.0.0.1" in own.actors and "pool-127.0.0.1" in other.actors, "DNS")
        itself = await own.actors["pool-127.0.0.1"].ask(PollNow())
        assert itself.state == "self" and itself.snapshot is None and itself.last_error is None
        peer = await other.actors["pool-127.0.0.1"].ask(PollNow())
        assert peer.state == "up" and peer.snapshot is not None and peer.snapshot.instance == "boot-a"
        nursery.cancel_scope.cancel()


async def test_a_dns_remote_follows_the_names_a_nameserver_it_is_pointed_at_gives() -> None:
    # Two daemons on 127.0.0.2 and 127.0.0.3 (the whole of 127/8 is loopback), one port, one
    # name with both A records in a nameserver the test controls; then a pod goes away, and an
    # SRV name gives two more on 127.0.0.1 with their own ports.
    port = free_port()
    with stub_dns() as dns:
        dns.records[("pool.test", "A")] = ["127.0.0.2", "127.0.0.3"]
        plain = Remote(
            name="pool", dns="pool.test", dns_server=dns.server, port=port, poll_s=0.2, resolve_s=0.1
        )
        async with trio.open_nursery() as nursery:
            for n in (2, 3):
                await nursery.start(_serve_capacity, f"boot-{n}", f"127.0.0.{n}", port)
            peers = Peers([plain], instance="boot-a")
            await nursery.start(peers.run)
            await _until(lambda: {"pool-127.0.0.2", "pool-127.0.0.3"} <= set(peers.actors), "both A records")
            for n in (2, 3):
                view = await peers.actors[f"pool-127.0.0.{n}"].ask(PollNow())
                assert view.state == "up" and view.snapshot is not None
                assert view.snapshot.instance == f"boot-{n}"
            dns.records[("pool.test", "A")] = ["127.0.0.2"]
            await _until(lambda: "pool-127.0.0.3" not in peers.actors, "the record that went away")
            assert [a.peer for a in peers.members("pool")] == ["pool-127.0.0.2"]
            # the name stops resolving at all: the peers found before are kept
            del dns.records[("pool.test", "A")]
            queried = len(dns.queries)
            await _until(lambda: len(dns.queries) > queried + 2, "more lookups")
            assert [a.peer for a in peers.members("pool")] == ["pool-127.0.0.2"]

            one = await nursery.start(_serve_capacity, "boot-s1")
            two = await nursery.start(_serve_capacity, "boot-s2")
            srv_name = "_blazar._tcp.pool.test"
            dns.records[(srv_name, "SRV")] = [f"0 0 {one} a.pool.test.", f"0 0 {two} b.pool.test."]
            dns.records[("a.pool.test", "A")] = ["127.0.0.1"]
            dns.records[("b.pool.test", "A")] = ["127.0.0.1"]
            srv = Remote(name="srv", dns=srv_name, dns_server=dns.server, poll_s=0.2, resolve_s=60)
            by_srv = Peers([srv])
            await nursery.start(by_srv.run)
            names = {f"srv-127.0.0.1-{one}", f"srv-127.0.0.1-{two}"}
            await _until(lambda: set(by_srv.actors) == names, "both SRV records")
            view = await by_srv.actors[f"srv-127.0.0.1-{two}"].ask(PollNow())
            assert view.state == "up" and view.snapshot is not None and view.snapshot.instance == "boot-s2"
            nursery.cancel_scope.cancel()
