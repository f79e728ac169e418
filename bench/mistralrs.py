"""Gateway vs direct engine on the mistral.rs lane: decode speed, TTFT and inter-token latency.

The daemon runs the test model pinned to the mistral.rs lane (``[models."NAME"] engine
= "mistralrs"``: the host on the ``mistralrs`` wheel); the harness reads that child's argv
from /proc and starts a second host with exactly the same flags on another port. Each
run sends the same requests through the gateway (A) and straight to the direct host (B),
one after the other: A B A B … Output is fixed (temperature 0, a fixed ``max_tokens`` and
``ignore_eos``), so every request decodes the same number of tokens. One stream at a time:
on the CPU this lane runs one sequence at once (``--max-seqs 1``; docs/engines.md).
"""

from __future__ import annotations

from typing import Any

from bench._harness import Context
from bench._rigs import (
    DirectEngine,
    LoadGen,
    daemon_commands,
    engine_config,
    engine_of,
    load_model,
    log,
    redact,
    running_daemon,
)
from bench._stats import ratio, summarize
from bench._system import cpu_seconds
from bench._workloads import chat_request, job, token_metrics
from tests.support import MODEL

__all__ = ["TITLE", "run"]

TITLE = "Gateway vs direct engine, mistral.rs lane"


def _config() -> str:
    return engine_config(1) + f'[models."{MODEL}"]\nengine = "mistralrs"\n'


def run(ctx: Context) -> dict[str, Any]:
    from actors.engines.mistralrs import host_available

    if not host_available():
        raise RuntimeError("the mistral.rs lane needs the mistralrs wheel: pip install 'blazar[mistralrs]'")
    max_tokens = ctx.pick(48, 8)
    count = ctx.pick(4, 1)
    runs: list[dict[str, Any]] = []
    with running_daemon(_config(), tag="mistralrs") as daemon:
        load_model(daemon.url)
        info = engine_of(daemon.url)
        with DirectEngine(info.argv, log_dir=ctx.work_dir) as direct, LoadGen() as lg:
            targets = {
                "gateway": (daemon.url, {}),
                "direct": (direct.url, {"Authorization": f"Bearer {direct.api_key}"}),
            }
            for url, headers in targets.values():
                lg.run(
                    job(url, [chat_request("openai", max_tokens=4, headers=headers)], concurrency=1, count=2)
                )
            for r in range(ctx.runs):
                log(f"mistralrs: run {r + 1}/{ctx.runs}")
                one: dict[str, Any] = {}
                for variant, (url, headers) in targets.items():
                    req = chat_request("openai", max_tokens=max_tokens, ignore_eos=True, headers=headers)
                    cpu0 = cpu_seconds([daemon.proc.pid])
                    metrics = token_metrics(lg.run(job(url, [req], concurrency=1, count=count, events=True)))
                    tokens = metrics["tokens_per_request"] * metrics["requests"]
                    cpu_s = cpu_seconds([daemon.proc.pid]) - cpu0
                    metrics["daemon_cpu_us_per_token"] = cpu_s * 1e6 / tokens if tokens else None
                    one[variant] = metrics
                runs.append(one)
            commands = daemon_commands(_config()) | {
                "engine (the daemon's)": redact(info.argv),
                "engine (direct)": redact(direct.argv),
                "load generator": " ".join(LoadGen.command),
            }

    def get(variant: str, key: str) -> dict[str, Any]:
        return summarize(r[variant][key] for r in runs)

    figures = [
        ("decode tok/s", "decode_tps"),
        ("TTFT p50 (ms)", "ttft_p50_ms"),
        ("inter-token p50 (ms)", "itl_p50_ms"),
        ("inter-token p99 (ms)", "itl_p99_ms"),
        ("tokens per request", "tokens_per_request"),
        ("daemon CPU per token (µs)", "daemon_cpu_us_per_token"),
    ]
    errors = {v: r[v]["errors"] for r in runs for v in ("gateway", "direct") if r[v]["errors"]}
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "model": f"{MODEL} pinned to mistral.rs",
            "max_tokens": max_tokens,
            "requests_per_run": count,
        },
        "values": {
            "mistralrs_decode_ratio_c1": summarize(
                ratio(r["gateway"]["decode_tps"], r["direct"]["decode_tps"]) for r in runs
            ),
            "mistralrs_ttft_added_p50_ms": summarize(
                r["gateway"]["ttft_p50_ms"] - r["direct"]["ttft_p50_ms"] for r in runs
            ),
        },
        "tables": [
            {
                "title": f"One stream at a time (median [min, max] over {len(runs)} runs)",
                "columns": ["figure", "gateway", "direct"],
                "rows": [[label, get("gateway", key), get("direct", key)] for label, key in figures],
            }
        ],
        "plots": [],
        "notes": [f"requests that failed: {errors}"] if errors else [],
        "commands": commands,
        "raw_runs": runs,
    }
