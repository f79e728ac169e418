"""Forty MCP tools in front of a small model: the full catalog against the compact one.

The daemon runs the test model (one slot, 8,192 tokens) and the real forty-tool test server
(tests/mcp_servers/many_server.py over stdio). Each turn is the same OpenAI chat request with
the server's tools, once with ``x-blazar-mcp-catalog: full`` (every schema, as the gateway's
tool emulation writes them into the system prompt, and a constraint over forty alternatives)
and once with ``compact`` (the three meta-tools), side by side: full, compact, full, compact.
A turn asks for one token (``max_tokens: 1``), so its time is the time to first token: the
prompt's prefill, the constraint, one decoded token, and the gateway around them; its usage's
``prompt_tokens`` is what the engine was sent for that turn.

Two kinds of turn: **cold**, whose system message differs each time, so the engine's prompt
cache cannot hold the tools (a conversation's first turn, or one after its slot was reused);
and **warm**, the same request again, whose prefix the cache holds (a later turn).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from statistics import median
from typing import Any

import httpx

from bench._harness import Context
from bench._rigs import daemon_commands, log, running_daemon
from bench._stats import summarize
from tests.support import MODEL

__all__ = ["TITLE", "run"]

TITLE = "MCP compact catalog: prompt tokens and first token with 40 tools"
SERVER = Path(__file__).resolve().parent.parent / "tests" / "mcp_servers" / "many_server.py"
CONFIG = (
    "slots = 1\ndefault_ctx = 8192\nkeep_alive_s = -1\n"
    f'[[mcp]]\nname = "many"\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(SERVER))}]\n'
)
ASK = "Repeat the word banana with the echo tool."
MODES = ("full", "compact")


def _turn(client: httpx.Client, catalog: str, system: str) -> tuple[float, int]:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": ASK}],
        "max_tokens": 1,
        "temperature": 0,
    }
    headers = {"x-blazar-mcp": "many", "x-blazar-mcp-catalog": catalog}
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body, headers=headers)
    ms = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    if r.headers.get("x-blazar-mcp") != "rounds=0, calls=0":
        raise RuntimeError(f"a one-token turn ran tools: {r.headers.get('x-blazar-mcp')}")
    return ms, int(r.json()["usage"]["prompt_tokens"])


def _one_run(client: httpx.Client, count: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {f"{m}_{k}": [] for m in MODES for k in ("cold", "warm")}
    tokens: dict[str, list[int]] = {m: [] for m in MODES}
    for _ in range(count):
        for mode in MODES:
            system = f"You are a helpful assistant. Session {uuid.uuid4().hex}."
            ms, prompt = _turn(client, mode, system)  # cold: a prefix the cache has never seen
            times[f"{mode}_cold"].append(ms)
            ms, _ = _turn(client, mode, system)  # warm: the same prefix, cached
            times[f"{mode}_warm"].append(ms)
            tokens[mode].append(prompt)  # the session id's hex takes a token or two more or less
    out: dict[str, Any] = {f"{k}_ms": median(v) for k, v in times.items()}
    for mode in MODES:
        out[f"{mode}_prompt_tokens"] = median(tokens[mode])
    out["prompt_ratio"] = out["compact_prompt_tokens"] / out["full_prompt_tokens"]
    out["cold_ttft_ratio"] = out["compact_cold_ms"] / out["full_cold_ms"]
    out["warm_ttft_ratio"] = out["compact_warm_ms"] / out["full_warm_ms"]
    return out


def run(ctx: Context) -> dict[str, Any]:
    count = ctx.pick(2, 1)
    runs: list[dict[str, Any]] = []
    with (
        running_daemon(CONFIG, tag="mcp-catalog") as daemon,
        httpx.Client(base_url=daemon.url, timeout=600) as client,
    ):
        _one_run(client, 1)  # engine loaded, server started, tools listed
        for r in range(ctx.runs):
            log(f"mcp_catalog: run {r + 1}/{ctx.runs}")
            runs.append(_one_run(client, count))

    def get(key: str) -> dict[str, Any]:
        return summarize(r[key] for r in runs)

    rows = [
        [
            "prompt tokens per turn",
            get("full_prompt_tokens"),
            get("compact_prompt_tokens"),
            get("prompt_ratio"),
        ],
        ["first token, cold turn (ms)", get("full_cold_ms"), get("compact_cold_ms"), get("cold_ttft_ratio")],
        ["first token, warm turn (ms)", get("full_warm_ms"), get("compact_warm_ms"), get("warm_ttft_ratio")],
    ]
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "tools": 40,
            "turns_per_run": count,
            "route": "/v1/chat/completions (whole, max_tokens 1)",
            "slots": 1,
            "ctx": 8192,
        },
        "values": {
            "mcp_compact_prompt_ratio": get("prompt_ratio"),
            "mcp_compact_cold_ttft_ratio": get("cold_ttft_ratio"),
        },
        "tables": [
            {
                "title": f"Median [min, max] over {len(runs)} runs of {count} turns of each kind",
                "columns": ["what", "full catalog", "compact catalog", "compact ÷ full"],
                "rows": rows,
            }
        ],
        "commands": daemon_commands(CONFIG),
    }
