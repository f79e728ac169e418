"""Soak test: many mixed requests with random disconnects and cancels (run by hand).

    python -m bench.soak [--requests 2000] [--concurrency 16]

Starts a daemon in a temporary BLAZAR_HOME with the test model, warms it up
with 200 requests, then sends the mixed load from 16 concurrent workers:
OpenAI/Ollama/Anthropic, stream and not, some clients that disconnect midway,
some requests cancelled or interrupted from another connection. At the end it
checks the engine's own /slots (all idle: no leaked slot), counts 5xx that
nobody induced, and measures the daemon's RSS growth since the warm-up. It
writes bench/results/<date>-soak.json and prints a summary; the exit code is
non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m"
TIMEOUT_S = 120.0
DELIBERATE = {"ENGINE_CRASHED", "SHUTTING_DOWN", "ALL_SLOTS_BUSY"}


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _start(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLAZAR_")} | {"BLAZAR_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "blazar", "serve", "--port", "0"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    info = home / "run" / "daemon.json"
    for _ in range(600):
        if info.exists():
            return proc, json.loads(info.read_text())["url"]
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("daemon did not start")


def _request(kind: str, stream: bool, max_tokens: int) -> tuple[str, dict[str, Any]]:
    prompt = random.choice(["Say hi.", "Name a colour.", "Count to five.", "Write a haiku about rain."])
    if kind == "openai":
        return "/v1/chat/completions", {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    if kind == "ollama":
        return "/api/chat", {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "options": {"num_predict": max_tokens},
            "stream": stream,
        }
    return "/v1/messages", {
        "model": MODEL,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": prompt}],
        "stream": stream,
    }


class Tally:
    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self.timeouts: list[str] = []


async def _one(client: httpx.AsyncClient, url: str, tally: Tally, rng: random.Random, chaos: bool) -> None:
    kind = rng.choice(["openai", "ollama", "anthropic"])
    stream = rng.random() < 0.6
    path, body = _request(kind, stream, rng.randint(4, 24))
    weights = [80, 10, 5, 5] if chaos else [1, 0, 0, 0]
    action = rng.choices(["normal", "disconnect", "cancel", "interrupt"], weights=weights)[0]
    try:
        async with client.stream("POST", url + path, json=body) as resp:
            trace = resp.headers.get("x-blazar-trace-id", "")
            if action in ("cancel", "interrupt") and trace:
                await client.post(f"{url}/v1/requests/{trace}/{action}")
            chunks = 0
            async for _ in resp.aiter_bytes():
                chunks += 1
                if action == "disconnect" and chunks >= 2:
                    break  # leaving the block closes the connection mid-stream
            status = resp.status_code
            if status >= 500:
                await resp.aread()
                code = ""
                try:
                    doc = json.loads(resp.content or b"{}")
                    code = doc.get("blazar_code") or (doc.get("error") or {}).get("blazar_code", "")
                except ValueError:
                    pass
                if code not in DELIBERATE:
                    tally.unexpected.append(f"{status} {code} {path}")
            tally.outcomes[f"{action}:{status}"] += 1
    except httpx.HTTPError as exc:
        tally.outcomes[f"{action}:{type(exc).__name__}"] += 1
        if isinstance(exc, httpx.TimeoutException):
            # Where was it stuck? The card of the request says (queued, running, …).
            stuck = (await client.get(f"{url}/v1/requests", params={"path": path})).json()["data"]
            live = [
                f"{c['id']}:{c['state']}:{c['chunks']}" for c in stuck if c["state"] in ("queued", "running")
            ]
            tally.timeouts.append(f"{kind} stream={stream} {path} live={live[:4]}")


async def _load(url: str, n: int, concurrency: int, seed: int, chaos: bool = True) -> Tally:
    tally = Tally()
    rng = random.Random(seed)
    counter = iter(range(n))
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S), limits=limits) as client:

        async def worker() -> None:
            for _ in counter:
                await _one(client, url, tally, rng, chaos)

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
    return tally


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="client read timeout")
    parser.add_argument(
        "--no-chaos", dest="chaos", action="store_false", help="no disconnects, cancels or interrupts"
    )
    args = parser.parse_args()
    global TIMEOUT_S
    TIMEOUT_S = args.timeout_s

    sys.path.insert(0, str(ROOT))
    from tests.support import ensure_model, make_home

    home = Path(tempfile.mkdtemp(prefix="blazar-soak-")) / "home"
    make_home(home, ensure_model(), config="max_queue = 1024\n")
    proc, url = _start(home)
    try:
        t0 = time.monotonic()
        trio.run(_load, url, args.warmup, args.concurrency, args.seed)
        rss_after_warmup = _rss_bytes(proc.pid)
        tally = trio.run(_load, url, args.requests, args.concurrency, args.seed + 1, args.chaos)
        time.sleep(1.0)
        rss_end = _rss_bytes(proc.pid)
        slots = httpx.get(f"{url}/admin/engines/{MODEL}/slots", timeout=30).json()
        leaked = sum(1 for s in slots if s.get("is_processing"))
        engines = httpx.get(f"{url}/admin/engines", timeout=30).json()
        elapsed_s = time.monotonic() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(home.parent, ignore_errors=True)

    growth = (rss_end - rss_after_warmup) / rss_after_warmup if rss_after_warmup else 0.0
    result = {
        "name": "soak",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "command": " ".join(["python -m bench.soak", *sys.argv[1:]]),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "elapsed_s": round(elapsed_s, 1),
        "outcomes": dict(sorted(tally.outcomes.items())),
        "leaked_slots": leaked,
        "unexpected_5xx": tally.unexpected,
        "client_timeouts": tally.timeouts,
        "rss_after_warmup_mb": round(rss_after_warmup / 2**20, 1),
        "rss_end_mb": round(rss_end / 2**20, 1),
        "rss_growth": round(growth, 4),
        "admission": engines.get("admission"),
        "checks": {
            "no_leaked_slots": leaked == 0,
            "no_unexpected_5xx": not tally.unexpected,
            "rss_growth_under_10pct": growth < 0.10,
        },
    }
    out = ROOT / "bench" / "results" / f"{time.strftime('%Y-%m-%d')}-soak.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {k: result[k] for k in ("outcomes", "leaked_slots", "unexpected_5xx", "rss_growth", "checks")}
        )
    )
    print(f"wrote {out.relative_to(ROOT)}")
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
