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
from actors.config import RuntimeConfig
from actors.engine import EngineState
from actors.engines.routing import installed as installed_lanes
from actors.engines.spec import LaunchSpec
from actors.federation import InstalledModel, expected_wait_s
from actors.rpc import running_split
from blazar import __version__
from blazar.web.asgi.auth import model_visible
from blazar.web.asgi.replies import JSON, app_runtime, error_response

__all__ = ["register"]


class RpcPart(msgspec.Struct, frozen=True, kw_only=True):
    """One worker of a split model, as its engine runs it."""

    address: str
    memory_bytes: int
    """What the worker offers (``rpc_memory_mb``, else this machine's available RAM)."""
    layers: int
    """Repeating layers it holds."""
    output: bool
    """It holds the output layer too."""
    bytes: int
    """The plan's estimate of what it holds (weights, KV cache, compute buffer, allowance)."""
    share: float
    """Its share of the model's layers (the output layer counted as one)."""


class RpcShare(msgspec.Struct, frozen=True, kw_only=True):
    """How a model split with llama.cpp's RPC backend is spread now."""

    workers: list[RpcPart]
    local_layers: int
    """Repeating layers this machine holds (with the token embeddings)."""
    local_bytes: int
    n_layers: int
    """Repeating layers plus the output layer."""
    share: float
    """The workers' share of the layers, together."""
    missing: list[str] = []
    """Workers of the model's ``rpc`` that it runs without now (``rpc_fallback``)."""


def rpc_share(config: RuntimeConfig, spec: LaunchSpec) -> RpcShare | None:
    """The split an engine runs with, from its flags; None for one that is not split."""
    name = spec.alias or spec.model
    over = config.models.get(name)
    if not spec.rpc or over is None:
        return None
    found = running_split(
        config,
        name,
        spec.path,
        spec.ctx_per_slot,
        spec.slots,
        rpc=spec.rpc,
        tensor_split=spec.tensor_split,
        gpu_layers=spec.gpu_layers,
    )
    if found is None:
        return None
    n = found.n_layers
    parts = [p for p in found.parts if p.kind == "worker"]
    workers = [
        RpcPart(
            address=p.name,
            memory_bytes=p.available,
            layers=p.layers,
            output=p.output,
            bytes=p.bytes,
            share=round((p.layers + p.output) / n, 4),
        )
        for p in parts
    ]
    local = found.parts[0]
    return RpcShare(
        workers=workers,
        local_layers=local.layers,
        local_bytes=local.bytes,
        n_layers=n,
        share=round(sum(p.layers + p.output for p in parts) / n, 4),
        missing=[w for w in over.rpc or [] if w not in spec.rpc],
    )


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
    slots: int = 0
    """Requests the engine runs at once."""
    queued: int = 0
    """Requests waiting for one of its slots."""
    expected_wait_s: float = 0.0
    """How long a new request would wait for a slot (0: one is free)."""
    rpc: RpcShare | None = None
    """For a model split over RPC workers: each worker's address, memory and layers."""


class Capacity(msgspec.Struct, frozen=True, kw_only=True):
    daemon: str = "blazar"
    """Says to a peer that this is a Blazar daemon (federation, docs/federation.md)."""
    version: str = __version__
    instance: str | None = None
    """This boot's id: a daemon that polls itself (its own address among a ``dns`` remote's)
    knows it by this."""
    census: Census
    memory_budget_bytes: int | None
    """What all models may use together now (config ``memory_budget_mb``, else available
    RAM plus what the loaded models hold); None: no memory check."""
    free_bytes: int | None = None
    """What a new model could use now: free GPU memory when there are GPUs, else available
    RAM, capped by the memory budget."""
    models: list[ResidentModel]
    installed: list[InstalledModel] = []
    """Every model in the store, with its size (what a peer may route here)."""
    lanes: list[str] = []
    """The engine lanes this machine runs (``llamacpp-host``, ``mistralrs-host``, …)."""


async def capacity() -> Response:
    runtime = app_runtime()
    engines = [e for e in runtime.loaded() if e.state in (EngineState.READY, EngineState.STARTING)]
    stats = [e.statistics() for e in engines]
    pids = [s.pid for s in stats if s.pid]

    config = runtime.config

    def measure() -> tuple[Census, list[int | None], list[InstalledModel], list[str], list[RpcShare | None]]:
        records = runtime.store.list()
        lanes = sorted({lane.kind for lane in installed_lanes(config.engine, config.home).values() if lane})
        return (
            take_census(pids),
            [tree_rss(s.pid) if s.pid else None for s in stats],
            [InstalledModel(name=r.name, size_bytes=r.size, kind=r.kind, digest=r.digest) for r in records],
            lanes,
            [rpc_share(config, e.spec) for e in engines],
        )

    census, rss, store, lanes, splits = await trio.to_thread.run_sync(measure)
    queues = {q.model: q for q in runtime.admission.statistics().queues}
    models = []
    for s, e, r, split in zip(stats, engines, rss, splits, strict=True):
        q = queues.get(s.model)
        slots = e.spec.slots
        models.append(
            ResidentModel(
                model=s.model,
                state=str(s.state),
                pid=s.pid,
                in_flight=s.in_flight,
                estimated_bytes=runtime.memory.footprint(s.model),
                rss_bytes=r,
                slots=slots,
                queued=q.queued if q is not None else 0,
                expected_wait_s=expected_wait_s(
                    slots=slots,
                    running=q.running if q is not None else s.in_flight,
                    queued=q.queued if q is not None else 0,
                    service_s=q.service_s if q is not None else None,
                ),
                rpc=split,
            )
        )
    held = sum(m.estimated_bytes or 0 for m in models)
    budget = runtime.memory.budget(held)
    free = sum(g.free for g in census.gpus) if census.gpus else census.ram_available
    if budget is not None:
        free = max(0, min(free, budget - held))
    # The numbers count every model; the names listed are those the caller's key may use.
    body = Capacity(
        instance=runtime.instance,
        census=census,
        memory_budget_bytes=budget,
        free_bytes=free,
        models=[m for m in models if model_visible(m.model)],
        installed=[m for m in store if model_visible(m.name)],
        lanes=lanes,
    )
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
