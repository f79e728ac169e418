"""Gateway vs direct engine: decode speed, TTFT and inter-token latency, one llama.cpp build.

The daemon starts its engine for the test model; the harness reads that child's
argv from /proc and starts a second engine with exactly the same flags (model,
context, slots, threads) on another port. Each run sends the same workload
through the gateway (A) and straight to the direct engine (B), one after the
other: A B A B … Output is fixed: temperature 0, a fixed ``max_tokens`` and
llama.cpp's ``ignore_eos`` (relayed untouched by the gateway's OpenAI route), so
every request decodes the same number of tokens. The dialect section sends the
same prompt through the OpenAI, Ollama and Anthropic routes; those cannot pass
``ignore_eos``, so there all variants (the direct one too) stop where the model
stops, and speeds are per token actually decoded.
"""

from __future__ import annotations

from typing import Any

from bench import _plots
from bench._harness import Context
from bench._rigs import LoadGen, daemon_commands, engine_config, engine_pair, log, redact
from bench._stats import ratio, summarize
from bench._system import cpu_seconds, rss_bytes
from bench._workloads import DIALECTS, chat_request, job, token_metrics

__all__ = ["TITLE", "run"]

TITLE = "Gateway vs direct engine"
LADDER = (1, 2, 4, 8)


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def run(ctx: Context) -> dict[str, Any]:
    max_tokens = ctx.pick(128, 8)
    per_worker = ctx.pick(3, 1)  # requests per concurrent stream in each ladder step
    single_count = ctx.pick(6, 1)
    dialect_max_tokens = ctx.pick(96, 8)
    dialect_counts = {1: ctx.pick(3, 1), 4: ctx.pick(8, 4)}
    runs: list[dict[str, Any]] = []
    with engine_pair(slots=ctx.slots, work_dir=ctx.work_dir, tag="engine") as (daemon, info, direct):
        daemon_rss_idle = rss_bytes(daemon.proc.pid)
        targets = {
            "gateway": (daemon.url, {}),
            "direct": (direct.url, {"Authorization": f"Bearer {direct.api_key}"}),
        }
        with LoadGen() as lg:
            for url, headers in targets.values():
                warm = chat_request("openai", max_tokens=4, headers=headers)
                lg.run(job(url, [warm], concurrency=ctx.slots, count=ctx.slots * 2))
            for r in range(ctx.runs):
                log(f"engine: run {r + 1}/{ctx.runs}")
                one: dict[str, Any] = {"ladder": {}, "dialects": {}}
                for c in LADDER:
                    count = single_count if c == 1 else c * per_worker
                    for variant, (url, headers) in targets.items():
                        req = chat_request("openai", max_tokens=max_tokens, ignore_eos=True, headers=headers)
                        cpu0 = cpu_seconds([daemon.proc.pid])
                        res = lg.run(job(url, [req], concurrency=c, count=count, events=True))
                        metrics = token_metrics(res)
                        tokens = metrics["tokens_per_request"] * metrics["requests"]
                        cpu_s = cpu_seconds([daemon.proc.pid]) - cpu0
                        # The daemon's CPU per token it relayed (≈ 0 in the direct runs: a check).
                        metrics["daemon_cpu_us_per_token"] = cpu_s * 1e6 / tokens if tokens else None
                        one["ladder"].setdefault(str(c), {})[variant] = metrics
                for c, count in dialect_counts.items():
                    direct_req = chat_request(
                        "openai", max_tokens=dialect_max_tokens, headers=targets["direct"][1]
                    )
                    res = lg.run(job(direct.url, [direct_req], concurrency=c, count=count, events=True))
                    one["dialects"].setdefault(str(c), {})["direct"] = token_metrics(res)
                    for dialect in DIALECTS:
                        req = chat_request(dialect, max_tokens=dialect_max_tokens)
                        res = lg.run(job(daemon.url, [req], concurrency=c, count=count, events=True))
                        one["dialects"][str(c)][dialect] = token_metrics(res)
                runs.append(one)
        daemon_rss_loaded = rss_bytes(daemon.proc.pid)
        engine_rss = rss_bytes(info.pid)
        commands = daemon_commands(engine_config(ctx.slots)) | {
            "engine (the daemon's)": redact(info.argv),
            "engine (direct)": redact(direct.argv),
            "load generator": " ".join(LoadGen.command),
        }
    return _summarize(ctx, runs, max_tokens, dialect_max_tokens, commands) | {
        "memory": {
            "daemon_rss_idle_mb": round(daemon_rss_idle / 2**20, 1),
            "daemon_rss_after_mb": round(daemon_rss_loaded / 2**20, 1),
            "engine_rss_mb": round(engine_rss / 2**20, 1),
        },
        "params": {
            "model": "smollm2-135m (SmolLM2-135M-Instruct GGUF, tests/support.ensure_model)",
            "slots": ctx.slots,
            "ctx_per_slot": 1024,
            "max_tokens": max_tokens,
            "dialect_max_tokens": dialect_max_tokens,
            "ladder": list(LADDER),
            "requests_per_stream": per_worker,
            "single_stream_requests": single_count,
            "dialect_requests": dialect_counts,
        },
    }


def _summarize(
    ctx: Context,
    runs: list[dict[str, Any]],
    max_tokens: int,
    dialect_max_tokens: int,
    commands: dict[str, Any],
) -> dict[str, Any]:
    def per_run(fn: Any) -> dict[str, Any]:
        return summarize(fn(r) for r in runs)

    def lad(c: int, variant: str, key: str) -> dict[str, Any]:
        return per_run(lambda r: r["ladder"][str(c)][variant][key])

    def lad_ratio(c: int, key: str) -> dict[str, Any]:
        return per_run(
            lambda r: ratio(r["ladder"][str(c)]["gateway"][key], r["ladder"][str(c)]["direct"][key])
        )

    def lad_added(c: int, key: str) -> dict[str, Any]:
        return per_run(
            lambda r: _diff(r["ladder"][str(c)]["gateway"][key], r["ladder"][str(c)]["direct"][key])
        )

    values = {
        "decode_ratio_c1": lad_ratio(1, "decode_tps"),
        "aggregate_ratio_c8": lad_ratio(LADDER[-1], "aggregate_tps"),
        "ttft_added_p50_ms": lad_added(1, "ttft_p50_ms"),
        "itl_added_p99_ms": lad_added(1, "itl_p99_ms"),
    }
    single_rows = []
    for key, label in (
        ("decode_tps", "decode tok/s"),
        ("ttft_p50_ms", "TTFT p50 (ms)"),
        ("ttft_p99_ms", "TTFT p99 (ms)"),
        ("itl_p50_ms", "inter-token p50 (ms)"),
        ("itl_p99_ms", "inter-token p99 (ms)"),
    ):
        change = lad_ratio(1, key) if key == "decode_tps" else lad_added(1, key)
        single_rows.append([label, lad(1, "direct", key), lad(1, "gateway", key), change])
    ladder_rows = [
        [
            c,
            lad(c, "direct", "aggregate_tps"),
            lad(c, "gateway", "aggregate_tps"),
            lad_ratio(c, "aggregate_tps"),
            lad(c, "direct", "ttft_p99_ms"),
            lad(c, "gateway", "ttft_p99_ms"),
            lad_added(c, "ttft_p99_ms"),
            lad(c, "gateway", "daemon_cpu_us_per_token"),
        ]
        for c in LADDER
    ]
    dialect_rows = []
    for c in sorted({int(k) for r in runs for k in r["dialects"]}):
        k = str(c)
        for dialect in DIALECTS:

            def d(r: dict[str, Any], who: str, key: str, k: str = k) -> Any:
                return r["dialects"][k][who][key]

            dialect_rows.append(
                [
                    dialect,
                    c,
                    per_run(lambda r, dl=dialect: d(r, dl, "tokens_per_request")),
                    per_run(
                        lambda r, dl=dialect: ratio(d(r, dl, "decode_tps"), d(r, "direct", "decode_tps"))
                    ),
                    per_run(
                        lambda r, dl=dialect: ratio(
                            d(r, dl, "aggregate_tps"), d(r, "direct", "aggregate_tps")
                        )
                    ),
                    per_run(lambda r: d(r, "direct", "ttft_p50_ms")),
                    per_run(
                        lambda r, dl=dialect: _diff(d(r, dl, "ttft_p50_ms"), d(r, "direct", "ttft_p50_ms"))
                    ),
                    per_run(
                        lambda r, dl=dialect: _diff(d(r, dl, "itl_p99_ms"), d(r, "direct", "itl_p99_ms"))
                    ),
                ]
            )
    tables = [
        {
            "title": f"Single stream (C=1, {max_tokens} tokens, median [min, max] over {len(runs)} runs)",
            "columns": ["metric", "direct", "gateway", "gateway ÷ direct or added"],
            "rows": single_rows,
        },
        {
            "title": "Concurrency ladder (aggregate decode tok/s and TTFT p99 in ms)",
            "columns": [
                "C",
                "direct tok/s",
                "gateway tok/s",
                "ratio",
                "direct TTFT p99",
                "gateway TTFT p99",
                "added",
                "daemon CPU µs/token",
            ],
            "rows": ladder_rows,
        },
        {
            "title": f"Through each dialect ({dialect_max_tokens}-token cap, no ignore_eos; "
            "ratios to the direct engine)",
            "columns": [
                "dialect",
                "C",
                "tokens/request",
                "decode tok/s ratio",
                "aggregate tok/s ratio",
                "direct TTFT p50 (ms)",
                "TTFT p50 added (ms)",
                "inter-token p99 added (ms)",
            ],
            "rows": dialect_rows,
        },
    ]
    plots = []
    xs = list(LADDER)
    if _plots.lines(
        ctx.plot_path("ladder-tps"),
        title="Aggregate decode speed",
        xlabel="concurrent streams",
        ylabel="tokens/s",
        xs=xs,
        series={v: [lad(c, v, "aggregate_tps") for c in xs] for v in ("direct", "gateway")},
    ):
        plots.append(
            {"file": ctx.plot_path("ladder-tps").name, "title": "Aggregate decode tok/s vs concurrency"}
        )
    if _plots.lines(
        ctx.plot_path("ladder-ttft"),
        title="Time to first token, p99",
        xlabel="concurrent streams",
        ylabel="ms",
        xs=xs,
        series={v: [lad(c, v, "ttft_p99_ms") for c in xs] for v in ("direct", "gateway")},
    ):
        plots.append({"file": ctx.plot_path("ladder-ttft").name, "title": "TTFT p99 vs concurrency"})
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "values": values,
        "tables": tables,
        "plots": plots,
        "commands": commands,
        "raw_runs": runs,
    }
