"""The benchmark targets: each a figure from one benchmark, checked on its median over runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TARGETS", "Target", "evaluate"]


@dataclass(frozen=True)
class Target:
    id: str
    bench: str
    label: str
    op: str
    """``>=`` or ``<=``."""
    limit: float
    unit: str = ""

    def met(self, value: float) -> bool:
        return value >= self.limit if self.op == ">=" else value <= self.limit

    def describe(self) -> str:
        return f"{'≥' if self.op == '>=' else '≤'} {self.limit:g}{self.unit and ' ' + self.unit}"


TARGETS = [
    Target("decode_ratio_c1", "engine", "decode tok/s, gateway ÷ direct, C=1", ">=", 0.98),
    Target("aggregate_ratio_c8", "engine", "aggregate tok/s, gateway ÷ direct, C=8", ">=", 0.97),
    Target("ttft_added_p50_ms", "engine", "TTFT p50 added by the gateway, C=1", "<=", 5.0, "ms"),
    Target("itl_added_p99_ms", "engine", "inter-token p99 added by the gateway, C=1", "<=", 2.0, "ms"),
    Target("overhead_p50_ms", "overhead", "added latency p50, C=1, non-stream", "<=", 1.0, "ms"),
    Target("overhead_p99_ms", "overhead", "added latency p99, C=1, non-stream", "<=", 3.0, "ms"),
    Target("cpu_per_request_ms", "overhead", "gateway CPU per non-stream request, C=16", "<=", 1.0, "ms"),
    Target("cpu_per_chunk_ms", "overhead", "gateway CPU per relayed stream chunk, C=16", "<=", 0.025, "ms"),
    Target("litellm_rps_ratio_c16", "overhead", "req/s Blazar ÷ LiteLLM, C=16, non-stream", ">=", 3.0),
    Target(
        "controls_overhead_p50_ms",
        "overhead",
        "added latency p50 with key, metrics, audit log, console, C=1",
        "<=",
        1.0,
        "ms",
    ),
    Target(
        "controls_cpu_per_request_ms",
        "overhead",
        "gateway CPU per request with the controls on, C=16",
        "<=",
        1.0,
        "ms",
    ),
    Target(
        "controls_cpu_per_chunk_ms",
        "overhead",
        "gateway CPU per chunk with the controls on, C=16",
        "<=",
        0.1,
        "ms",
    ),
    Target("mcp_round_ms", "mcp", "gateway time per MCP round (instant engine and tool)", "<=", 2.0, "ms"),
    Target(
        "mcp_compact_prompt_ratio",
        "mcp_catalog",
        "prompt tokens per turn with 40 MCP tools, compact ÷ full catalog",
        "<=",
        0.2,
    ),
    Target("cancel_p99_ms", "cancel", "client disconnect → slot idle p99 (gateway)", "<=", 100.0, "ms"),
    Target(
        "prefill_cancel_p99_ms_3000",
        "prefill",
        "disconnect mid-prompt → slot idle p99, 3,000 tokens",
        "<=",
        1000.0,
        "ms",
    ),
    Target(
        "prefill_cancel_p99_ms_6000",
        "prefill",
        "disconnect mid-prompt → slot idle p99, 6,000 tokens",
        "<=",
        1000.0,
        "ms",
    ),
    Target(
        "scale_itl_added_p99_ms_c256", "scale", "inter-token p99 added, 256 paced streams", "<=", 5.0, "ms"
    ),
    Target("scale_chunk_ratio_c256", "scale", "chunks/s relayed ÷ direct, 256 paced streams", ">=", 0.98),
    Target("scale_cores_c256", "scale", "gateway CPU, 256 streams at 100 tokens/s", "<=", 1.0, "cores"),
    Target(
        "scale_cpu_per_chunk_ms_c256",
        "scale",
        "gateway CPU per relayed chunk, 256 paced streams",
        "<=",
        0.02,
        "ms",
    ),
    Target(
        "workers2_cpu_ratio_c256",
        "workers",
        "workers = 2 ÷ workers = 1: CPU per chunk (runtime + workers), 256 streams",
        "<=",
        1.1,
    ),
    Target(
        "workers2_p50_added_ms_c256",
        "workers",
        "inter-token p50, workers = 2 minus workers = 1, 256 streams",
        "<=",
        1.0,
        "ms",
    ),
    Target(
        "workers2_runtime_cpu_ratio_c256",
        "workers",
        "workers = 2: the runtime's CPU per chunk ÷ the one process's",
        "<=",
        0.5,
    ),
    Target(
        "anthropic_chunk_ratio", "dialects", "Anthropic stream CPU per chunk ÷ OpenAI pass-through", "<=", 2.0
    ),
    Target("ollama_chunk_ratio", "dialects", "Ollama stream CPU per chunk ÷ OpenAI pass-through", "<=", 2.0),
    Target(
        "prefill_speed_ratio", "prefill", "prefill tok/s, CPU prompt batch ÷ llama.cpp's default", ">=", 0.95
    ),
    Target(
        "batch_overhead_ratio", "batch", "batch time ÷ interactive time, same prompts, C=slots-1", "<=", 1.10
    ),
    Target("cold_run_ratio", "startup", "cold `blazar run` → first token ÷ direct engine", "<=", 1.5),
    Target("idle_wake_ratio", "startup", "idle wake → first token ÷ direct engine", "<=", 1.3),
    Target(
        "cli_slowest_s", "startup", "slowest of `blazar --help`, `list`, `ps` (no daemon)", "<=", 0.25, "s"
    ),
    Target(
        "mistralrs_decode_ratio_c1",
        "mistralrs",
        "mistral.rs lane: decode tok/s, gateway ÷ direct, C=1",
        ">=",
        0.98,
    ),
    Target(
        "mistralrs_ttft_added_p50_ms",
        "mistralrs",
        "mistral.rs lane: TTFT p50 added by the gateway",
        "<=",
        5.0,
        "ms",
    ),
    Target("console_load_rps", "console", "requests/s served while the console is open", ">=", 200.0),
    Target(
        "console_click_p99_ms",
        "console",
        "console: click → next frame p99, under that load",
        "<=",
        100.0,
        "ms",
    ),
    Target(
        "console_lag_p99_ms", "console", "console: main-thread lag p99, under that load", "<=", 50.0, "ms"
    ),
    Target("stt_rtf_ratio", "speech", "STT real-time factor, gateway ÷ whisper host alone", "<=", 1.05),
    Target("tts_rtf_ratio", "speech", "TTS real-time factor, gateway ÷ piper host alone", "<=", 1.05),
    Target(
        "federation_decode_ratio_c1",
        "federation",
        "federated path: decode tok/s, relayed A → C ÷ C directly, C=1",
        ">=",
        0.98,
    ),
    Target(
        "federation_ttft_added_p50_ms",
        "federation",
        "federated path: TTFT p50 added by the relay through A",
        "<=",
        5.0,
        "ms",
    ),
    Target(
        "policy_off_through_ns",
        "policy_off",
        "policy hooks off: time the check adds to a request",
        "<=",
        1000.0,
        "ns",
    ),
    Target(
        # Loopback on a 2-core machine: the engine and both workers share the cores, so the
        # split pays its round trips and its processes without gaining any compute.
        "rpc_split_decode_ratio_c1",
        "rpc_split",
        "RPC split: decode tok/s, over two loopback workers ÷ one machine, C=1",
        ">=",
        0.5,
    ),
    Target("rss_growth_pct", "memory", "daemon RSS growth over the long run", "<=", 5.0, "%"),
    Target(
        "idle_flood_success_pct",
        "idleflood",
        "a new client's requests served while 2,000 idle connections hold the caps",
        ">=",
        99.0,
        "%",
    ),
]


def evaluate(bench: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Each of ``bench``'s targets with its measured median (min/max) and whether it is met."""
    out = []
    for target in TARGETS:
        if target.bench != bench:
            continue
        summary = values.get(target.id) or {}
        median = summary.get("median")
        out.append(
            {
                "id": target.id,
                "label": target.label,
                "target": target.describe(),
                "op": target.op,
                "limit": target.limit,
                "unit": target.unit,
                "median": median,
                "min": summary.get("min"),
                "max": summary.get("max"),
                "n": summary.get("n", 0),
                "met": None if median is None else target.met(median),
            }
        )
    return out
