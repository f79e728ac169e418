"""What the machine holds and what a load would do: ``GET /api/capacity``, ``GET /api/plan/{model}``,
``GET /api/coreside?model=A&model=B``.

Capacity is the hardware census (GPUs through NVML when present, else CPU and
system RAM, with a note) plus every loaded model with its estimated footprint
and the resident memory its engine process tree measures now. The plan is the
run decision a load would make now (lane, context, slots, memory estimate, the
idle models it would evict or why it would be refused), made by the same code
as a real load, without loading. Coresidence says whether a set of models fits in
memory together, each at the settings it runs or would start with.
"""

from __future__ import annotations

import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio

from actors.census import Census, take_census, tree_rss
from actors.engine import EngineState
from blazar.web.common import JSON, app_runtime, error_response

__all__ = ["register"]


class ResidentModel(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    state: str
    pid: int | None
    in_flight: int
    estimated_bytes: int | None
    """registry.fit's estimate at the engine's context and slots."""
    rss_bytes: int | None
    """What the engine's process tree holds in RAM now (weights are memory-mapped, so
    pages not touched yet do not count)."""


class Capacity(msgspec.Struct, frozen=True, kw_only=True):
    census: Census
    memory_budget_bytes: int | None
    """What all models may use together now (config ``memory_budget_mb``, else available
    RAM plus what the loaded models hold); None: no memory check."""
    models: list[ResidentModel]


async def capacity() -> Response:
    runtime = app_runtime()
    engines = [e for e in runtime.loaded() if e.state in (EngineState.READY, EngineState.STARTING)]
    stats = [e.statistics() for e in engines]
    pids = [s.pid for s in stats if s.pid]

    def measure() -> tuple[Census, list[int | None]]:
        return take_census(pids), [tree_rss(s.pid) if s.pid else None for s in stats]

    census, rss = await trio.to_thread.run_sync(measure)
    models = [
        ResidentModel(
            model=s.model,
            state=str(s.state),
            pid=s.pid,
            in_flight=s.in_flight,
            estimated_bytes=runtime.memory.footprint(s.model),
            rss_bytes=r,
        )
        for s, r in zip(stats, rss, strict=True)
    ]
    held = sum(m.estimated_bytes or 0 for m in models)
    body = Capacity(census=census, memory_budget_bytes=runtime.memory.budget(held), models=models)
    return Response(msgspec.json.encode(body), content_type=JSON)


async def plan(name: str) -> Response:
    runtime = app_runtime()
    return Response(msgspec.json.encode(await runtime.plan(name)), content_type=JSON)


async def coreside() -> Response:
    models = request.args.getlist("model")
    if not models:
        return error_response("BAD_REQUEST", "name the models to check: /api/coreside?model=A&model=B")
    return Response(msgspec.json.encode(await app_runtime().coreside(models)), content_type=JSON)


def register(app: QuartTrio) -> None:
    """``GET /api/capacity``, ``GET /api/plan/{model}`` and ``GET /api/coreside``."""
    app.get("/api/capacity")(capacity)
    app.get("/api/plan/<path:name>")(plan)
    app.get("/api/coreside")(coreside)
