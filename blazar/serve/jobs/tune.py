"""``blazar tune``: the job that finds the launch settings a model runs fastest with here.

Each trial makes the candidate settings the model's profile in the running daemon
(``actors.reload.apply_profile``: the engine starts again with them), checks first that
they fit in the memory the lifecycle would allow a load now, loads the model with a short
warm-up request, then streams the workload through the daemon's own port as ``blazar
bench`` does (the same request and timing code, ``blazar.serve.jobs.bench``). The best
settings (what differs from the model's settings without a profile) are stored in the
ledger with every trial's figures and stay applied: the engine runs them from its next
load, at once with ``apply``. A tune that fails or is cancelled puts the previous profile
back. ``POST /api/tune`` submits it (``blazar/web/routes/admin/tune.py``).

The search: which launch settings to try, in what order, and which won. A coordinate
search from the settings the model runs with now (the baseline): one setting at a time,
each of its candidate values is measured with the others at their best so far, and a value
is kept only when it is faster than the best by more than ``min_gain`` (on a shared machine
smaller differences are noise). The settings searched are the ones that matter to
llama.cpp's speed here — slots (only when more than one request runs at a time), GPU
layers (only with a GPU), threads, flash attention, the KV cache's type, the prompt batch
and the micro-batch — except those the model's own table in config.toml pins, which are
left as they are. When the search ends on other values than the baseline's, both are
measured once more and the winner is kept only if it wins again.

The search is pure: the caller measures (``measure``) and checks memory (``fits``); it is
unit-tested with a deterministic speed function.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from actors.certificates import engine_tag
from actors.config import Profile
from actors.engine import EngineState
from actors.engines.spec import LaunchSpec
from actors.eviction import format_bytes
from actors.jobs import JobContext, JobOutcome, Runner
from actors.ledger import Write
from actors.planning import launch_spec_for
from actors.profiles import TunedProfile, profile_statement
from actors.reload import apply_profile
from actors.runtime import Runtime
from blazar.serve.jobs.bench import BenchRequest, one_request, run_level
from blazar.serve.jobs.self_link import SelfLink
from registry.store import ModelRecord

__all__ = [
    "DIMENSIONS",
    "KIND",
    "Facts",
    "Trial",
    "TuneRequest",
    "dimensions",
    "runner",
    "search",
    "winner_profile",
]

KIND = "tune"

DIMENSIONS = ("slots", "gpu_layers", "threads", "flash_attn", "kv_cache", "prompt_batch", "micro_batch")
"""The tuned settings (``actors.config.Profile``'s fields), in the order they are searched:
the largest levers first, so that a small budget spends its trials where they matter."""

Values = dict[str, Any]


@dataclass(frozen=True)
class Facts:
    cpus: int
    """CPU cores the engine may use."""
    concurrency: int
    """Requests the workload runs at once."""
    current: Values
    """Each tuned setting as the model runs now (None: the engine's own choice)."""
    pinned: dict[str, str] = field(default_factory=dict)
    """Settings config.toml fixes for this model → the key that fixes them."""
    gpu_layers: int | None = None
    """All the model's layers, when a GPU build of llama-server runs it; None: the CPU lane."""
    lane: str = "llamacpp"
    """The lane that runs the model: other lanes than llama.cpp's take only ``slots``."""


@dataclass
class Trial:
    values: Values
    changed: str | None
    """The setting this trial changed from the best so far; None for the baseline;
    ``confirm baseline`` and ``confirm best`` for the runs that check the winner."""
    score: float | None = None
    """The workload's tokens per second; None when it was not measured."""
    figures: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""


def _threads(cpus: int) -> list[int]:
    return sorted({cpus, max(1, cpus // 2), max(1, cpus - 1)}, reverse=True)


def _batches(gpu: bool) -> list[int]:
    return [512, 1024, 2048] if gpu else [128, 256, 512]


def dimensions(facts: Facts) -> tuple[list[tuple[str, list[Any]]], dict[str, str]]:
    """Each searched setting with the values to try, and each skipped one with why."""
    tried: list[tuple[str, list[Any]]] = []
    skipped: dict[str, str] = {}
    gpu = facts.gpu_layers is not None
    for name in DIMENSIONS:
        if facts.lane != "llamacpp" and name != "slots":
            skipped[name] = f"a llama.cpp setting: this model runs on the {facts.lane} lane"
            continue
        if name in facts.pinned:
            skipped[name] = f"pinned by {facts.pinned[name]} in config.toml"
            continue
        values: list[Any]
        if name == "threads":
            values = _threads(facts.cpus)
        elif name == "flash_attn":
            values = ["on", "off"]
        elif name == "kv_cache":
            values = ["f16", "q8_0"]
        elif name == "prompt_batch":
            values = _batches(gpu)
        elif name == "micro_batch":
            values = ["half", "quarter"]  # of the prompt batch the search has chosen by then
        elif name == "slots":
            if facts.concurrency <= 1:
                skipped[name] = "one request at a time (tune with --concurrency N for a parallel workload)"
                continue
            values = sorted({1, max(1, facts.concurrency // 2), facts.concurrency})
        else:  # gpu_layers
            if facts.gpu_layers is None:
                skipped[name] = "no GPU build of llama-server runs this model here"
                continue
            n = facts.gpu_layers
            values = sorted({n, (n * 3) // 4, n // 2}, reverse=True)
        tried.append((name, values))
    return tried, skipped


def _concrete(name: str, value: Any, best: Values) -> Any:
    if name != "micro_batch":
        return value
    batch = best.get("prompt_batch") or 512
    return max(16, batch // (2 if value == "half" else 4))


def _conflict(values: Values) -> str | None:
    if values.get("kv_cache") not in (None, "f16") and values.get("flash_attn") == "off":
        return "a quantized KV cache needs flash attention"
    batch, micro = values.get("prompt_batch"), values.get("micro_batch")
    if batch is not None and micro is not None and micro > batch:
        return "the micro-batch exceeds the prompt batch"
    return None


async def search(
    facts: Facts,
    measure: Callable[[Values], Awaitable[tuple[float | None, dict[str, Any]]]],
    fits: Callable[[Values], Awaitable[str | None]],
    *,
    budget: int,
    min_gain: float = 0.05,
) -> tuple[list[Trial], Values, dict[str, str]]:
    """Measure the baseline, then each candidate value until ``budget`` trials are spent.

    ``measure(values)`` returns the workload's tokens per second (None: the run failed)
    and its figures; ``fits(values)`` returns why the values do not fit in memory, or None.
    Returns every trial, the best values and the settings not searched (with why)."""
    tried, skipped = dimensions(facts)
    best = dict(facts.current)
    baseline = Trial(values=dict(best), changed=None)
    baseline.score, baseline.figures = await measure(best)
    trials = [baseline]
    if baseline.score is None:
        baseline.verdict = "failed: " + str(baseline.figures.get("error", "no answer"))
        return trials, best, skipped
    baseline.verdict = "baseline"
    best_score = baseline.score
    for name, values in tried:
        start = best.get(name)  # measured already, as part of the best so far
        for raw in values:
            value = _concrete(name, raw, best)
            if value == start or value == best.get(name):
                continue
            if len(trials) >= budget:
                skipped.setdefault(name, f"the budget of {budget} trials was spent")
                break
            candidate = {**best, name: value}
            trial = Trial(values=candidate, changed=name)
            trials.append(trial)
            why = _conflict(candidate) or await fits(candidate)
            if why is not None:
                trial.verdict = f"skipped: {why}"
                continue
            trial.score, trial.figures = await measure(candidate)
            if trial.score is None:
                trial.verdict = "failed: " + str(trial.figures.get("error", "no answer"))
            elif trial.score > best_score * (1 + min_gain):
                trial.verdict = f"kept ({trial.score / best_score - 1:+.0%})"
                best, best_score = candidate, trial.score
            else:
                trial.verdict = f"not kept ({trial.score / best_score - 1:+.0%})"
    if best != facts.current:
        best = await _confirm(facts.current, best, measure, trials, min_gain)
    return trials, best, skipped


async def _confirm(
    baseline: Values,
    best: Values,
    measure: Callable[[Values], Awaitable[tuple[float | None, dict[str, Any]]]],
    trials: list[Trial],
    min_gain: float,
) -> Values:
    """Measure the baseline and the winner once more, side by side: the winner of a search
    over noisy runs is biased towards a lucky run, so it is kept only if it wins again."""
    again = []
    for values, role in ((baseline, "baseline"), (best, "best")):
        trial = Trial(values=dict(values), changed=f"confirm {role}")
        trial.score, trial.figures = await measure(values)
        trials.append(trial)
        again.append(trial)
    base, win = again
    if base.score is None or win.score is None:
        failed = base if base.score is None else win
        failed.verdict = "failed: " + str(failed.figures.get("error", "no answer"))
        win.verdict += "; the baseline stays"
        return baseline
    gain = win.score / base.score - 1
    base.verdict = "re-measured"
    if win.score > base.score * (1 + min_gain):
        win.verdict = f"confirmed ({gain:+.0%} over the baseline)"
        return best
    win.verdict = f"not confirmed ({gain:+.0%}): the baseline stays"
    return baseline


def winner_profile(best: Values, plain: Values) -> Values:
    """The settings of ``best`` that differ from ``plain`` (what the model runs with without a
    profile): what the stored profile sets."""
    return {k: v for k, v in best.items() if v is not None and v != plain.get(k)}


# -- the job ----------------------------------------------------------------------


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


def runner(runtime: Runtime, link: SelfLink) -> Runner:
    """Run tunes; their trials go to the daemon's own port through ``link``."""

    async def run(ctx: JobContext) -> JobOutcome:
        return await _run(runtime, link, ctx)

    return run


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
