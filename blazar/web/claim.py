"""Claiming an engine for one request: a slot from admission, a ready child, a lease.

Order matters: the slot comes first, so a request that waits in the queue and
disconnects is withdrawn without ever starting or loading an engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import trio
from actors.scheduling import parse_tier
from quart import request

from actors.admission import Slot, acquire
from actors.engine import EngineActor, EngineHandle, EnsureReady, Lease
from actors.runtime import Runtime
from blazar.errors import BlazarError

__all__ = ["Claim", "claim_engine"]


@dataclass
class Claim:
    engine: EngineActor
    handle: EngineHandle
    slot: Slot
    lease: Lease
    load_ns: int
    queued_s: float

    def release(self) -> None:
        """Idempotent: the engine's lease, then the admission slot."""
        self.lease.release()
        self.slot.release()


def _client_key() -> str:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer ") and len(auth) > 7:
        return "key:" + auth[7:]
    if key := request.headers.get("x-api-key"):
        return "key:" + key
    if client := request.headers.get("X-Blazar-Client"):
        return "client:" + client
    addr = request.scope.get("client")
    return f"addr:{addr[0]}" if addr else "addr:?"


def _deadline_s() -> float | None:
    raw = request.headers.get("X-Blazar-Deadline-Ms")
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        raise BlazarError(
            "BAD_REQUEST", f"X-Blazar-Deadline-Ms must be a number of milliseconds, got {raw!r}"
        ) from None
    if ms <= 0:
        raise BlazarError("BAD_REQUEST", "X-Blazar-Deadline-Ms must be positive")
    return trio.current_time() + ms / 1000


async def claim_engine(runtime: Runtime, engine: EngineActor) -> Claim:
    slot = await acquire(
        runtime.admission,
        model=engine.spec.model,
        capacity=engine.spec.slots,
        tier=parse_tier(request.headers.get("X-Blazar-Priority")),
        client=_client_key(),
        deadline_s=_deadline_s(),
    )
    try:
        t0 = time.perf_counter_ns()
        handle: EngineHandle = await engine.ask(EnsureReady())
        load_ns = time.perf_counter_ns() - t0
        lease = engine.lease()
    except BaseException:
        slot.release()
        raise
    return Claim(
        engine=engine, handle=handle, slot=slot, lease=lease, load_ns=load_ns, queued_s=slot.queued_s
    )
