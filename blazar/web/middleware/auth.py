"""The gateway's auth step: who is calling (an API key, or the local token), whether that
key may call this route, and its place under the key's limits.

Auth is on as soon as one key exists (``blazar keys add``); then every route but
``/health`` and ``/healthz`` (and CORS preflights, which carry no credentials)
needs a key, as ``Authorization: Bearer …`` or ``x-api-key``. The daemon's
per-boot local token (``run/local.token``, mode 0600) authenticates the CLI on
this machine as ``local``, with every scope and no limits. A daemon bound beyond
loopback without ``insecure_open`` stays closed even when the last key is
removed: then only the local token gets in.

Batch items run through the gateway with the local token and ``x-blazar-act-as:
NAME``, the key that made the batch: that header is honoured only beside the local
token, and then the request gets that key's grant, scopes and limits, never the
local token's. Acting as a key can only narrow what the caller may do. Such a
request is *patient*: over its key's rate or concurrency it waits for the window or
a place instead of being refused (batch work is not interactive).

A request waiting for its key's concurrency place (or, patient, for its rate
window) leaves the wait as soon as its client disconnects (``gone``).

It runs after the host guard (a page or a DNS-rebound name is refused before any key
is looked at, and before it could wait for a key's place) and before the route; its
``leave`` runs after the request's cleanups, which may fill in the tokens it charges.
Which scope a route needs, and how a secret is presented, are ``blazar.web.asgi.auth``'s:
routes ask those too.

Per request this costs a ``PRAGMA data_version`` (has the CLI changed the keys?),
one SHA-256 of the presented secret and a dict lookup: a few microseconds.
"""

from __future__ import annotations

import hmac
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from blazar.auth import limits
from blazar.auth.keys import LOCAL_NAME, Key, KeyStore, digest_of, matches
from blazar.errors import BlazarError
from blazar.serve.context import ACT_AS
from blazar.web.asgi.auth import ANY, LOCAL_KEY, OPEN, WATCHES, family_of, presented_secret
from blazar.web.asgi.call import Call

Gone = Callable[[], Awaitable[None]]
"""Returns once the request's client has disconnected."""

__all__ = ["Auth", "Gone"]


class Auth:
    """Keys (reloaded when ``keys.db`` changes), the local token, and each key's usage."""

    def __init__(
        self,
        store: KeyStore,
        *,
        local_token: str,
        closed_when_empty: bool = False,
        queue_over_concurrency: bool = False,
    ) -> None:
        self.store = store
        self.local_token = local_token
        self.closed_when_empty = closed_when_empty
        self.queue = queue_over_concurrency
        self.keys: dict[str, Key] = {}
        self._by_digest: dict[str, Key] = {}
        self.usage: dict[str, limits.Usage] = {}
        self._waiters: dict[str, deque[trio.Event]] = {}
        self.unauthorized = 0
        self.refresh()

    def refresh(self) -> None:
        if not self.store.changed():
            return
        keys = {k.name: k for k in self.store.list()}
        self.keys = keys
        self._by_digest = {k.digest: k for k in keys.values()}
        # Usage outlives a rotation (same name); a removed key's goes once nothing runs on it.
        for name in [n for n, u in self.usage.items() if n not in keys and u.in_flight == 0]:
            del self.usage[name]
        for name in keys:
            self.usage.setdefault(name, limits.Usage())

    @property
    def enabled(self) -> bool:
        return bool(self.keys) or self.closed_when_empty

    def local_headers(self) -> dict[str, str]:
        """Headers that authenticate as the local token (in-process callers: batch items)."""
        return {"authorization": f"Bearer {self.local_token}"}

    async def enter(self, call: Call, gone: Gone | None = None) -> BlazarError | None:
        """Authenticate and authorise ``call``; take its place under the key's limits.

        On success ``call.key``/``call.grant`` (and the card's key) name the key, and
        ``leave`` must follow when the request ends. ``gone`` (returns once the client
        has disconnected) ends a wait for the key's place at once."""
        self.refresh()
        family = family_of(call.path)
        if family == OPEN or call.method == "OPTIONS":
            return None
        act_as = call.headers.get(ACT_AS)
        if act_as is None and not self.enabled:
            return None
        secret = presented_secret(call.headers)
        if secret is not None and hmac.compare_digest(
            secret.encode("utf-8", "surrogatepass"), self.local_token.encode()
        ):
            if act_as is None:
                self._grant(call, LOCAL_KEY)
                return None
            return await self._act_as(call, act_as, family, gone)
        if not self.enabled:
            return None  # an open daemon; ``x-blazar-act-as`` from anyone else means nothing
        if secret is None:
            self.unauthorized += 1
            return BlazarError(
                "UNAUTHORIZED",
                "this daemon needs an API key: send it as `Authorization: Bearer <key>` or "
                "`x-api-key: <key>` (the operator makes one with `blazar keys add NAME`)",
            )
        digest = digest_of(secret)
        key = self._by_digest.get(digest)
        if key is None or not matches(key, digest):
            self.unauthorized += 1
            # Never echo what was sent: a mistyped secret is still (nearly) a secret.
            return BlazarError(
                "UNAUTHORIZED",
                "invalid API key (missing or invalid API key; `blazar keys list` shows the keys "
                "by name and hint, `blazar keys rotate NAME` issues a new secret)",
            )
        return await self._admit(call, key, family, gone, patient=False)

    async def _act_as(self, call: Call, name: str, family: str, gone: Gone | None) -> BlazarError | None:
        """A batch item: the local token's caller runs it as the key ``name`` made the batch with."""
        if client := call.headers.get("x-blazar-client"):
            call.client = client  # the ledger names the batch, not the loopback address
        if name == LOCAL_NAME:
            self._grant(call, LOCAL_KEY)
            return None
        key = self.keys.get(name)
        if key is None:
            return _removed(name)
        return await self._admit(call, key, family, gone, patient=True)

    async def _admit(
        self, call: Call, key: Key, family: str, gone: Gone | None, *, patient: bool
    ) -> BlazarError | None:
        """``key`` is authentic: check its expiry and scope, then take a place under its limits.

        A ``patient`` request (a batch item) waits out a rate window and always queues for
        a concurrency place; the key is looked up again after each wait, so one removed or
        expired meanwhile refuses what has not started."""
        if key.expired(time.time()):
            self.unauthorized += 1
            return _expired(key)
        usage = self.usage[key.name]
        if family != ANY and not key.allows_family(family):
            usage.refused_scope += 1
            return BlazarError(
                "KEY_SCOPE_FORBIDDEN",
                f"API key {key.name!r} may not call {family} routes ({call.path}); its scopes are "
                f"{','.join(key.scopes)} — use a key made with `--scope {family}`",
            )
        holds_place = call.path not in WATCHES
        while True:
            now = trio.current_time()
            decision = limits.decide(
                usage,
                now,
                rpm=key.rpm,
                tpm=key.tpm,
                max_concurrent=key.max_concurrent if holds_place else 0,
                queue=self.queue or patient,
            )
            if decision.verdict is limits.Verdict.RATE and patient:
                if not await self._wait(usage, partial(trio.sleep, decision.retry_after_s or 1.0), gone):
                    return _gone()
                self.refresh()
                fresh = self.keys.get(key.name)
                if fresh is None:
                    return _removed(key.name)
                if fresh.expired(time.time()):
                    return _expired(fresh)
                key, usage = fresh, self.usage[fresh.name]
                continue
            break
        if decision.verdict is limits.Verdict.WAIT:
            if not await self._wait_turn(key.name, usage, gone):
                return _gone()
        elif decision.verdict is not limits.Verdict.ADMIT:
            concurrency = decision.verdict is limits.Verdict.CONCURRENCY
            if concurrency:
                usage.refused_concurrency += 1
            else:
                usage.refused_rate += 1
            return BlazarError(
                "KEY_CONCURRENCY_LIMITED" if concurrency else "RATE_LIMITED",
                f"API key {key.name!r} is over its limit of {decision.reason} — "
                f"retry after {decision.retry_after_s or 1:.0f} s",
                retry_after_s=decision.retry_after_s,
            )
        else:
            limits.admit(usage, now, time.time(), holds_place=holds_place)
        self._grant(call, key)
        return None

    @staticmethod
    async def _wait(usage: limits.Usage, wait: Gone, gone: Gone | None) -> bool:
        """Await ``wait()`` (counted as queued); False, at once, if the client goes first."""
        usage.queued += 1
        try:
            if gone is None:
                await wait()
                return True
            done = False
            async with trio.open_nursery() as nursery:

                async def waiting() -> None:
                    nonlocal done
                    await wait()
                    done = True
                    nursery.cancel_scope.cancel()

                async def watching() -> None:
                    await gone()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(waiting)
                nursery.start_soon(watching)
            return done
        finally:
            usage.queued -= 1

    async def _wait_turn(self, name: str, usage: limits.Usage, gone: Gone | None) -> bool:
        """Queue behind the key's running requests; ``leave`` hands its place to the first.
        False when the client went away first (it has left the queue)."""
        turn = trio.Event()
        waiters = self._waiters.setdefault(name, deque())
        waiters.append(turn)
        granted = False
        try:
            granted = await self._wait(usage, turn.wait, gone)
        finally:
            if not granted:
                if turn.is_set():  # handed the place as the wait ended: pass it on
                    self._release(name, usage)
                else:
                    waiters.remove(turn)
        if not granted:
            return False
        usage.requests.add(trio.current_time(), 1)
        usage.requests_total += 1
        usage.last_used_at = time.time()
        return True

    @staticmethod
    def _grant(call: Call, key: Key) -> None:
        call.key = key.name
        call.grant = key
        if call.card is not None:
            call.card.key = key.name

    def leave(self, call: Call) -> None:
        """The request of ``call`` has ended: free its place, charge its tokens."""
        grant = call.grant
        if grant is None or grant is LOCAL_KEY:
            return
        usage = self.usage.get(grant.name)
        if usage is None or call.path in WATCHES:
            return
        card = call.card
        tokens = 0 if card is None else (card.prompt_tokens or 0) + (card.completion_tokens or 0)
        usage.tokens.add(trio.current_time(), tokens)
        usage.tokens_total += tokens
        self._release(grant.name, usage)

    def charge(self, name: str | None, tokens: int) -> None:
        """Charge ``tokens`` spent outside a request (a background response's job) to key ``name``."""
        usage = self.usage.get(name) if name else None
        if usage is not None and tokens:
            usage.tokens.add(trio.current_time(), tokens)
            usage.tokens_total += tokens

    def _release(self, name: str, usage: limits.Usage) -> None:
        waiters = self._waiters.get(name)
        if waiters:
            waiters.popleft().set()  # the place passes straight on: in_flight stays
        else:
            usage.in_flight -= 1

    def statistics(self) -> dict[str, Any]:
        """Every key (never a secret) with its usage since the daemon started."""
        self.refresh()
        now = trio.current_time()
        data = []
        for key in self.keys.values():
            usage = self.usage.get(key.name) or limits.Usage()
            view = limits.UsageView.of(usage, now)
            data.append({**key.public(), "expired": key.expired(time.time()), "usage": view})
        return {"object": "list", "auth": self.enabled, "unauthorized": self.unauthorized, "data": data}


def _expired(key: Key) -> BlazarError:
    expired = time.strftime("%Y-%m-%d %H:%M", time.localtime(key.expires_at or 0))
    return BlazarError(
        "KEY_EXPIRED",
        f"API key {key.name!r} expired at {expired} — ask the operator for a new key "
        "(`blazar keys add NAME --expires …`)",
    )


def _removed(name: str) -> BlazarError:
    return BlazarError(
        "UNAUTHORIZED",
        f"API key {name!r}, which made this batch, no longer exists (`blazar keys rm`): its "
        "remaining requests are refused — make the batch again with a current key",
    )


def _gone() -> BlazarError:
    return BlazarError("CLIENT_CLOSED_REQUEST", "the client disconnected while waiting for its key's turn")
