"""The idle ladder: the first token from a warm model, from a sleeping one, and from a cold start.

One daemon with the test model and ``idle_sleep_s = 1`` (``keep_alive_s = -1``). Each run
times, from the send to the first streamed token of the same short request:

- **warm**: right after another request, the engine awake;
- **asleep**: after 3 s idle, once ``/api/ps`` says the engine sleeps (llama.cpp released
  the model's memory; its process waits on its port);
- **cold**: after ``POST /api/generate {"keep_alive": 0}`` unloaded it, the engine started
  again by the request.

The engine's resident memory awake and asleep is read from ``/proc`` as well.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from bench._harness import Context
from bench._rigs import MODEL, log, running_daemon
from bench._stats import ratio, summarize

__all__ = ["TITLE", "run"]

TITLE = "Idle ladder: first token warm, asleep and cold"
CONFIG = f'keep_alive_s = -1\nslots = 1\n[models."{MODEL}"]\nidle_sleep_s = 1\n'
BODY = {
    "model": MODEL,
    "prompt": "Say hello.",
    "stream": True,
    "options": {"num_predict": 4, "temperature": 0},
}


def _first_token(url: str) -> float:
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/api/generate", json=BODY, timeout=300) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line and json.loads(line).get("response"):
                return time.perf_counter() - t0
    return time.perf_counter() - t0


def _sleeping(url: str) -> bool:
    models = httpx.get(f"{url}/api/ps", timeout=30).json()["models"]
    return bool(models) and models[0].get("blazar_sleeping") is True


def _rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


def _one(url: str, engines: Any) -> dict[str, float]:
    _first_token(url)
    warm = _first_token(url)
    pid = engines()[0]["pid"]
    awake_mib = _rss_mib(pid)
    time.sleep(3)
    deadline = time.monotonic() + 30
    while not _sleeping(url) and time.monotonic() < deadline:
        time.sleep(0.1)
    asleep_mib = _rss_mib(pid)
    asleep = _first_token(url)
    httpx.post(f"{url}/api/generate", json={"model": MODEL, "keep_alive": 0}, timeout=60).raise_for_status()
    cold = _first_token(url)
    return {
        "warm_s": warm,
        "asleep_s": asleep,
        "cold_s": cold,
        "awake_mib": awake_mib,
        "asleep_mib": asleep_mib,
    }


def run(ctx: Context) -> dict[str, Any]:
    runs: list[dict[str, float]] = []
    with running_daemon(CONFIG, tag="sleep") as daemon:
        for r in range(ctx.runs):
            log(f"sleep: run {r + 1}/{ctx.runs}")
            runs.append(_one(daemon.url, daemon.engines))

    def get(key: str) -> dict[str, Any]:
        return summarize(r[key] for r in runs)

    wake_vs_cold = summarize(ratio(r["asleep_s"], r["cold_s"]) for r in runs)
    wake_vs_warm = summarize(ratio(r["asleep_s"], r["warm_s"]) for r in runs)
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {"idle_sleep_s": 1, "slots": 1, "num_predict": 4},
        "values": {"asleep_s": get("asleep_s"), "wake_vs_cold": wake_vs_cold, "wake_vs_warm": wake_vs_warm},
        "tables": [
            {
                "title": f"First token, median [min, max] over {len(runs)} runs",
                "columns": ["state", "seconds", "engine RSS (MiB)"],
                "rows": [
                    ["warm", get("warm_s"), get("awake_mib")],
                    ["asleep (idle_sleep_s)", get("asleep_s"), get("asleep_mib")],
                    ["cold (unloaded)", get("cold_s"), ""],
                ],
            },
            {
                "title": "Waking from sleep ÷ a cold start, and ÷ warm",
                "columns": ["asleep ÷ cold", "asleep ÷ warm"],
                "rows": [[wake_vs_cold, wake_vs_warm]],
            },
        ],
        "plots": [],
        "commands": {"config": CONFIG.strip().replace("\n", "; "), "request": "POST /api/generate (stream)"},
        "raw_runs": runs,
    }
