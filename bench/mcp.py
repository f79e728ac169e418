"""The gateway's own time per MCP tool round, with an instant engine and an instant tool.

The daemon's engine is the instant upstream, whose ``--reply`` is an emulated call to an
MCP tool, so while tools are offered every round calls it: a request with the server runs
exactly ``max_rounds`` tool rounds and a last round that answers in words. The tool is the
test server's ``echo`` over stdio (the real ``mcp`` SDK on both sides). Each run sends the
same whole-answer OpenAI chat request with the server (A) and without it (B), one after the
other, A B A B …; then reads each A request's story (``/api/why``) for the time its tool calls
took as the gateway measured them (from asking the server's actor to its answer). Per round:

    median over A requests of (its time - its own tool calls' time), less median B, / rounds

what is left is the gateway's work for a round: listing the tools (cached), holding back and
collecting the call, running it, feeding the result back, a new engine round trip (claim,
template, the instant engine's own answer, parsing) — everything but the tool itself.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

import httpx

from bench._harness import Context
from bench._rigs import daemon_commands, instant_config, log, running_daemon
from bench._stats import summarize
from tests.support import MODEL

__all__ = ["TITLE", "run"]

TITLE = "MCP tool loop: the gateway's time per round"
ROUNDS = 4
SERVER = Path(__file__).resolve().parent.parent / "tests" / "mcp_servers" / "tools_server.py"
CALL = {"tool": "mcp__bench__echo", "arguments": {"text": "hi"}}


def _config() -> str:
    return instant_config("--reply", json.dumps(CALL).replace('"', '\\"'), slots=4) + (
        f'\n[[mcp]]\nname = "bench"\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(SERVER))}]\n'
        f"max_rounds = {ROUNDS}\n"
    )


def _timed(client: httpx.Client, body: dict[str, Any]) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    took = time.perf_counter() - t0
    r.raise_for_status()
    return took * 1000, r


def _one_run(client: httpx.Client, count: int) -> dict[str, Any]:
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi with echo."}]}
    with_mcp, without, traces = [], [], []
    for _ in range(count):
        ms, r = _timed(client, {**ask, "mcp": "bench"})
        if r.headers.get("x-blazar-mcp") != f"rounds={ROUNDS}, calls={ROUNDS}":
            raise RuntimeError(f"the loop did not run {ROUNDS} rounds: {r.headers.get('x-blazar-mcp')}")
        with_mcp.append(ms)
        traces.append(r.headers["x-blazar-trace-id"])
        ms, r = _timed(client, {**ask, "mcp": "none"})
        without.append(ms)
    time.sleep(0.5)  # the last records reach the ledger
    tools = [[t["ms"] for t in client.get(f"/api/why/{trace}").json()["tools"]] for trace in traces]
    if any(len(calls) != ROUNDS for calls in tools):
        raise RuntimeError("a request's story does not have its tool calls")
    # Each request less its own tool calls: the tools' time varies (the server, the pipes), and
    # a median of sums is not a sum of medians.
    a, b = median(with_mcp), median(without)
    net = median(ms - sum(calls) for ms, calls in zip(with_mcp, tools, strict=True))
    return {
        "with_mcp_ms": a,
        "without_ms": b,
        "tool_call_ms": median(ms for calls in tools for ms in calls),
        "per_round_total_ms": (a - b) / ROUNDS,
        "per_round_gateway_ms": (net - b) / ROUNDS,
    }


def run(ctx: Context) -> dict[str, Any]:
    count = ctx.pick(200, 5)
    config = _config()
    runs: list[dict[str, Any]] = []
    with running_daemon(config, tag="mcp") as daemon, httpx.Client(base_url=daemon.url, timeout=60) as client:
        _one_run(client, 3)  # engine started, MCP server started, tools listed
        for r in range(ctx.runs):
            log(f"mcp: run {r + 1}/{ctx.runs}")
            runs.append(_one_run(client, count))

    def get(key: str) -> dict[str, Any]:
        return summarize(r[key] for r in runs)

    rows = [
        [f"request with the server ({ROUNDS} tool rounds + the answer)", get("with_mcp_ms")],
        ["the same request without it (the answer alone)", get("without_ms")],
        ["one tool call, as the gateway timed it (the MCP SDK, stdio, the server)", get("tool_call_ms")],
        ["per round, all of it: (A - B) / rounds", get("per_round_total_ms")],
        ["per round, the gateway's own: each request less its tool calls", get("per_round_gateway_ms")],
    ]
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {"rounds": ROUNDS, "requests_per_run": count, "route": "/v1/chat/completions (whole)"},
        "values": {"mcp_round_ms": get("per_round_gateway_ms")},
        "tables": [
            {
                "title": f"Milliseconds, median [min, max] over {len(runs)} runs of {count} requests each",
                "columns": ["what", "ms"],
                "rows": rows,
            }
        ],
        "commands": daemon_commands(config),
    }
