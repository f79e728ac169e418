"""The benchmark job (``blazar bench``): what a client gets, timed at each concurrency level.

A benchmark streams chat completions to the daemon's own port (``self_link``), as clients
would, at each concurrency level asked: it times the first token (TTFT) and every token
after it, and reads the token counts from the answer's usage. Per level it keeps the TTFT
and inter-token percentiles, the prefill speed (prompt tokens over TTFT, queueing included
at a level above the model's slots) and the decode speed (per stream, and of all streams
together). Every prompt starts with text of its own, so that no request reuses another's
prompt cache. The receipt (actors/certificates.py) records the engine version and launch
settings it ran under. ``POST /api/bench`` submits it (``blazar/web/routes/admin/bench.py``).
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import statistics
import time
from typing import Any

import httpx
import msgspec
import trio

from actors.certificates import Receipt, engine_tag, percentile, receipt_statement
from actors.jobs import JobContext, JobOutcome, Runner
from actors.ledger import Write
from actors.runtime import Runtime
from blazar.serve.jobs.self_link import SelfLink

__all__ = [
    "KIND",
    "BenchRequest",
    "active_engine",
    "one_request",
    "run_level",
    "runner",
    "summarize",
]

KIND = "bench"
_WORDS = (
    "river stone quiet garden lantern copper meadow harbor winter signal orchard canvas "
    "thunder pocket marble violet compass feather glacier timber"
).split()


class BenchRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    ctx: int = 256
    """Prompt tokens per request (about: the filler is counted in words)."""
    concurrency: list[int] = msgspec.field(default_factory=lambda: [1, 4, 8])
    requests: int | None = None
    """Requests per level; None: twice the level, at least 4."""
    max_tokens: int = 64


def runner(runtime: Runtime, link: SelfLink) -> Runner:
    """Run benchmarks; their requests go to the daemon's own port through ``link``."""

    async def run(ctx: JobContext) -> JobOutcome:
        return await _run(runtime, link, ctx)

    return run


async def active_engine(runtime: Runtime, model: str) -> tuple[str, dict[str, Any]]:
    """The engine tag ``model`` would run under now, and its launch settings."""
    explained = await runtime.explain(model)
    settings = {s.name: s.value for s in explained.settings}
    return engine_tag(settings), settings


def _prompt(words: int) -> str:
    """A prompt of about ``words`` tokens that no other request shares from its first token."""
    nonce = secrets.token_hex(4)
    # the instruction and chat template take about 40 tokens; a filler word about 1.2
    count = max(int((words - 40) / 1.2), 0)
    filler = " ".join(_WORDS[(i * 7 + len(nonce)) % len(_WORDS)] for i in range(count))
    return f"[{nonce}] {filler}\nWrite a long story about a lighthouse keeper. Do not stop early."


class _Sample(msgspec.Struct, kw_only=True):
    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    gaps_s: list[float] = []
    decode_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


async def one_request(client: httpx.AsyncClient, req: BenchRequest) -> _Sample:
    body = {
        "model": req.model,
        "messages": [{"role": "user", "content": _prompt(req.ctx)}],
        "max_tokens": req.max_tokens,
        "temperature": 0.8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    arrivals: list[float] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            return _Sample(ok=False, error=f"HTTP {resp.status_code}: {text[:300]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                return _Sample(ok=False, error=json.dumps(event["error"])[:300])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    arrivals.append(time.perf_counter())
    if not arrivals:
        return _Sample(ok=False, error="no token came back")
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return _Sample(
        ok=True,
        ttft_s=arrivals[0] - started,
        gaps_s=gaps,
        decode_s=arrivals[-1] - arrivals[0],
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens") or len(arrivals),
    )


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def _rate(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def summarize(level: int, samples: list[_Sample], wall_s: float) -> dict[str, Any]:
    """One level's figures from its samples (pure: unit-tested)."""
    good = [s for s in samples if s.ok]
    ttfts = [s.ttft_s for s in good if s.ttft_s is not None]
    gaps = [g for s in good for g in s.gaps_s]
    prefill = [s.prompt_tokens / s.ttft_s for s in good if s.prompt_tokens and s.ttft_s]
    decode = [
        (s.completion_tokens - 1) / s.decode_s
        for s in good
        if s.completion_tokens and s.completion_tokens > 1 and s.decode_s
    ]
    tokens = sum(s.completion_tokens or 0 for s in good)
    prompts = [s.prompt_tokens for s in good if s.prompt_tokens]
    return {
        "concurrency": level,
        "requests": len(samples),
        "ok": len(good),
        "errors": sorted({s.error for s in samples if s.error})[:3],
        "prompt_tokens": round(statistics.median(prompts)) if prompts else None,
        "completion_tokens": tokens,
        "ttft_ms": {f"p{q}": _ms(percentile(ttfts, q)) for q in (50, 90, 99)},
        "itl_ms": {f"p{q}": _ms(percentile(gaps, q)) for q in (50, 90, 99)},
        "prefill_tps": _rate(statistics.median(prefill)) if prefill else None,
        "decode_tps": _rate(statistics.median(decode)) if decode else None,
        "aggregate_tps": _rate(tokens / wall_s) if wall_s > 0 else None,
        "wall_s": round(wall_s, 3),
    }


async def run_level(client: httpx.AsyncClient, req: BenchRequest, level: int) -> dict[str, Any]:
    total = req.requests if req.requests is not None else max(4, 2 * level)
    samples: list[_Sample] = []
    left = [total]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            try:
                samples.append(await one_request(client, req))
            except httpx.HTTPError as exc:
                samples.append(_Sample(ok=False, error=repr(exc)[:300]))

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(min(level, total)):
            nursery.start_soon(worker)
    return summarize(level, samples, time.perf_counter() - started)


async def _run(runtime: Runtime, link: SelfLink, ctx: JobContext) -> JobOutcome:
    req = msgspec.json.decode(ctx.job.request, type=BenchRequest)
    await ctx.restart_events()
    async with link.client() as client:
        client.headers["x-blazar-client"] = f"job:{ctx.job.id}"
        # The first request loads the model: its time is no measure of speed.
        warm = await one_request(client, msgspec.structs.replace(req, ctx=16, max_tokens=2))
        if not warm.ok:
            return JobOutcome(state="failed", error=f"the warm-up request failed: {warm.error}")
        levels = []
        for level in req.concurrency:
            result = await run_level(client, req, level)
            levels.append(result)
            await ctx.event("level", result)
            await ctx.progress({"done": len(levels), "of": len(req.concurrency), "concurrency": level})
    engine, settings = await active_engine(runtime, req.model)
    launch = {
        k: settings.get(k)
        for k in (
            "engine",
            "engine_version",
            "slots",
            "ctx_per_slot",
            "ctx_total",
            "gpu_layers",
            "prompt_batch",
        )
    }
    receipt = Receipt(
        id=f"bench_{secrets.token_hex(8)}",
        model=req.model,
        engine=engine,
        created_at=time.time(),
        settings={
            "launch": launch,
            "run": msgspec.to_builtins(req),
            "load_average": list(os.getloadavg()),
            "cpus": os.cpu_count(),
        },
        levels=levels,
    )
    await runtime.ledger.ask(Write(statements=(receipt_statement(receipt),)))
    return JobOutcome(result=msgspec.json.encode(receipt))
