"""The serving runtime, embeddable in any Trio program without the HTTP layer.

    from actors import RuntimeConfig, open_runtime

    async with open_runtime(RuntimeConfig.in_home(home)) as rt:
        async with rt.claim("smollm2-135m") as claim:
            resp = await claim.handle.client.post("/v1/chat/completions", json={...})

Long work goes to ``rt.jobs``: register a runner for a kind (``rt.jobs.register(kind,
runner)``), then ``await rt.jobs.submit(kind, request)``; jobs are durable and resume
after a crash.

``rt.claim`` is the request protocol the daemon's gateway uses too: an admission
slot (queues, priorities, deadlines), eviction of idle models when needed, a ready
engine, a lease, and one release that re-arms the model's keep-alive timer.
"""

from actors.claim import Claim, ClaimOptions, ClaimRequest
from actors.config import EngineConfig, ModelOverride, RuntimeConfig
from actors.errors import (
    ActorStopped,
    AdmissionRejected,
    BlazarRuntimeError,
    EngineCircuitOpen,
    EngineCrashed,
    EngineStartTimeout,
    EngineUnavailable,
    InsufficientMemory,
    JobNotFound,
    JobNotRunnable,
    LedgerError,
    MaxLoadedModels,
    ModelBusy,
    ModelTooLarge,
)
from actors.jobs import JobContext, JobOutcome, JobRecord, Runner
from actors.runtime import Runtime, RuntimeStatistics, open_runtime
from actors.scheduling import Tier
from registry.errors import ModelNotFound

__all__ = [
    "ActorStopped",
    "AdmissionRejected",
    "BlazarRuntimeError",
    "Claim",
    "ClaimOptions",
    "ClaimRequest",
    "EngineCircuitOpen",
    "EngineConfig",
    "EngineCrashed",
    "EngineStartTimeout",
    "EngineUnavailable",
    "InsufficientMemory",
    "JobContext",
    "JobNotFound",
    "JobNotRunnable",
    "JobOutcome",
    "JobRecord",
    "LedgerError",
    "MaxLoadedModels",
    "ModelBusy",
    "ModelNotFound",
    "ModelOverride",
    "ModelTooLarge",
    "Runner",
    "Runtime",
    "RuntimeConfig",
    "RuntimeStatistics",
    "Tier",
    "open_runtime",
]
