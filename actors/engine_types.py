"""What the engine actor is told and what it answers: its states, the messages other actors
send it, the handle of a ready child and its statistics (``actors.engine`` has the actor)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import msgspec

from actors.actor import ActorStatistics
from actors.engines.lane import Lane
from actors.engines.spec import LaunchSpec, LoraLoad, SpecLoad
from actors.upstream import UpstreamPool

if TYPE_CHECKING:
    import httpx

__all__ = [
    "ConfirmCrash",
    "CrashReport",
    "EngineHandle",
    "EngineState",
    "EngineStatistics",
    "EnsureReady",
    "Reconfigure",
    "StopEngine",
    "WaitSpawned",
]


class EngineState(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


class EnsureReady(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Start the child if needed; the reply is an ``EngineHandle`` once healthy."""


class StopEngine(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    reason: str = "requested"


class WaitSpawned(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Reply (None) once the start in progress has spawned its child, or has ended;
    at once when no start is in progress. Sent after ``EnsureReady``, it tells the
    sender that the child's own start-up is under way, long before it is healthy."""


class Reconfigure(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Restart the child with another per-slot context, embeddings enabled, or another
    version of its lane (``blazar engine use``), once the requests running on it have
    finished. Replies when the change is scheduled (or at once when nothing changes)."""

    ctx_per_slot: int | None = None
    embeddings: bool | None = None
    token_embeddings: bool | None = None
    """With embeddings: a vector per token (``--pooling none``), pooled by the gateway."""
    lane: Lane | None = None
    speculation: SpecLoad | Literal["off"] | None = None
    """Speculate so (``"off"``: not at all), as the speculation governor decides; None: no change."""
    loras: list[LoraLoad] | None = None
    """The model's LoRA adapters now (``blazar lora add``/``rm``); None: no change."""
    spec: LaunchSpec | None = None
    """A whole new launch spec (the config changed); the fields above then apply over it."""


class ConfirmCrash(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A request lost its connection to generation ``generation``: did the child die?"""

    generation: int


@dataclass(frozen=True, slots=True)
class EngineHandle:
    """What a request needs to talk to a ready child, with two clients pooled per child:
    ``upstream`` carries the relayed inference requests (the hot path), ``client`` (httpx)
    the rest (health, slots, tokenize, admin)."""

    model: str
    base_url: str
    generation: int
    pid: int
    client: httpx.AsyncClient
    upstream: UpstreamPool
    served_ctx: int | None = None
    """The per-slot context the child reported after start (None: it did not say)."""
    request_model: str | None = None
    """The ``model`` the child must be sent (``Lane.request_model``); None: any."""

    async def aclose(self) -> None:
        await self.upstream.aclose()
        await self.client.aclose()


class CrashReport(msgspec.Struct, frozen=True, kw_only=True):
    crashed: bool
    returncode: int | None
    stderr_summary: str
    stopped: str | None = None
    """Why the daemon itself stopped the child the request was using (not a crash)."""


class EngineStatistics(ActorStatistics, frozen=True, kw_only=True):
    model: str
    state: str
    engine: str
    pid: int | None
    port: int | None
    slots: int
    ctx_per_slot: int
    """The per-slot context the child is started with."""
    ctx_served: int | None
    """What the running child really gives each slot (read back after start)."""
    in_flight: int
    starts: int
    """Child processes launched so far."""
    restarts: int
    crashes: int
    generation: int
    started_at: float | None
    last_error: str | None
    lane: str
    version: str | None
    """What runs the lane, with its version (``xllamacpp 0.2.5``); None until known."""
    breaker: str
    """``closed`` while starts are allowed, ``open`` after too many crashes in the window."""
    breaker_retry_after_s: float | None
    """While the breaker is open: seconds until it lets a start through again."""
    stderr_tail: str
    """The last lines the child (or the last one, once it has exited) wrote to stderr."""
    banked_tokens: int | None = None
    """Prompt-cache tokens the last start read back from the slot bank (None: no bank read)."""
    degrades: list[str] = []
    """What the child said at start it does less than asked (``actors.engines.degrades``)."""
