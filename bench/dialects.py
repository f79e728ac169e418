"""The daemon's CPU per relayed chunk in each dialect, over one OpenAI engine.

The daemon runs ``bench/instant-upstream`` as its engine (as in ``overhead``): 32 chunks a
stream, one a millisecond, then the finish chunk and ``[DONE]``. The load generator (a
separate process, keep-alive, closed loop, a fixed time per measurement) streams the same
prompt at C = 16 in three dialects, one after the other in every run: OpenAI chat (the
engine's own bytes, relayed untouched), Anthropic ``/v1/messages`` and Ollama
``/api/chat`` (each chunk decoded and encoded again in the dialect). CPU is the daemon's
utime+stime over the measured streams divided by the upstream's events (34 per stream),
so the three are comparable whatever each dialect writes per chunk; the ratio is each
translated dialect's figure over the OpenAI one in the same run.
"""

from __future__ import annotations

from typing import Any

from bench._harness import Context
from bench._rigs import InstantUpstream, LoadGen, daemon_commands, instant_config, log, running_daemon
from bench._stats import summarize
from bench._system import cpu_seconds
from bench._workloads import chat_request, job

__all__ = ["TITLE", "run"]

TITLE = "CPU per chunk in each dialect"
CHUNKS = 32
INTERVAL_MS = 1.0
EVENTS_PER_STREAM = CHUNKS + 2
CONCURRENCY = 16
DIALECTS = ("openai", "anthropic", "ollama")
UPSTREAM_ARGS = ("--chunks", str(CHUNKS), "--interval-ms", str(INTERVAL_MS))


def run(ctx: Context) -> dict[str, Any]:
    duration_s = ctx.pick(4.0, 0.3)
    config = instant_config(*UPSTREAM_ARGS)
    runs: list[dict[str, Any]] = []
    with (
        running_daemon(config, tag="dialects") as daemon,
        InstantUpstream(*UPSTREAM_ARGS, log_dir=ctx.work_dir) as upstream,
        LoadGen() as lg,
    ):
        requests = {d: chat_request(d, max_tokens=CHUNKS, stream=True) for d in DIALECTS}
        lg.run(job(daemon.url, [requests["openai"]], concurrency=4, count=ctx.pick(100, 10)))
        pid = daemon.proc.pid
        for r in range(ctx.runs):
            log(f"dialects: run {r + 1}/{ctx.runs}")
            one: dict[str, Any] = {}
            for dialect, request in requests.items():
                lg.run(job(daemon.url, [request], concurrency=CONCURRENCY, count=ctx.pick(64, 16)))
                cpu0 = cpu_seconds([pid])
                res = lg.run(job(daemon.url, [request], concurrency=CONCURRENCY, duration_s=duration_s))
                cpu_s = cpu_seconds([pid]) - cpu0
                n = max(res["count"], 1)
                one[dialect] = {
                    "streams": res["count"],
                    "errors": res["errors"],
                    "cpu_ms_per_chunk": cpu_s * 1000 / (n * EVENTS_PER_STREAM),
                }
            runs.append(one)
        commands = daemon_commands(config) | {
            "direct upstream (not measured)": upstream.argv,
            "load generator": " ".join(LoadGen.command),
        }

    def ratio(dialect: str) -> dict[str, Any]:
        return summarize(r[dialect]["cpu_ms_per_chunk"] / r["openai"]["cpu_ms_per_chunk"] for r in runs)

    def get(dialect: str, field: str, scale: float = 1.0) -> dict[str, Any]:
        return summarize(r[dialect][field] * scale for r in runs)

    rows = [[d, get(d, "cpu_ms_per_chunk", 1000.0), ratio(d), get(d, "streams")] for d in DIALECTS]
    errors = {f"{d} run {i + 1}": r[d]["errors"] for i, r in enumerate(runs) for d in DIALECTS}
    errors = {k: v for k, v in errors.items() if v}
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "chunks": CHUNKS,
            "interval_ms": INTERVAL_MS,
            "concurrency": CONCURRENCY,
            "duration_s": duration_s,
            "runs": ctx.runs,
        },
        "values": {
            "anthropic_chunk_ratio": ratio("anthropic"),
            "ollama_chunk_ratio": ratio("ollama"),
        },
        "tables": [
            {
                "title": f"Streams at C={CONCURRENCY}, {CHUNKS} chunks {INTERVAL_MS:g} ms apart"
                f" (median [min, max] over {len(runs)} runs)",
                "columns": ["dialect", "CPU µs per upstream chunk", "÷ OpenAI pass-through", "streams"],
                "rows": rows,
            }
        ],
        "plots": [],
        "notes": [f"streams that failed: {errors}"] if errors else [],
        "commands": commands,
        "raw_runs": runs,
    }
