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

Before the slot, the claim refuses what is sure to fail (``actors/preflight.py``: a
capability the model's certificate fails, a prompt longer than the slot's context) and
restarts the engine when the request needs it to run differently (a larger context,
embeddings on). A name that is a failover chain is walked (``actors/chain_walk.py``):
the claim is on the first target that could be claimed, and ``Claim.walk`` says which
and what was passed over.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from actors.admission import Requeue, Slot, acquire
from actors.chain_walk import ChainWalk
from actors.engine import EngineActor, EngineHandle, Lease, Reconfigure
from actors.failover import Step
from actors.preflight import PromptBound, check_certificates, refuse_if_too_long
from actors.scheduling import Tier
from registry.kinds import KINDS

_ANY_KIND = frozenset(KINDS)

if TYPE_CHECKING:
    from actors.runtime import Runtime

__all__ = ["Claim", "ClaimOptions", "ClaimRequest", "claim_on", "preflight"]


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
    evicted: tuple[str, ...] = ()
    """Models stopped to make room for this one's engine."""
    ahead: int = 0
    """Requests already waiting for a slot when this one arrived."""
    walk: ChainWalk | None = None
    """The walk along the failover chain the claim named (``walk.target`` served it)."""
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


class ClaimOptions(TypedDict, total=False):
    """How a request is admitted; every key is optional."""

    tier: Tier
    """Priority in the admission queue (default ``Tier.NORMAL``)."""
    client: str
    """Who asks, for fair share between clients of one model."""
    deadline_s: float | None
    """A ``trio.current_time()`` deadline, like trio's own: a request still queued then is refused."""
    keep_alive_s: float | None
    """How long the model stays loaded after this request (default: its configured keep-alive)."""
    waiter_id: int | None
    """From ``admission.next_id()``, to find the request in the queue while it waits."""
    requeue: Requeue | None
    """The request was preempted (``Slot.requeue``): it queues again at the head of its class."""
    on_granted: Callable[[EngineActor], None] | None
    """Called once the slot is granted, before the engine is made ready."""
    needs: Sequence[str]
    """Capabilities the request relies on (``tools``, ``json_schema``, ``vision``, ``thinking``,
    ``embeddings``): refused when the model's certificate fails one."""
    certifying: bool
    """A model-doctor probe: certificates do not refuse it."""
    prompt: PromptBound | None
    """A lower bound on the prompt's tokens: refused when sure not to fit a slot's context."""
    ctx_per_slot: int | None
    """Run with at least this per-slot context: the engine restarts with it if it serves less."""
    embeddings: bool
    """Run with embeddings on (``token_embeddings``: a vector per token)."""
    token_embeddings: bool


class ClaimRequest:
    """What ``Runtime.claim`` returns: await it for a ``Claim``, or ``async with`` it."""

    __slots__ = ("_claim", "_model", "_options", "_runtime")

    def __init__(self, runtime: Runtime, model: str, options: ClaimOptions) -> None:
        self._runtime = runtime
        self._model = model
        self._options = options
        self._claim: Claim | None = None

    def __await__(self) -> Generator[Any, None, Claim]:
        return _claim(self._runtime, self._model, **self._options).__await__()

    async def __aenter__(self) -> Claim:
        self._claim = await _claim(self._runtime, self._model, **self._options)
        return self._claim

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._claim is not None
        self._claim.release()


async def _claim(runtime: Runtime, model: str, **options: Unpack[ClaimOptions]) -> Claim:
    chain = runtime.failover.get(model)
    if chain is None:
        engine = await runtime.engine_for(model, kinds=_ANY_KIND)  # the caller's route chose the kind
        return await claim_on(runtime, engine, **options)
    walk = ChainWalk(runtime, chain)

    async def attempt(step: Step, engine: EngineActor | None) -> Claim:
        assert engine is not None  # a walk without remote targets
        return await claim_on(runtime, engine, **options)

    claim = await walk.run(attempt)
    claim.walk = walk
    return claim


async def preflight(runtime: Runtime, engine: EngineActor, options: ClaimOptions) -> int:
    """What is refused or changed before the slot (see the module doc); the nanoseconds spent
    restarting the engine for the request (a load: 0 when it needed none)."""
    spec = engine.spec
    if needs := options.get("needs"):
        check_certificates(
            runtime.config,
            runtime.certificates,
            spec.model,
            needs,
            certifying=options.get("certifying", False),
        )
    ctx = options.get("ctx_per_slot")
    if (prompt := options.get("prompt")) is not None:
        refuse_if_too_long(engine, prompt, ctx=max(ctx or 0, engine.served_ctx or 0, spec.ctx_per_slot))
    restart = ctx if ctx is not None and (engine.served_ctx or spec.ctx_per_slot) < ctx else None
    embeddings = options.get("embeddings", False) and not spec.embeddings
    tokens = options.get("token_embeddings", False) and not spec.token_embeddings
    if not (restart is not None or embeddings or tokens):
        return 0
    t0 = time.perf_counter_ns()
    await engine.ask(
        Reconfigure(
            ctx_per_slot=restart,
            embeddings=True if embeddings or tokens else None,
            token_embeddings=True if tokens else None,
        )
    )
    return time.perf_counter_ns() - t0


async def claim_on(runtime: Runtime, engine: EngineActor, **options: Unpack[ClaimOptions]) -> Claim:
    """The claim on one engine (``Runtime.claim`` has resolved the name)."""
    restarted_ns = await preflight(runtime, engine, options)
    slot = await acquire(
        runtime.admission,
        waiter_id=options.get("waiter_id"),
        model=engine.spec.model,
        capacity=engine.spec.slots,
        tier=options.get("tier", Tier.NORMAL),
        client=options.get("client", ""),
        deadline_s=options.get("deadline_s"),
        requeue=options.get("requeue"),
    )
    try:
        if (granted := options.get("on_granted")) is not None:
            granted(engine)
        t0 = time.perf_counter_ns()
        handle, evicted = await runtime.ready(engine)
        load_ns = time.perf_counter_ns() - t0 + restarted_ns
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
        keep_alive_s=options.get("keep_alive_s"),
        evicted=evicted,
        ahead=slot.ahead,
    )
