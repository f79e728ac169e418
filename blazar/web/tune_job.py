"""``POST /api/tune`` (``blazar tune``) and ``GET``/``DELETE /api/profiles/{model}``.

A tune is a durable job. Each trial makes the candidate settings the model's profile in
the running daemon (``actors.reload.apply_profile``: the engine starts again with them),
checks first that they fit in the memory the lifecycle would allow a load now, loads the
model with a short warm-up request, then streams the workload through the daemon's own
port as ``blazar bench`` does (the same request and timing code). The search and what it
tries are in ``blazar/tune.py``. The best settings (what differs from the model's settings
without a profile) are stored in the ledger with every trial's figures and stay applied:
the engine runs them from its next load, at once with ``apply``. A tune that fails or is
cancelled puts the previous profile back.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from actors.certificates import engine_tag
from actors.config import Profile
from actors.engine import EngineState
from actors.engines.spec import LaunchSpec
from actors.eviction import format_bytes
from actors.jobs import JobContext, JobOutcome, read_jobs
from actors.ledger import Write
from actors.planning import launch_spec_for
from actors.profiles import TunedProfile, delete_statement, profile_statement, read_profile
from actors.reload import apply_profile
from actors.runtime import Runtime
from blazar.dialects._wire import decode_json
from blazar.errors import BlazarError
from blazar.serve.jobs.bench import BenchRequest, one_request, run_level
from blazar.serve.jobs.self_link import SelfLink
from blazar.serve.jobs.tune import DIMENSIONS, Facts, Values, search, winner_profile
from blazar.web.common import app_runtime, json_response, read_body
from blazar.web.jobs import encode_job
from registry.store import ModelRecord

__all__ = ["KIND", "register", "register_runner"]

KIND = "tune"


class TuneRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    concurrency: int = 1
    """Requests the workload runs at once (slots are searched only above 1)."""
    ctx: int = 256
    """Prompt tokens per request (about)."""
    max_tokens: int = 32
    requests: int | None = None
    """Requests per trial; None: twice the concurrency, at least 3."""
    budget: int = 12
    """The most trials, the baseline included."""
    min_gain: float = 0.05
    """How much faster than the best so far a value must be to be kept."""
    apply: bool = False
    """Load the model with the profile when the tune ends (else at its next load)."""


def register_runner(runtime: Runtime, link: SelfLink) -> None:
    async def run(ctx: JobContext) -> JobOutcome:
        return await _run(runtime, link, ctx)

    runtime.jobs.register(KIND, run)


def register(app: QuartTrio) -> None:
    app.post("/api/tune")(submit_tune)
    app.get("/api/profiles/<path:name>")(get_profile)
    app.delete("/api/profiles/<path:name>")(delete_profile)


def _check(req: TuneRequest) -> None:
    if not 1 <= req.concurrency <= 64:
        raise BlazarError("BAD_REQUEST", "concurrency must be between 1 and 64", param="concurrency")
    if not 16 <= req.ctx <= 100_000:
        raise BlazarError("BAD_REQUEST", "ctx (prompt tokens) must be between 16 and 100000", param="ctx")
    if not 2 <= req.max_tokens <= 4096:
        raise BlazarError("BAD_REQUEST", "max_tokens must be between 2 and 4096", param="max_tokens")
    if req.requests is not None and not 1 <= req.requests <= 1000:
        raise BlazarError("BAD_REQUEST", "requests must be between 1 and 1000", param="requests")
    if not 1 <= req.budget <= 100:
        raise BlazarError("BAD_REQUEST", "budget must be between 1 and 100 trials", param="budget")
    if not 0 <= req.min_gain <= 1:
        raise BlazarError("BAD_REQUEST", "min_gain must be between 0 and 1 (0.05: 5 %)", param="min_gain")


async def submit_tune() -> Response:
    runtime = app_runtime()
    req = decode_json(await read_body(), TuneRequest)
    _check(req)
    record = await trio.to_thread.run_sync(runtime.store.get, req.model)
    if record.kind != "chat":
        raise BlazarError(
            "MODEL_KIND_MISMATCH", f"model '{record.name}' is a {record.kind} model: tune runs chat models"
        )
    req = msgspec.structs.replace(req, model=record.name)

    def under_way() -> list[str]:
        found = []
        for state in ("queued", "running"):
            jobs = read_jobs(runtime.jobs.path, state=state, kind=KIND, limit=1000)
            found += [j.id for j in jobs if j.model == record.name]
        return found

    if running := await trio.to_thread.run_sync(under_way):
        raise BlazarError(
            "MODEL_BUSY",
            f"a tune of '{record.name}' is already under way (job {running[0]}): wait for it, or "
            f"cancel it with `blazar jobs cancel {running[0]}`",
        )
    job = await runtime.jobs.submit(KIND, msgspec.json.encode(req), model=record.name)
    return json_response({**encode_job(job), "url": f"/v1/jobs/{job.id}"}, status=202)


async def get_profile(name: str) -> Response:
    runtime = app_runtime()
    model = (await trio.to_thread.run_sync(runtime.store.get, name)).name
    tuned = await trio.to_thread.run_sync(read_profile, runtime.ledger.path, model)
    if tuned is None:
        raise BlazarError("NOT_FOUND", f"model '{model}' has no tuned profile: run `blazar tune {model}`")
    return json_response(msgspec.to_builtins(tuned))


async def delete_profile(name: str) -> Response:
    runtime = app_runtime()
    model = (await trio.to_thread.run_sync(runtime.store.get, name)).name
    existed = await trio.to_thread.run_sync(read_profile, runtime.ledger.path, model) is not None
    await runtime.ledger.ask(Write(statements=(delete_statement(model),)))
    restarts = await apply_profile(runtime, model, None)
    return json_response({"model": model, "deleted": existed, "engine_restarts": restarts})


# -- the run ----------------------------------------------------------------------


def _values(spec: LaunchSpec) -> Values:
    """The tuned settings of a launch spec; the KV cache's default named as what it is."""
    return {
        "threads": spec.threads,
        "flash_attn": spec.flash_attn,
        "kv_cache": spec.kv_cache or "f16",
        "prompt_batch": spec.prompt_batch,
        "micro_batch": spec.micro_batch,
        "slots": spec.slots,
        "gpu_layers": spec.gpu_layers,
    }


def _profile(values: Values) -> Profile:
    return Profile(**{k: v for k, v in values.items() if k in DIMENSIONS and v is not None})


async def _facts(runtime: Runtime, req: TuneRequest) -> tuple[Facts, Values, ModelRecord]:
    """What the search starts from: the model's settings now and without a profile, what
    config.toml pins, the cores, the GPU layers a GPU build runs."""
    config = runtime.config
    record = await trio.to_thread.run_sync(runtime.store.get, req.model)
    bare = msgspec.structs.replace(
        config, profiles={k: v for k, v in config.profiles.items() if k != req.model}
    )
    now = await trio.to_thread.run_sync(launch_spec_for, config, runtime.store, record)
    plain = await trio.to_thread.run_sync(launch_spec_for, bare, runtime.store, record)
    over = config.models.get(req.model)
    pinned = {
        k: f'models."{req.model}".{k}'
        for k in DIMENSIONS
        if over is not None and getattr(over, k, None) is not None
    }
    kv_flags = ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v")
    if "kv_cache" not in pinned and any(a in kv_flags for a in now.extra_args):
        pinned["kv_cache"] = "extra_args (-ctk/-ctv)"
    layers = None
    if now.gpu_layers is not None:
        info = await trio.to_thread.run_sync(runtime.store.info, record)
        layers = info.block_count or now.gpu_layers
    facts = Facts(
        cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        concurrency=req.concurrency,
        current=_values(now),
        pinned=pinned,
        gpu_layers=layers,
        lane=now.lane,
    )
    return facts, _values(plain), record


async def _run(runtime: Runtime, link: SelfLink, ctx: JobContext) -> JobOutcome:
    req = msgspec.json.decode(ctx.job.request, type=TuneRequest)
    await ctx.restart_events()
    facts, plain, record = await _facts(runtime, req)
    previous = runtime.config.profiles.get(req.model)
    was_loaded = any((e.spec.alias or e.spec.model) == req.model for e in runtime.loaded())
    bench = BenchRequest(
        model=req.model,
        ctx=req.ctx,
        concurrency=[req.concurrency],
        requests=req.requests if req.requests is not None else max(3, 2 * req.concurrency),
        max_tokens=req.max_tokens,
    )
    done = [0]

    def as_profile(values: Values) -> Profile:
        """Only what differs from the model's settings without a profile: the same launch."""
        return _profile(winner_profile(values, plain))

    async def fits(values: Values) -> str | None:
        trial = msgspec.structs.replace(
            runtime.config, profiles={**runtime.config.profiles, req.model: as_profile(values)}
        )
        spec = await trio.to_thread.run_sync(launch_spec_for, trial, runtime.store, record)
        running = [e for e in runtime.loaded() if e.state in (EngineState.READY, EngineState.STARTING)]
        if not any(e.spec.model == spec.model for e in running):
            # a first load: as the lifecycle would decide it (evictions included)
            return runtime.lifecycle.preview(spec.model, await runtime.memory.would_need(spec)).refused
        # a restart in place: the memory the engine holds now is freed before the trial's starts
        need = await runtime.memory.would_need(spec)
        held = {e.spec.model: runtime.memory.footprint(e.spec.model) or 0 for e in running}
        others = sum(v for k, v in held.items() if k != spec.model)
        budget = runtime.memory.budget(sum(held.values()))
        if need is None or budget is None or need + others <= budget:
            return None
        return (
            f"needs about {format_bytes(need)}; {format_bytes(max(budget - others, 0))} is left "
            "beside the other loaded models"
        )

    async def measure(values: Values) -> tuple[float | None, dict[str, Any]]:
        await apply_profile(runtime, req.model, as_profile(values))
        async with link.client() as client:
            client.headers["x-blazar-client"] = f"job:{ctx.job.id}"
            # The first request (re)starts the engine with these settings and reads a prompt as
            # long as the workload's (the engine sizes its buffers then): no measure of speed.
            warm = await one_request(client, msgspec.structs.replace(bench, max_tokens=2))
            if not warm.ok:
                figures: dict[str, Any] = {"error": f"the warm-up request failed: {warm.error}"}
            else:
                figures = await run_level(client, bench, req.concurrency)
        done[0] += 1
        await ctx.event("trial", {"values": values, "figures": figures})
        await ctx.progress({"done": done[0], "of": max(req.budget, done[0])})
        if figures.get("error") or not figures.get("ok"):
            figures.setdefault("error", "; ".join(figures.get("errors") or []) or "no request succeeded")
            return None, figures
        return figures.get("aggregate_tps"), figures

    try:
        trials, best, skipped = await search(facts, measure, fits, budget=req.budget, min_gain=req.min_gain)
    except BaseException:
        with trio.CancelScope(shield=True):
            await apply_profile(runtime, req.model, previous)
        raise
    if trials[0].score is None:
        await apply_profile(runtime, req.model, previous)
        return JobOutcome(state="failed", error=f"the baseline run failed: {trials[0].verdict}")
    chosen = as_profile(best)
    explained = await runtime.explain(req.model)
    engine = engine_tag({s.name: s.value for s in explained.settings})
    tuned = TunedProfile(
        model=req.model,
        engine=engine,
        created_at=time.time(),
        profile=chosen,
        trials=[
            {
                "values": t.values,
                "changed": t.changed,
                "score": t.score,
                "verdict": t.verdict,
                "figures": t.figures,
            }
            for t in trials
        ],
        workload={
            **msgspec.to_builtins(req),
            "skipped": skipped,
            "load_average": list(os.getloadavg()),
            "cpus": facts.cpus,
        },
    )
    await runtime.ledger.ask(Write(statements=(profile_statement(tuned),)))
    await apply_profile(runtime, req.model, chosen)
    if req.apply:
        async with link.client() as client:
            client.headers["x-blazar-client"] = f"job:{ctx.job.id}"
            warm = await one_request(client, msgspec.structs.replace(bench, ctx=16, max_tokens=2))
            if not warm.ok:
                return JobOutcome(
                    state="failed", error=f"the profile is stored, but loading with it failed: {warm.error}"
                )
    elif not was_loaded:
        await runtime.stop_engine(req.model)  # as before the tune: it loads with the profile on demand
    return JobOutcome(result=msgspec.json.encode(tuned))
