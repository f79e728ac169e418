"""How a model would run, decided before anything starts: its launch spec (lane, context,
slots, GPU layers, memory share, RPC split) and the plan ``blazar plan`` shows.

Everything here reads the config, the store and the machine (a census, the lane's binary)
and starts nothing: the runtime uses it to make an engine, ``actors/offline.py`` to answer
without a daemon, ``actors/reload.py`` to compare a config with the running one.
"""

from __future__ import annotations

import msgspec

from actors.census import take_census
from actors.config import ModelOverride, RuntimeConfig
from actors.context import describe_clamp
from actors.engines._gpu import memory_fraction
from actors.engines.lane import Lane
from actors.engines.llamacpp import LaunchSpec, find_llama_server, gpu_backend
from actors.engines.routing import Considered, Route, installed, lane_for
from actors.errors import UnsupportedEngine
from actors.lifecycle import LoadPreview
from actors.memory import MemoryPlanner
from actors.rpc import plan_split
from actors.settings import Resolved, resolve_launch
from actors.speculation import candidate
from registry import fit
from registry.errors import RegistryError
from registry.kinds import TEXT_KINDS
from registry.kinds import require as require_kind
from registry.multifile import estimate_path
from registry.shape import read_shape
from registry.split import RpcSplit
from registry.store import ModelRecord, Store

__all__ = [
    "LoadPlan",
    "context_note",
    "launch_spec_for",
    "make_plan",
    "plan_resolve",
    "resolve_for",
    "side_spec_for",
    "unsupported_preview",
]


class LoadPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How a model would run: engine lane, context, slots, memory, and what a load would evict."""

    model: str
    lane: str | None
    """What runs it: ``llamacpp-host`` (llama.cpp's server from the xllamacpp wheel),
    ``llama-server``, ``mistralrs-host`` (the mistralrs wheel), ``mistralrs-serve``, …;
    None when no lane here can (``lanes`` say why, ``preview`` refuses it with
    ``MODEL_UNSUPPORTED_ENGINE`` and how to install the lane)."""
    binary: str | None
    lanes: list[Considered] = []
    """Every lane, whether it was taken, and why (not installed, format, capability, pin)."""
    ctx_per_slot: int
    """The per-slot context the engine is started with (after any clamp)."""
    slots: int
    ctx_total: int
    ctx_train: int | None = None
    """The model's training context (GGUF header)."""
    ctx_asked: int | None = None
    """The configured per-slot context, when it was clamped to what the model can serve."""
    ctx_served: int | None = None
    """What the running engine really gives each slot, read back from it; None: not running."""
    rope_scaling: str | None = None
    rope_scale: float | None = None
    context_note: str | None = None
    """Why the context is not what was asked for, or how it is extended."""
    cache_type: str
    gpu_layers: int
    prompt_batch: int | None = None
    """Prompt tokens per engine step (bounds how long a cancelled prompt holds its slot);
    None: llama.cpp's own (512)."""
    loaded: bool
    estimate: fit.Estimate | None
    preview: LoadPreview
    rpc: RpcSplit | None = None
    """How the model is spread over this machine and its RPC workers (``rpc``); None: here alone."""


def launch_spec_for(
    config: RuntimeConfig,
    store: Store,
    record: ModelRecord,
    kinds: frozenset[str] = TEXT_KINDS,
    *,
    parked: str | None = None,
) -> LaunchSpec:
    """How ``record``'s engine starts under ``config`` (context, slots, template, defaults)."""
    return resolve_for(config, store, record, kinds, parked=parked).spec


def resolve_for(
    config: RuntimeConfig,
    store: Store,
    record: ModelRecord,
    kinds: frozenset[str] = TEXT_KINDS,
    *,
    unrouted: bool = False,
    parked: str | None = None,
) -> Resolved:
    """``launch_spec_for`` with where each setting came from (``blazar explain``).

    Raises ``ModelKindMismatch`` for a model of none of ``kinds`` (by default: a speech or
    image model, which no text lane runs). ``unrouted``: a model no lane here runs is
    resolved for the lane that would (``Resolved.refusal`` says why), for a plan."""
    require_kind(record, kinds, "text" if kinds == TEXT_KINDS else "/".join(sorted(kinds)))
    return resolve_launch(
        config,
        record,
        store.info(record),
        lanes=installed(config.engine, config.home),
        plan_gpu_layers=lambda ctx, slots: _planned_gpu_layers(config, record.path, ctx, slots),
        plan_memory_fraction=lambda ctx, slots, tp: _planned_memory_fraction(record.path, ctx, slots, tp),
        plan_rpc=lambda ctx, slots: plan_split(config, record.name, record.path, ctx, slots),
        unrouted=unrouted,
        adapter_path=lambda adapter: str(store.blob_path(adapter.digest.removeprefix("sha256:"))),
        candidate=lambda name, lane: candidate(config, store, name, lane),
        parked=parked,
        template_facts=store.template_facts,
    )


def side_spec_for(config: RuntimeConfig, store: Store, record: ModelRecord, lane: str) -> LaunchSpec:
    """``record``'s launch spec on ``lane``, one its ``lanes`` setting allows."""
    over = config.models.get(record.name) or ModelOverride()
    if lane not in (over.lanes or []):
        allowed = ", ".join(over.lanes or []) or "none besides its own"
        raise UnsupportedEngine(
            f"model '{record.name}' may not run on the {lane} lane (lanes it may also run on: {allowed}) "
            f'— add it to models."{record.name}".lanes in config.toml, or drop x-blazar-engine'
        )
    models = {**config.models, record.name: msgspec.structs.replace(over, engine=lane)}
    spec = resolve_for(msgspec.structs.replace(config, models=models), store, record).spec
    return msgspec.structs.replace(spec, model=f"{record.name}@{lane}", alias=record.name)


def plan_resolve(config: RuntimeConfig, store: Store, record: ModelRecord) -> Resolved:
    """A plan's resolution: the model's own kind (a plan serves no route) and no refusal for a
    lane that is not installed (the plan shows it)."""
    return resolve_for(config, store, record, frozenset({record.kind}), unrouted=True)


def unsupported_preview(preview: LoadPreview, resolved: Resolved) -> LoadPreview:
    if resolved.refusal is None:
        return preview
    return msgspec.structs.replace(preview, refused=resolved.refusal, code=UnsupportedEngine.code, evict=[])


def _planned_gpu_layers(config: RuntimeConfig, path: str, ctx: int, slots: int) -> int | None:
    """Layers to offload on a GPU build of llama-server, from the fit plan against the GPUs'
    free memory; None on the CPU lane, or when the GPUs cannot be measured (llama.cpp decides)."""
    binary = find_llama_server(config.engine.llama_server)
    if binary is None or gpu_backend(binary) is None:
        return None
    census = take_census()
    if not census.gpus:
        return None
    try:
        shape = read_shape(path)
    except (RegistryError, OSError):
        return None
    report = fit.fit(shape, fit.Settings(ctx_per_slot=ctx, slots=slots), census.memory())
    return report.gpu_layers or 0


def _planned_memory_fraction(path: str, ctx: int, slots: int, tensor_parallel: int) -> float | None:
    """A GPU serving engine's share of each GPU (vLLM, SGLang): the fit plan's need for the model
    at ``ctx`` per slot and ``slots`` (weights, KV cache, allowances), split over
    ``tensor_parallel`` GPUs, against the smallest of them; None when no GPU can be measured or
    the model's need is not known."""
    census = take_census()
    gpus = census.gpus[: max(1, tensor_parallel)]
    estimate = estimate_path(path, slots=slots, ctx_per_slot=ctx)
    if not gpus or estimate is None:
        return None
    return memory_fraction(estimate.total // max(1, tensor_parallel), min(g.total for g in gpus))


def context_note(spec: LaunchSpec, served: int | None = None) -> str | None:
    """What ``blazar plan`` and the log say about a context that is not what was asked."""
    extended = bool(spec.rope_scaling and spec.rope_scale)
    if spec.ctx_asked is not None:
        return describe_clamp(spec.ctx_asked, spec.ctx_per_slot, trained=spec.ctx_train, extended=extended)
    if served is not None and served < spec.ctx_per_slot:
        return (
            f"the engine serves {served} per slot of the {spec.ctx_per_slot} asked (it caps the slot itself)"
        )
    if extended and spec.ctx_train is not None and spec.ctx_per_slot > spec.ctx_train:
        how = f"{spec.rope_scaling} x{spec.rope_scale:g}"
        return f"extended with {how} beyond the {spec.ctx_train}-token training length"
    return None


def make_plan(
    spec: LaunchSpec,
    config: RuntimeConfig,
    memory: MemoryPlanner,
    preview: LoadPreview,
    *,
    loaded: bool,
    served: int | None = None,
    route: Route | None = None,
    lane: Lane | None = None,
    runnable: bool = True,
    rpc: RpcSplit | None = None,
) -> LoadPlan:
    """``lane``: the one ``spec`` runs on (found here when not given: it looks at PATH);
    not ``runnable``: no lane here runs it (``route`` says why)."""
    if runnable:
        lane = lane or lane_for(spec, config.engine, config.home)
    return LoadPlan(
        model=spec.model,
        lane=lane.kind if lane is not None and runnable else None,
        binary=lane.binary if lane is not None and runnable else None,
        lanes=route.considered if route is not None else [],
        ctx_per_slot=spec.ctx_per_slot,
        slots=spec.slots,
        ctx_total=spec.ctx_total,
        ctx_train=spec.ctx_train,
        ctx_asked=spec.ctx_asked,
        ctx_served=served,
        rope_scaling=spec.rope_scaling,
        rope_scale=spec.rope_scale,
        context_note=context_note(spec, served),
        cache_type="f16",
        gpu_layers=spec.gpu_layers or 0,
        prompt_batch=spec.prompt_batch,
        loaded=loaded,
        estimate=memory.estimate_of(spec.model),
        preview=preview,
        rpc=rpc,
    )
