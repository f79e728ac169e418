"""The relay at GPU-scale concurrency: hundreds of paced streams through one daemon.

The daemon runs ``bench/instant-upstream`` as its engine with as many slots as the
largest level, each stream ``CHUNKS`` chunks paced ``INTERVAL_MS`` apart (an engine
serving every stream at 100 tokens/s); a second instance with the same arguments is
the direct baseline. At each concurrency the load generator (a separate process,
one keep-alive connection per stream, a closed loop) streams for a fixed time, and
the two targets alternate. Reported per level: chunks relayed per second, the
serving process's CPU per chunk and in cores (utime+stime over the wall time), the
inter-token p99 through the daemon minus the same figure direct, and the daemon's
resident memory per concurrent stream (peak during the run minus idle, ÷ C).

On a machine with few cores the load generator competes with the daemon for them:
the direct baseline pays that too, so compare the two columns, not the absolute
figures, and read the cores column with the machine's core count in mind.
"""

from __future__ import annotations

from typing import Any

from bench._harness import Context
from bench._rigs import InstantUpstream, LoadGen, daemon_commands, instant_config, log, running_daemon
from bench._stats import summarize
from bench._system import cpu_seconds, rss_bytes
from bench._workloads import chat_request, job, token_metrics

__all__ = ["CHUNKS", "INTERVAL_MS", "TITLE", "UPSTREAM_ARGS", "measure", "run"]

TITLE = "The relay at GPU-scale concurrency"
CHUNKS = 100
INTERVAL_MS = 10.0
LEVELS = (64, 256, 512)
EVENTS_PER_STREAM = CHUNKS + 2  # the chunks, the finish chunk, [DONE]
UPSTREAM_ARGS = ("--chunks", str(CHUNKS), "--interval-ms", str(INTERVAL_MS), "-np", str(max(LEVELS)))


def measure(
    lg: LoadGen, url: str, request: dict[str, Any], c: int, duration_s: float, pid: int | list[int]
) -> dict[str, Any]:
    """One level against one target, whose serving processes are ``pid`` (CPU and RSS summed)."""
    pids = pid if isinstance(pid, list) else [pid]
    lg.run(job(url, [request], concurrency=c, count=c))  # every connection open and warm

    def rss_now() -> int:
        return sum(rss_bytes(p) for p in pids)

    rss: list[int] = []
    rss_idle = rss_now()
    cpu0 = cpu_seconds(pids)
    first0 = cpu_seconds(pids[:1])
    res = lg.run(
        job(url, [request], concurrency=c, duration_s=duration_s, events=True),
        sample=lambda: rss.append(rss_now()),
        every_s=0.1,
    )
    cpu_s = cpu_seconds(pids) - cpu0
    first_s = cpu_seconds(pids[:1]) - first0
    tokens = token_metrics(res)
    chunks = res["count"] * EVENTS_PER_STREAM
    return {
        "streams": res["count"],
        "errors": res["errors"],
        "error_samples": res.get("error_samples", []),
        "chunks_per_s": chunks / res["wall_s"] if res["wall_s"] else None,
        "cpu_ms_per_chunk": cpu_s * 1000 / chunks if chunks else None,
        # the first process's share (with workers: the runtime's)
        "first_cpu_ms_per_chunk": first_s * 1000 / chunks if chunks else None,
        "cores": cpu_s / res["wall_s"] if res["wall_s"] else None,
        "itl_p99_ms": tokens["itl_p99_ms"],
        "itl_p50_ms": tokens["itl_p50_ms"],
        "rss_kib_per_stream": (max(rss, default=rss_idle) - rss_idle) / 1024 / c,
    }


def failed_streams(runs: list[dict[str, Any]]) -> dict[str, str]:
    """Each target and level whose streams failed, over all runs: how many, and what failed
    (the load generator's distinct error samples), so that a note says why, not only how many."""
    counts: dict[str, int] = {}
    samples: dict[str, set[str]] = {}
    for r in runs:
        for key, v in r.items():
            if v["errors"]:
                counts[key] = counts.get(key, 0) + v["errors"]
                samples.setdefault(key, set()).update(v.get("error_samples") or [])
    return {k: f"{n} ({'; '.join(sorted(samples[k])) or 'no sample'})" for k, n in counts.items()}


def run(ctx: Context) -> dict[str, Any]:
    duration_s = ctx.pick(6.0, 1.5)
    levels = ctx.pick(LEVELS, (64,))
    config = instant_config(*UPSTREAM_ARGS, slots=max(LEVELS))
    runs: list[dict[str, Any]] = []
    request = chat_request("openai", max_tokens=CHUNKS, stream=True)
    with (
        running_daemon(config, tag="scale") as daemon,
        InstantUpstream(*UPSTREAM_ARGS, log_dir=ctx.work_dir) as upstream,
        LoadGen() as lg,
    ):
        assert upstream.proc is not None
        targets = {"direct": (upstream.url, upstream.proc.pid), "blazar": (daemon.url, daemon.proc.pid)}
        lg.run(job(daemon.url, [request], concurrency=4, count=8))  # the daemon starts its engine
        for r in range(ctx.runs):
            log(f"scale: run {r + 1}/{ctx.runs}")
            one: dict[str, Any] = {}
            for c in levels:
                for name, (url, pid) in targets.items():
                    one[f"C={c} {name}"] = measure(lg, url, request, c, duration_s, pid)
            runs.append(one)
        commands = daemon_commands(config) | {
            "direct upstream": upstream.argv,
            "load generator": " ".join(LoadGen.command),
        }

    def get(key: str, field: str) -> dict[str, Any]:
        return summarize(r[key][field] for r in runs)

    def added(c: int, field: str) -> dict[str, Any]:
        return summarize(r[f"C={c} blazar"][field] - r[f"C={c} direct"][field] for r in runs)

    values: dict[str, Any] = {}
    if 256 in levels:
        values["scale_itl_added_p99_ms_c256"] = added(256, "itl_p99_ms")
        values["scale_cores_c256"] = get("C=256 blazar", "cores")
        values["scale_cpu_per_chunk_ms_c256"] = get("C=256 blazar", "cpu_ms_per_chunk")
        values["scale_chunk_ratio_c256"] = summarize(
            r["C=256 blazar"]["chunks_per_s"] / r["C=256 direct"]["chunks_per_s"] for r in runs
        )
    rows = []
    for c in levels:
        rows.append(
            [
                c,
                get(f"C={c} direct", "chunks_per_s"),
                get(f"C={c} blazar", "chunks_per_s"),
                get(f"C={c} blazar", "cpu_ms_per_chunk"),
                get(f"C={c} blazar", "cores"),
                get(f"C={c} direct", "itl_p99_ms"),
                added(c, "itl_p99_ms"),
                get(f"C={c} blazar", "rss_kib_per_stream"),
            ]
        )
    errors = failed_streams(runs)
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "chunks": CHUNKS,
            "interval_ms": INTERVAL_MS,
            "levels": list(levels),
            "duration_s": duration_s,
            "runs": ctx.runs,
        },
        "values": values,
        "tables": [
            {
                "title": f"Paced streams, {CHUNKS} chunks {INTERVAL_MS:g} ms apart"
                f" (median [min, max] over {len(runs)} runs)",
                "columns": [
                    "C",
                    "direct chunks/s",
                    "Blazar chunks/s",
                    "Blazar CPU ms/chunk",
                    "Blazar cores",
                    "direct inter-token p99 (ms)",
                    "inter-token p99 added (ms)",
                    "Blazar RSS KiB/stream",
                ],
                "rows": rows,
            }
        ],
        "plots": [],
        "notes": [f"streams that failed: {errors}"] if errors else [],
        "commands": commands,
        "raw_runs": runs,
    }
