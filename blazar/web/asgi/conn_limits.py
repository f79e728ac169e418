"""The connection caps and who gives way when they are reached: pure bookkeeping, no I/O.

Every open connection holds a place, counted in all and per client address. A connection
is *sheddable* while it holds a place without using it: *fresh* (it has not yet sent a
whole request head) or *idle* (a keep-alive connection between requests). A newcomer past
a cap takes the place of the oldest sheddable connection that would free one (for the
per-address cap, the oldest of that address; for the total cap, the oldest of all), fresh
ones before idle ones; it is refused only when every place is in use by a request. The
caller closes the connections ``admit`` names; their places are already free.

Each sheddable set is an insertion-ordered dict (oldest first), so an admission, a state
change and a release each cost O(1).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Admitted", "ConnectionLimits", "Refused"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Admitted(Generic[K]):
    """The newcomer holds a place; ``shed`` are the connections to close for it (their places
    are already given back)."""

    shed: tuple[K, ...] = ()


@dataclass(frozen=True, slots=True)
class Refused:
    """No place could be freed: ``reason`` names the cap."""

    reason: str


class _Sheddable(Generic[K]):
    """One kind of sheddable connection (fresh or idle), oldest first, in all and per address."""

    def __init__(self) -> None:
        self.all: dict[K, None] = {}
        self.by_client: dict[str, dict[K, None]] = {}

    def add(self, key: K, client: str) -> None:
        self.all[key] = None
        self.by_client.setdefault(client, {})[key] = None

    def discard(self, key: K, client: str) -> bool:
        if key not in self.all:
            return False
        del self.all[key]
        mine = self.by_client[client]
        del mine[key]
        if not mine:
            del self.by_client[client]
        return True

    def oldest(self, client: str | None) -> K | None:
        keys = self.all if client is None else self.by_client.get(client)
        return next(iter(keys), None) if keys else None


class ConnectionLimits(Generic[K]):
    """Open connections, in all and per client address, and which of them may give way.

    ``K`` is whatever identifies a connection (the listener uses the connection object)."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self.open = 0
        self.by_client: dict[str, int] = {}
        self._client_of: dict[K, str] = {}
        self._fresh: _Sheddable[K] = _Sheddable()
        self._idle: _Sheddable[K] = _Sheddable()
        self.refused = 0
        self.shed_fresh = 0
        self.shed_idle = 0

    def admit(self, key: K, client: str) -> Admitted[K] | Refused:
        """A new connection from ``client``: a place for it, freed from sheddable ones if a cap
        is reached, or why not. Admitted, it counts as fresh."""
        shed: list[K] = []
        if self.by_client.get(client, 0) >= self.per_client:
            victim = self._victim(client)
            if victim is None:
                return self._refuse(
                    f"{client} holds its maximum of {self.per_client} connections, all in use by "
                    "requests (max_connections_per_client)"
                )
            shed.append(victim)
        if self.open - len(shed) >= self.total:
            victim = self._victim(None)
            if victim is None:
                return self._refuse(
                    f"the daemon holds its maximum of {self.total} connections, all in use by requests "
                    "(max_connections)"
                )
            shed.append(victim)
        for victim in shed:
            if self._fresh.discard(victim, self._client_of[victim]):
                self.shed_fresh += 1
            else:
                self.shed_idle += 1
            self.release(victim)
        self.open += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1
        self._client_of[key] = client
        self._fresh.add(key, client)
        return Admitted(tuple(shed))

    def busy(self, key: K) -> None:
        """``key`` received a whole request head: it is in use until it is idle again."""
        client = self._client_of.get(key)
        if client is not None and not self._fresh.discard(key, client):
            self._idle.discard(key, client)

    def idle(self, key: K) -> None:
        """``key`` answered its requests and waits for another: the newest idle connection."""
        client = self._client_of.get(key)
        if client is not None and key not in self._idle.all and key not in self._fresh.all:
            self._idle.add(key, client)

    def release(self, key: K) -> bool:
        """``key`` is closed: its place is free. False when it held none (already shed)."""
        client = self._client_of.pop(key, None)
        if client is None:
            return False
        if not self._fresh.discard(key, client):
            self._idle.discard(key, client)
        self.open -= 1
        held = self.by_client[client] - 1
        if held:
            self.by_client[client] = held
        else:
            del self.by_client[client]
        return True

    def sheddable(self) -> tuple[int, int]:
        """How many connections are fresh and how many idle now."""
        return len(self._fresh.all), len(self._idle.all)

    def _victim(self, client: str | None) -> K | None:
        victim = self._fresh.oldest(client)
        return victim if victim is not None else self._idle.oldest(client)

    def _refuse(self, reason: str) -> Refused:
        self.refused += 1
        return Refused(reason)
