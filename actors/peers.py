"""The ``[[remotes]]`` as a set of peer actors (``actors/peer.py``) under one supervisor.

A remote with a ``url`` is one peer; a ``dns`` remote is resolved again and again
(``actors/discovery.py``), each address it names one peer, added and removed as the answer
changes. ``Peers`` is how the runtime, the federation's decision and the routes find them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence

import trio

from actors import discovery
from actors.config import Remote
from actors.errors import PeerNotFound
from actors.peer import PeerActor, PeerStatistics, PeerView, PollNow
from actors.supervisor import ChildSpec, Restart, Supervisor

__all__ = ["Peers"]

log = logging.getLogger("blazar.peers")


def _host_url(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


class Peers:
    """The ``[[remotes]]`` and their actors, under one supervisor (``run``)."""

    def __init__(
        self,
        remotes: list[Remote],
        *,
        instance: str | None = None,
        started: dict[str, tuple[str, dict[str, str]]] | None = None,
    ) -> None:
        self.remotes = remotes
        self.started = started or {}
        """A pool router started here (``start = true``): its URL and its control headers."""
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
                if remote.name in self.started:
                    url, control = self.started[remote.name]
                    await self._add(remote.name, url, remote)
                    self.actors[remote.name].control = control
                elif remote.url is not None:
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

    def require(self, name: str) -> PeerActor:
        """The peer named ``name``; raises ``PeerNotFound`` naming the peers there are."""
        actor = self.actors.get(name)
        if actor is None:
            raise self.not_found(name)
        return actor

    def not_found(self, name: str) -> PeerNotFound:
        """The error for a peer name that is none of these."""
        known = ", ".join(self.actors) or "none is configured"
        return PeerNotFound(
            f"no peer named '{name}' (peers: {known}) — add a [[remotes]] entry to config.toml "
            "or see `blazar peers`"
        )

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
