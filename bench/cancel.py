"""Cancellation: from a client's disconnect to the engine's slot being idle again.

Each trial opens a stream (OpenAI route, ``ignore_eos``, a long output), reads
its first three body pieces, then drops the socket. From that instant the
harness polls the engine's own ``GET /slots`` (straight to the engine, with its
API key read from the engine's argv) back to back until no slot
``is_processing``, and takes the arrival of that answer as the end: an upper
bound. Trials alternate: through the gateway (it must notice the disconnect and
close its upstream connection) and straight to a direct engine started with the
same argv (llama.cpp noticing by itself: the floor). llama.cpp answers /slots
between decode steps, so both figures are quantised by one decode step.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from bench import _plots
from bench._harness import Context
from bench._http import Connection, build_request, split_url
from bench._rigs import MODEL, daemon_commands, engine_config, engine_pair, log, redact
from bench._stats import percentile

__all__ = ["TITLE", "SlotPoller", "run"]

TITLE = "Cancellation: disconnect to slot idle"
TRIAL_TIMEOUT_S = 30.0


class SlotPoller:
    """Back-to-back polls of one engine's /slots on a keep-alive connection."""

    def __init__(self, url: str, api_key: str) -> None:
        host, port = split_url(url)
        self.conn = Connection(host, port)
        self.raw = build_request(
            "GET", "/slots", host=f"{host}:{port}", headers={"Authorization": f"Bearer {api_key}"}
        )
        self.polls = 0

    async def busy(self) -> tuple[int, float]:
        """Slots processing now, and when the answer arrived."""
        reply = await self.conn.request(self.raw, keep=True)
        self.polls += 1
        if reply.status != 200:
            raise RuntimeError(f"/slots answered {reply.status}: {reply.body[:200]!r}")
        return sum(1 for s in json.loads(reply.body) if s.get("is_processing")), reply.t_end

    async def wait_idle(self, timeout_s: float) -> float | None:
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            busy, t = await self.busy()
            if not busy:
                return t
        return None


async def _trial(
    target_url: str, headers: dict[str, str], slots: SlotPoller, max_tokens: int
) -> dict[str, Any]:
    if await slots.wait_idle(TRIAL_TIMEOUT_S) is None:
        raise RuntimeError("the engine's slots never went idle before a trial")
    host, port = split_url(target_url)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    raw = build_request(
        "POST", "/v1/chat/completions", host=f"{host}:{port}", body=json.dumps(body).encode(), headers=headers
    )
    conn = Connection(host, port)
    reply = await conn.request(raw, stop_after=3)  # aborts the socket after the third piece
    t_disconnect = reply.t_end
    polls_before = slots.polls
    busy_first, _ = await slots.busy()
    t_idle = None if busy_first else time.perf_counter()
    if t_idle is None:
        t_idle = await slots.wait_idle(TRIAL_TIMEOUT_S)
    return {
        "status": reply.status,
        "ms": None if t_idle is None else (t_idle - t_disconnect) * 1000,
        "busy_at_first_poll": bool(busy_first),
        "polls": slots.polls - polls_before,
    }


async def _trials(
    ctx: Context, pairs: dict[str, tuple[str, dict[str, str], SlotPoller]], n: int
) -> dict[str, Any]:
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in pairs}
    max_tokens = 400
    for i in range(n):
        if i % 20 == 0:
            log(f"cancel: trial {i + 1}/{n}")
        for name, (url, headers, slots) in pairs.items():
            out[name].append(await _trial(url, headers, slots, max_tokens))
    for _, _, slots in pairs.values():
        await slots.conn.aclose()
    return out


def run(ctx: Context) -> dict[str, Any]:
    trials = ctx.pick(100, 3)
    with engine_pair(slots=ctx.slots, work_dir=ctx.work_dir, tag="cancel") as (daemon, info, direct):
        pairs = {
            "gateway": (daemon.url, {}, SlotPoller(info.url, info.api_key)),
            "direct": (
                direct.url,
                {"Authorization": f"Bearer {direct.api_key}"},
                SlotPoller(direct.url, direct.api_key),
            ),
        }
        results = asyncio.run(_trials(ctx, pairs, trials))
        commands = daemon_commands(engine_config(ctx.slots)) | {
            "engine (the daemon's)": redact(info.argv),
            "engine (direct)": redact(direct.argv),
        }
    rows = []
    values: dict[str, Any] = {}
    series: dict[str, list[float]] = {}
    notes = []
    for name, trials_of in results.items():
        ms = [t["ms"] for t in trials_of if t["ms"] is not None]
        leaked = sum(1 for t in trials_of if t["ms"] is None)
        bad = sum(1 for t in trials_of if t["status"] != 200)
        series[name] = ms
        rows.append(
            [
                name,
                len(trials_of),
                percentile(ms, 50),
                percentile(ms, 99),
                max(ms) if ms else None,
                sum(1 for t in trials_of if not t["busy_at_first_poll"]),
                leaked,
            ]
        )
        if leaked:
            notes.append(f"{name}: {leaked} trials whose slot was still busy after {TRIAL_TIMEOUT_S:.0f} s")
        if bad:
            notes.append(f"{name}: {bad} trials answered a status other than 200")
    gateway_ms = series.get("gateway", [])
    p99 = percentile(gateway_ms, 99)
    values["cancel_p99_ms"] = {"median": p99, "min": p99, "max": p99, "n": 1 if p99 is not None else 0}
    plots = []
    if _plots.cdf(ctx.plot_path("cdf"), title="Client disconnect → slot idle", xlabel="ms", series=series):
        plots.append({"file": ctx.plot_path("cdf").name, "title": "Disconnect → slot idle, distribution"})
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "trials": trials,
            "slots": ctx.slots,
            "max_tokens": 400,
            "read_before_disconnect": "3 body pieces",
        },
        "values": values,
        "tables": [
            {
                "title": f"Disconnect → slot idle (ms), {trials} trials each, alternating",
                "columns": ["path", "trials", "p50", "p99", "max", "idle at first poll", "never idle"],
                "rows": rows,
            }
        ],
        "plots": plots,
        "notes": notes,
        "commands": commands,
        "trials": results,
    }
