"""The request protocol: what every request does to reach an engine, in one place.

    admission slot → make room (evict idle models) → engine ready → lease
    … the request runs …
    release the lease, then the slot, then re-arm the model's keep-alive timer

The slot comes first, so a request that waits in the queue and goes away is
withdrawn without ever starting or loading an engine. Releasing is synchronous
and idempotent, so it runs exactly once however the request ends: at the end of
an ``async with`` block, from a stream's ``aclose``, or from both.

The gateway and an embedding Trio program use the same entry point,
``Runtime.claim``: awaited, it gives a ``Claim`` to release later (a response
stream that outlives its handler); used as ``async with``, it releases when the
block ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from actors.admission import Slot, acquire
from actors.engine import EngineActor, EngineHandle, EngineState, EnsureReady, Lease
from actors.scheduling import Tier

if TYPE_CHECKING:
    from actors.runtime import Runtime

__all__ = ["Claim", "ClaimRequest"]


@dataclass(eq=False)
class Claim:
    """One request's hold on an engine: its admission slot, the ready child, a lease.

    ``handle.upstream`` is the pooled HTTP/1.1 client to the child (the hot path),
    ``handle.client`` an httpx client for everything else.
    """

    runtime: Runtime
    engine: EngineActor
    handle: EngineHandle
    slot: Slot
    lease: Lease
    load_ns: int
    """Time spent making the engine ready (next to nothing when it already was)."""
    queued_s: float
    """Time spent waiting for the admission slot."""
    keep_alive_s: float | None
    released: bool = False

    @property
    def model(self) -> str:
        return self.engine.spec.model

    def release(self) -> None:
        """Idempotent: the engine's lease, the admission slot, then the idle timer."""
        if self.released:
            return
        self.released = True
        self.lease.release()
        self.slot.release()
        self.runtime.lifecycle.touch_nowait(self.engine.spec.model, self.keep_alive_s)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ClaimRequest:
    """What ``Runtime.claim`` returns: await it for a ``Claim``, or ``async with`` it."""

    __slots__ = ("_claim", "_kwargs", "_model", "_runtime")

    def __init__(self, runtime: Runtime, model: str, **kwargs: Any) -> None:
        self._runtime = runtime
        self._model = model
        self._kwargs = kwargs
        self._claim: Claim | None = None

    def __await__(self) -> Generator[Any, None, Claim]:
        return _claim(self._runtime, self._model, **self._kwargs).__await__()

    async def __aenter__(self) -> Claim:
        self._claim = await _claim(self._runtime, self._model, **self._kwargs)
        return self._claim

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._claim is not None
        self._claim.release()


async def _claim(
    runtime: Runtime,
    model: str,
    *,
    tier: Tier = Tier.NORMAL,
    client: str = "",
    deadline_s: float | None = None,
    keep_alive_s: float | None = None,
    waiter_id: int | None = None,
    on_granted: Callable[[EngineActor], None] | None = None,
) -> Claim:
    engine = await runtime.engine_for(model)
    slot = await acquire(
        runtime.admission,
        waiter_id=waiter_id,
        model=engine.spec.model,
        capacity=engine.spec.slots,
        tier=tier,
        client=client,
        deadline_s=deadline_s,
    )
    try:
        if on_granted is not None:
            on_granted(engine)
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
