"""The serving runtime, embeddable in any Trio program without the HTTP layer.

    from actors import RuntimeConfig, open_runtime

    async with open_runtime(RuntimeConfig.in_home(home)) as rt:
        async with rt.claim("smollm2-135m") as claim:
            resp = await claim.handle.client.post("/v1/chat/completions", json={...})

Long work goes to ``rt.jobs``: register a runner for a kind (``rt.jobs.register(kind,
runner)``), then ``await rt.jobs.submit(kind, request)``; jobs are durable and resume
after a crash. Pulls are jobs already: ``job = await rt.pull("smollm2-135m")``, then
``rt.jobs.follow(job.id)`` for its progress (``actors/pulls.py``).

``rt.claim`` is the request protocol the daemon's gateway uses too: an admission
slot (queues, priorities, deadlines), eviction of idle models when needed, a ready
engine, a lease, and one release that re-arms the model's keep-alive timer.

The config types, errors and tiers load with the package; the runtime itself (trio,
the engines, the model store's readers) loads on first use of a name that needs it,
so that a program which only reads a config pays for no more.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
from actors.scheduling import Tier
from registry.errors import ModelNotFound

if TYPE_CHECKING:
    from actors.claim import Claim, ClaimOptions, ClaimRequest
    from actors.jobs import JobContext, JobOutcome, JobRecord, Runner
    from actors.runtime import Runtime, RuntimeStatistics
    from actors.runtime_open import open_runtime

_LAZY = {
    "Claim": "actors.claim",
    "ClaimOptions": "actors.claim",
    "ClaimRequest": "actors.claim",
    "JobContext": "actors.jobs",
    "JobOutcome": "actors.jobs",
    "JobRecord": "actors.jobs",
    "Runner": "actors.jobs",
    "Runtime": "actors.runtime",
    "RuntimeStatistics": "actors.runtime",
    "open_runtime": "actors.runtime_open",
}

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'actors' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
