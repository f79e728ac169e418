"""Daemon memory: RSS idle, under 16 concurrent clients, and its growth over a long run.

The daemon runs the instant upstream as its engine (so the long run is quick and
only the gateway's own memory is in play). After a warm-up of mixed requests the
idle RSS is read; then 16 clients send mixed requests while RSS is sampled every
50 ms (its median and peak are "under C=16"); then the long run (10,000 mixed
requests at C=16), sampled every 250 ms. Growth compares the RSS settled (1 s
idle) before and after the long run. The mix cycles through OpenAI, Ollama and
Anthropic requests, each stream and non-stream, so the translating paths are in
it too. RSS is the daemon process's own VmRSS (/proc/<pid>/status), not its
engine child's. One long run per result: ``--runs`` does not apply.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench import _plots
from bench._harness import Context
from bench._rigs import LoadGen, daemon_commands, instant_config, log, running_daemon
from bench._system import rss_bytes
from bench._workloads import DIALECTS, chat_request, job

__all__ = ["TITLE", "run"]

TITLE = "Daemon memory"
UPSTREAM_ARGS = ("--chunks", "16")


def _mb(n: float) -> float:
    return round(n / 2**20, 2)


def _settled(pid: int) -> int:
    time.sleep(1.0)
    return rss_bytes(pid)


def run(ctx: Context) -> dict[str, Any]:
    warmup = ctx.pick(1000, 60)
    loaded_count = ctx.pick(3000, 120)
    long_count = ctx.pick(10_000, 300)
    mix = [chat_request(d, max_tokens=16, stream=s) for d in DIALECTS for s in (False, True)]
    with running_daemon(instant_config(*UPSTREAM_ARGS), tag="memory") as daemon, LoadGen() as lg:
        pid = daemon.proc.pid
        rss_start = rss_bytes(pid)
        lg.run(job(daemon.url, mix, concurrency=16, count=warmup))
        rss_idle = _settled(pid)

        loaded: list[int] = []
        res_loaded = lg.run(
            job(daemon.url, mix, concurrency=16, count=loaded_count),
            sample=lambda: loaded.append(rss_bytes(pid)),
            every_s=0.05,
        )
        rss_before = _settled(pid)
        log(f"memory: long run of {long_count} requests")
        t0 = time.perf_counter()
        series: list[tuple[float, int]] = []
        res_long = lg.run(
            job(daemon.url, mix, concurrency=16, count=long_count),
            sample=lambda: series.append((time.perf_counter() - t0, rss_bytes(pid))),
            every_s=0.25,
        )
        rss_after = _settled(pid)
    growth_pct = (rss_after - rss_before) / rss_before * 100 if rss_before else None
    values = {"rss_growth_pct": {"median": growth_pct, "min": growth_pct, "max": growth_pct, "n": 1}}
    peak_long = max((r for _, r in series), default=0)
    rows = [
        ["at start (no request yet)", _mb(rss_start)],
        [f"idle after {warmup} warm-up requests", _mb(rss_idle)],
        ["under C=16: median of samples", _mb(statistics.median(loaded)) if loaded else None],
        ["under C=16: peak", _mb(max(loaded)) if loaded else None],
        ["idle before the long run", _mb(rss_before)],
        [f"peak during the long run ({long_count} requests)", _mb(peak_long)],
        ["idle after the long run", _mb(rss_after)],
    ]
    notes = []
    errors = res_loaded["errors"] + res_long["errors"]
    if errors:
        notes.append(f"{errors} requests failed: {res_long['error_samples'] or res_loaded['error_samples']}")
    plots = []
    if series and _plots.timeseries(
        ctx.plot_path("rss"),
        title=f"Daemon RSS during {long_count} requests (C=16)",
        xlabel="seconds",
        ylabel="MiB",
        xs=[t for t, _ in series],
        ys=[r / 2**20 for _, r in series],
    ):
        plots.append({"file": ctx.plot_path("rss").name, "title": "Daemon RSS over the long run"})
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "warmup": warmup,
            "loaded_requests": loaded_count,
            "long_run_requests": long_count,
            "concurrency": 16,
            "mix": [f"{r['path']} stream={r['body']['stream']}" for r in mix],
        },
        "values": values,
        "tables": [{"title": "Daemon RSS (MiB)", "columns": ["when", "RSS MiB"], "rows": rows}],
        "plots": plots,
        "notes": notes,
        "rss_series_mb": [[round(t, 2), _mb(r)] for t, r in series],
        "long_run": {
            "requests": res_long["count"],
            "wall_s": res_long["wall_s"],
            "errors": res_long["errors"],
        },
        "growth_pct": growth_pct,
        "commands": daemon_commands(instant_config(*UPSTREAM_ARGS))
        | {
            "load generator": " ".join(LoadGen.command),
        },
    }
