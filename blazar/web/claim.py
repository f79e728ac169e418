"""Claiming an engine for one request: a slot from admission, a ready child, a lease.

Order matters: the slot comes first, so a request that waits in the queue and
disconnects is withdrawn without ever starting or loading an engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import trio

from actors.admission import Slot, acquire
from actors.engine import EngineActor, EngineHandle, EngineState, EnsureReady, Lease
from actors.runtime import Runtime
from actors.scheduling import parse_tier
from blazar.errors import BlazarError
from blazar.web.call import Call, current
from blazar.web.cards import CardState
from blazar.web.common import keep_alive_header

__all__ = ["Claim", "claim_engine"]


@dataclass
class Claim:
    runtime: Runtime
    engine: EngineActor
    handle: EngineHandle
    slot: Slot
    lease: Lease
    load_ns: int
    queued_s: float
    keep_alive_s: float | None
    released: bool = False

    def release(self) -> None:
        """Idempotent: the engine's lease, the admission slot, then the idle timer."""
        if self.released:
            return
        self.released = True
        self.lease.release()
        self.slot.release()
        self.runtime.lifecycle.touch_nowait(self.engine.spec.model, self.keep_alive_s)


def _client_key(call: Call) -> str:
    headers = call.headers
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer ") and len(auth) > 7:
        return "key:" + auth[7:]
    if key := headers.get("x-api-key"):
        return "key:" + key
    if client := headers.get("x-blazar-client"):
        return "client:" + client
    return f"addr:{call.client or '?'}"


def _deadline_s(call: Call) -> float | None:
    raw = call.headers.get("x-blazar-deadline-ms")
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


async def claim_engine(runtime: Runtime, engine: EngineActor, *, keep_alive_s: float | None = None) -> Claim:
    """``keep_alive_s``: from the request body (Ollama), else the X-Blazar-Keep-Alive header."""
    call = current()
    if keep_alive_s is None and (header := call.headers.get("x-blazar-keep-alive")):
        keep_alive_s = keep_alive_header(header)
    live = call.card
    waiter_id = runtime.admission.next_id()
    if live is not None:
        live.waiter_id = waiter_id
    slot = await acquire(
        runtime.admission,
        waiter_id=waiter_id,
        model=engine.spec.model,
        capacity=engine.spec.slots,
        tier=parse_tier(call.headers.get("x-blazar-priority")),
        client=_client_key(call),
        deadline_s=_deadline_s(call),
    )
    if live is not None:
        live.state, live.engine = CardState.RUNNING, engine.engine_kind
    try:
        t0 = time.perf_counter_ns()
        handle = engine.ready_handle()
        if handle is None:
            if engine.state is not EngineState.READY:
                await runtime.before_load(engine)  # max_loaded_models and memory: evict idle ones
            handle = await engine.ask(EnsureReady())
        load_ns = time.perf_counter_ns() - t0
        lease = engine.lease()
    except BaseException:
        slot.release()
        raise
    return Claim(
        runtime=runtime,
        engine=engine,
        handle=handle,
        slot=slot,
        lease=lease,
        load_ns=load_ns,
        queued_s=slot.queued_s,
        keep_alive_s=keep_alive_s,
    )
