"""The relay with several data-plane workers (``workers = N``) against one process.

The scale benchmark's rig (``bench/scale.py``): the instant upstream as the daemon's
engine, paced streams from a separate load generator, a second instance of the
upstream as the direct baseline. One daemon per worker count, side by side in one run,
the targets alternating at each level. The CPU and memory of a daemon with workers are
those of the runtime process and its workers together (not the engine's), and the
runtime's own share: the one process that cannot be multiplied.

``BLAZAR_BENCH_WORKERS`` names the worker counts (default ``1,2``) and
``BLAZAR_BENCH_LEVELS`` the concurrencies (default ``64,256``; ``scripts/gpu_check.py``
runs ``256,1024`` with ``1,2,4`` where a machine has the cores). On a 2-core machine the
load generator, the upstream and the workers share two cores: a gain cannot show there,
only what the split costs.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from bench._harness import Context
from bench._rigs import InstantUpstream, LoadGen, daemon_commands, instant_config, log, running_daemon
from bench._stats import summarize
from bench._workloads import chat_request, job
from bench.scale import CHUNKS, INTERVAL_MS, failed_streams, measure

__all__ = ["TITLE", "run"]

TITLE = "The relay with several data-plane workers"


def _counts(name: str, default: str) -> tuple[int, ...]:
    return tuple(int(v) for v in os.environ.get(name, default).split(",") if v.strip())


def worker_pids(daemon_pid: int) -> list[int]:
    """The daemon's worker processes (each names its index in its environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            if ppid != daemon_pid:
                continue
            if b"BLAZAR_WORKER_INDEX=" in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except (OSError, StopIteration, ValueError):
            continue
    return found


def run(ctx: Context) -> dict[str, Any]:
    duration_s = ctx.pick(6.0, 1.5)
    counts = _counts("BLAZAR_BENCH_WORKERS", "1,2")
    levels = ctx.pick(_counts("BLAZAR_BENCH_LEVELS", "64,256"), (64,))
    upstream_args = ("--chunks", str(CHUNKS), "--interval-ms", str(INTERVAL_MS), "-np", str(max(levels)))
    request = chat_request("openai", max_tokens=CHUNKS, stream=True)
    runs: list[dict[str, Any]] = []
    configs = {n: f"workers = {n}\n" + instant_config(*upstream_args, slots=max(levels)) for n in counts}
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(InstantUpstream(*upstream_args, log_dir=ctx.work_dir))
        lg = stack.enter_context(LoadGen())
        assert upstream.proc is not None
        targets: dict[str, tuple[str, int | list[int]]] = {"direct": (upstream.url, upstream.proc.pid)}
        for n, config in configs.items():
            daemon = stack.enter_context(running_daemon(config, tag=f"workers{n}"))
            lg.run(job(daemon.url, [request], concurrency=4, count=8))  # the daemon starts its engine
            pids = [daemon.proc.pid, *worker_pids(daemon.proc.pid)]
            assert len(pids) == (n + 1 if n > 1 else 1), f"workers = {n}: found processes {pids}"
            targets[f"workers={n}"] = (daemon.url, pids)
        for r in range(ctx.runs):
            log(f"workers: run {r + 1}/{ctx.runs}")
            one: dict[str, Any] = {}
            for c in levels:
                for name, (url, serving) in targets.items():
                    one[f"C={c} {name}"] = measure(lg, url, request, c, duration_s, serving)
            runs.append(one)
        commands: dict[str, Any] = {"daemon": daemon_commands("")["daemon"]}
        commands |= {f"workers={n} config.toml": config for n, config in configs.items()}
        commands |= {"direct upstream": upstream.argv, "load generator": " ".join(LoadGen.command)}

    def get(key: str, field: str) -> dict[str, Any]:
        return summarize(r[key][field] for r in runs)

    def added(c: int, name: str, field: str, base: str = "direct") -> dict[str, Any]:
        return summarize(r[f"C={c} {name}"][field] - r[f"C={c} {base}"][field] for r in runs)

    def ratio(c: int, name: str, field: str, base: str = "direct") -> dict[str, Any]:
        return summarize(r[f"C={c} {name}"][field] / r[f"C={c} {base}"][field] for r in runs)

    rows = []
    for c in levels:
        for n in counts:
            name = f"workers={n}"
            rows.append(
                [
                    c,
                    n,
                    ratio(c, name, "chunks_per_s"),
                    get(f"C={c} {name}", "cpu_ms_per_chunk"),
                    get(f"C={c} {name}", "first_cpu_ms_per_chunk"),
                    get(f"C={c} {name}", "cores"),
                    added(c, name, "itl_p50_ms"),
                    added(c, name, "itl_p99_ms"),
                ]
            )
    values: dict[str, Any] = {}
    if 2 in counts and 1 in counts and levels:
        c = levels[-1]
        values[f"workers2_cpu_ratio_c{c}"] = ratio(c, "workers=2", "cpu_ms_per_chunk", base="workers=1")
        values[f"workers2_p50_added_ms_c{c}"] = added(c, "workers=2", "itl_p50_ms", base="workers=1")
        values[f"workers2_runtime_cpu_ratio_c{c}"] = summarize(
            r[f"C={c} workers=2"]["first_cpu_ms_per_chunk"] / r[f"C={c} workers=1"]["cpu_ms_per_chunk"]
            for r in runs
        )
    errors = failed_streams(runs)
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "chunks": CHUNKS,
            "interval_ms": INTERVAL_MS,
            "levels": list(levels),
            "workers": list(counts),
            "duration_s": duration_s,
            "runs": ctx.runs,
            "cpus": os.cpu_count(),
        },
        "values": values,
        "tables": [
            {
                "title": f"Paced streams, {CHUNKS} chunks {INTERVAL_MS:g} ms apart, by worker count"
                f" (median [min, max] over {len(runs)} runs)",
                "columns": [
                    "C",
                    "workers",
                    "chunks/s ÷ direct",
                    "CPU ms/chunk (runtime + workers)",
                    "of which the runtime's",
                    "cores",
                    "inter-token p50 added (ms)",
                    "inter-token p99 added (ms)",
                ],
                "rows": rows,
            }
        ],
        "plots": [],
        "notes": [f"streams that failed: {errors}"] if errors else [],
        "commands": commands,
        "raw_runs": runs,
    }
