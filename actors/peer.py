"""Peers: one actor per ``[[remotes]]`` peer, which polls what the peer publishes.

    peers (supervisor)
    ├ peer[name]        → GET /api/capacity (a Blazar daemon) or GET /v1/models (pass-through)
    └ dns[name]         → resolves a ``dns`` remote again and again, adding and removing peers

A peer actor wakes every ``poll_s`` (its deadline hook), reads the peer's capacity on its own
task, and takes the answer back through its mailbox: a good answer marks the peer up and
keeps it as the last snapshot (with its time); a failure marks it down and polls again after
a backoff that doubles up to ``poll_max_s``. A peer that has no ``/api/capacity`` but answers
``/v1/models`` is a pass-through peer: any OpenAI-compatible server, routed to by model name.

Requests do not go through the actor's loop: a relay takes the peer's pooled HTTP client
(``PeerActor.client``) and reports a failure with ``failed_nowait``, which marks the peer down
at once so the next decision skips it. Nothing here runs when no remote is configured.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, assert_never

import httpx
import msgspec
import trio

from actors import discovery
from actors.actor import Actor, ActorStatistics
from actors.config import Remote
from actors.federation import Snapshot, SnapshotError, parse_capacity, parse_models
from actors.mailbox import Envelope
from actors.supervisor import ChildSpec, Restart, Supervisor

__all__ = ["PeerActor", "PeerStatistics", "PeerView", "Peers", "PollNow"]

log = logging.getLogger("blazar.peers")

PeerState = Literal["unknown", "up", "down", "self"]
"""``self``: the peer is this daemon (its own address in a ``dns`` remote's answer, as a
Kubernetes headless service gives every pod): never routed to."""

RELAYED_HEADER = "x-blazar-relayed-by"
"""Set on every request a daemon relays: the peer serves it itself, never relays it on."""


class PollNow(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Poll the peer now; the reply is its ``PeerView`` once the poll is over."""


class Failed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A relayed request could not reach the peer: mark it down until a poll finds it up."""

    reason: str


class _Polled(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    snapshot: Snapshot | None
    error: str | None = None


PeerMessage = PollNow | Failed | _Polled


class PeerView(msgspec.Struct, frozen=True, kw_only=True):
    """One peer as ``blazar peers`` and the decision see it."""

    name: str
    remote: str
    """The ``[[remotes]]`` entry it comes from: its own name, or a ``dns`` remote's."""
    url: str
    state: PeerState
    kind: Literal["blazar", "openai"] | None
    snapshot_age_s: float | None
    """Seconds since the last good snapshot; None: never had one."""
    last_error: str | None
    failures: int
    """Failed polls in a row."""
    snapshot: Snapshot | None


class PeerStatistics(ActorStatistics, frozen=True, kw_only=True):
    peer: str
    state: str
    polls: int
    failures: int


def _client(remote: Remote, url: str) -> httpx.AsyncClient:
    verify: bool | str = remote.ca_file if remote.ca_file is not None else remote.tls_verify
    headers = {"Authorization": f"Bearer {remote.key}"} if remote.key else {}
    timeout = httpx.Timeout(
        connect=remote.timeout_s, read=None, write=remote.timeout_s, pool=remote.timeout_s
    )
    return httpx.AsyncClient(base_url=url, headers=headers, verify=verify, timeout=timeout, trust_env=False)


class PeerActor(Actor[PeerMessage]):
    def __init__(self, name: str, url: str, remote: Remote, *, instance: str | None = None) -> None:
        super().__init__(f"peer[{name}]")
        self.peer = name
        self.instance = instance
        """This daemon's id for this boot: a peer that publishes the same one is this daemon."""
        self.url = url.rstrip("/")
        self.remote = remote
        self.client = _client(remote, self.url)
        """The pooled client for this peer, with this daemon's key for it."""
        self.state: PeerState = "unknown"
        self.snapshot: Snapshot | None = None
        self.snapshot_at: float | None = None
        """``time.time()`` of the last good snapshot."""
        self.last_error: str | None = None
        self.failures = 0
        self._polls = 0
        self._polling = False
        self._next_poll = -math.inf
        self._waiting: list[Envelope[PeerMessage]] = []

    def __repr__(self) -> str:
        return f"<PeerActor {self.peer} {self.state} failures={self.failures}>"

    async def on_start(self) -> None:
        if self.client.is_closed:  # restarted by its supervisor: the last run closed it
            self.client = _client(self.remote, self.url)

    async def on_stop(self) -> None:
        with trio.move_on_after(1):
            await self.client.aclose()

    def failed_nowait(self, reason: str) -> None:
        try:
            self.tell_nowait(Failed(reason=reason))
        except Exception:  # stopped, or a full mailbox: the next poll says the same
            pass

    def dispatch(self, env: Envelope[PeerMessage]) -> None:
        message = env.message
        match message:
            case PollNow():
                self._waiting.append(env)
                self._next_poll = -math.inf
            case Failed(reason=reason):
                self._down(reason)
                env.answer(None)
            case _Polled(snapshot=snapshot, error=error):
                self._polling = False
                if snapshot is not None and self.instance is not None and snapshot.instance == self.instance:
                    if self.state != "self":
                        log.info("peer '%s' is this daemon itself: not routed to", self.peer)
                    self.state, self.snapshot, self.snapshot_at = "self", None, None
                    self.failures, self.last_error = 0, None
                    self._next_poll = trio.current_time() + self.remote.poll_max_s
                elif snapshot is not None:
                    if self.state != "up":
                        log.info("peer '%s' is up (%s)", self.peer, snapshot.kind)
                    self.state, self.snapshot, self.snapshot_at = "up", snapshot, time.time()
                    self.failures, self.last_error = 0, None
                    self._next_poll = trio.current_time() + self.remote.poll_s
                else:
                    self._down(error or "no answer")
                waiting, self._waiting = self._waiting, []
                for w in waiting:
                    w.answer(self.view())
                env.answer(None)
            case _:
                assert_never(message)

    def _down(self, reason: str) -> None:
        if self.state != "down":
            log.warning("peer '%s' is down: %s", self.peer, reason)
        self.state, self.last_error = "down", reason
        self.failures += 1
        backoff = min(self.remote.poll_max_s, self.remote.poll_s * 2 ** min(self.failures - 1, 16))
        self._next_poll = trio.current_time() + backoff

    def next_deadline(self) -> float:
        return math.inf if self._polling else self._next_poll

    def on_deadline(self) -> None:
        self._start_poll()

    def settle(self) -> None:
        if self._waiting and not self._polling:
            self._start_poll()

    def _start_poll(self) -> None:
        if self._polling:
            return
        self._polling = True
        self._polls += 1
        self.start_soon(self._poll)

    async def _poll(self) -> None:
        snapshot: Snapshot | None = None
        error: str | None = None
        try:
            with trio.fail_after(self.remote.timeout_s * 2):
                snapshot = await self._read()
        except trio.TooSlowError:
            error = f"no answer within {self.remote.timeout_s * 2:g} s"
        except (httpx.HTTPError, OSError, SnapshotError) as exc:
            error = _describe(exc)
        await self.tell(_Polled(snapshot=snapshot, error=error))

    async def _read(self) -> Snapshot:
        t = self.remote.timeout_s
        resp = await self.client.get("/api/capacity", timeout=t)
        if resp.status_code == 200:
            try:
                return parse_capacity(resp.content)
            except SnapshotError:
                pass  # some other server's /api/capacity: read it as a pass-through peer
        elif resp.status_code in (401, 403):
            raise SnapshotError(f"the peer refused this daemon's key ({resp.status_code}): check key")
        models = await self.client.get("/v1/models", timeout=t)
        if models.status_code != 200:
            raise SnapshotError(f"GET /v1/models answered {models.status_code}")
        return parse_models(models.content)

    def view(self) -> PeerView:
        age = time.time() - self.snapshot_at if self.snapshot_at is not None else None
        return PeerView(
            name=self.peer,
            remote=self.remote.name,
            url=self.url,
            state=self.state,
            kind=self.snapshot.kind if self.snapshot is not None else None,
            snapshot_age_s=round(age, 3) if age is not None else None,
            last_error=self.last_error,
            failures=self.failures,
            snapshot=self.snapshot,
        )

    def statistics(self) -> PeerStatistics:
        return PeerStatistics(
            **self.actor_fields(), peer=self.peer, state=self.state, polls=self._polls, failures=self.failures
        )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {exc}" if str(exc) else "cannot connect"
    return str(exc) or type(exc).__name__


def _host_url(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


class Peers:
    """The ``[[remotes]]`` and their actors, under one supervisor (``run``)."""

    def __init__(self, remotes: list[Remote], *, instance: str | None = None) -> None:
        self.remotes = remotes
        self.instance = instance
        """This daemon's id for this boot (``GET /api/capacity`` publishes it): how a peer that
        is this daemon is told apart."""
        self.supervisor = Supervisor("peers", max_restarts=5, window_s=30.0)
        self.actors: dict[str, PeerActor] = {}
        """Peer name → its actor (a ``dns`` remote adds one per address)."""

    def __repr__(self) -> str:
        up = sum(a.state == "up" for a in self.actors.values())
        return f"<Peers {up}/{len(self.actors)} up>"

    def __bool__(self) -> bool:
        return bool(self.remotes)

    async def run(self, *, task_status: trio.TaskStatus[Peers] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.supervisor.run)
            for remote in self.remotes:
                if remote.url is not None:
                    await self._add(remote.name, remote.url, remote)
                else:
                    spec = ChildSpec(
                        name=f"dns[{remote.name}]", start=self._resolver(remote), restart=Restart.PERMANENT
                    )
                    await self.supervisor.start_child(spec)
            task_status.started(self)

    async def _add(self, name: str, url: str, remote: Remote) -> None:
        actor = PeerActor(name, url, remote, instance=self.instance)
        await self.supervisor.start_child(ChildSpec(name=name, start=actor.run, restart=Restart.PERMANENT))
        self.actors[name] = actor

    async def _remove(self, name: str) -> None:
        self.actors.pop(name, None)
        await self.supervisor.stop_child(name)

    def _resolver(self, remote: Remote) -> Callable[..., Awaitable[None]]:
        async def resolve(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            assert remote.dns is not None
            server = remote.dns_server
            lookup = functools.partial(discovery.resolve, remote.dns, port=remote.port, server=server)
            task_status.started()
            while True:
                try:
                    endpoints = await trio.to_thread.run_sync(lookup, abandon_on_cancel=True)
                except discovery.LookupFailed as exc:
                    log.warning("remote '%s': cannot resolve %s: %s", remote.name, remote.dns, exc)
                else:
                    await self.reconcile(remote, endpoints)
                await trio.sleep(remote.resolve_s)

        return resolve

    async def reconcile(self, remote: Remote, endpoints: Sequence[discovery.Endpoint | str]) -> None:
        """Make the peers of ``dns`` remote ``remote`` be those at ``endpoints`` (a bare
        address is on the remote's ``port``). A peer is named ``NAME-ADDRESS``, or
        ``NAME-ADDRESS-PORT`` when its port came from an SRV record."""
        wanted: dict[str, str] = {}
        for e in endpoints:
            address, port = (e, remote.port) if isinstance(e, str) else e
            assert port is not None
            name = f"{remote.name}-{address}" if port == remote.port else f"{remote.name}-{address}-{port}"
            wanted[name] = _host_url(remote.scheme, address, port)
        prefix = f"{remote.name}-"
        for name in [n for n, a in self.actors.items() if n.startswith(prefix) and a.remote is remote]:
            if name not in wanted:
                log.info("remote '%s': %s left the DNS answer", remote.name, name)
                await self._remove(name)
        for name, url in wanted.items():
            if name not in self.actors:
                log.info("remote '%s': %s joined (%s)", remote.name, name, url)
                await self._add(name, url, remote)

    def get(self, name: str) -> PeerActor | None:
        return self.actors.get(name)

    def members(self, remote: str) -> list[PeerActor]:
        """The peers a ``dns`` remote named ``remote`` has now (empty for any other name)."""
        return [a for a in self.actors.values() if a.remote.name == remote and a.remote.dns is not None]

    def views(self) -> list[PeerView]:
        return [a.view() for a in self.actors.values()]

    async def poll_all(self) -> list[PeerView]:
        """Poll every peer now, side by side; their views once every poll is over."""
        views: dict[str, PeerView] = {}

        async def one(actor: PeerActor) -> None:
            try:
                views[actor.peer] = await actor.ask(PollNow())
            except Exception:
                views[actor.peer] = actor.view()

        async with trio.open_nursery() as nursery:
            for actor in list(self.actors.values()):
                nursery.start_soon(one, actor)
        return [views[n] for n in self.actors if n in views]

    def statistics(self) -> list[PeerStatistics]:
        return [a.statistics() for a in self.actors.values()]
