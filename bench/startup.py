"""Start-up: `blazar run` to first token with no daemon running, the engine started by hand,
and an idle wake.

Each run measures, one after the other:

- **cold CLI**: ``python -m blazar run smollm2-135m PROMPT`` in a home where no
  daemon runs, from the spawn to the first byte of answer on its stdout. It
  includes the CLI's start, the background daemon's start, the engine's load and
  the first token. The daemon is stopped (``blazar stop``) afterwards.
- **direct engine**: the engine the daemon would run, started by hand with the
  same argv, polled on /health every 10 ms, then asked for a streamed answer:
  spawn to first token (and spawn to healthy).
- **idle wake**: a daemon that runs but whose model was unloaded
  (``POST /admin/models/<m>/unload``, as ``blazar unload`` does): a streamed
  request to first token.

The page cache is warm for all three (the model file was read before).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench import _plots
from bench._harness import Context
from bench._http import Connection, build_request, split_url, token_times
from bench._rigs import (
    MODEL,
    DirectEngine,
    engine_config,
    engine_of,
    free_port,
    load_model,
    log,
    redact,
)
from bench._stats import ratio, summarize
from bench._system import ROOT, descendants
from tests.support import ensure_model, home_env, make_home, start_daemon, wait_gone

__all__ = ["TITLE", "run"]

TITLE = "Start-up and idle wake"
PROMPT = "Say hello."
MAX_TOKENS = 8


def _chat(headers: dict[str, str] | None = None) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": True,
        }
    ).encode()


async def _first_token(url: str, headers: dict[str, str]) -> float:
    """Send a streamed chat request; returns when its first token arrived (perf_counter)."""
    host, port = split_url(url)
    conn = Connection(host, port)
    raw = build_request("POST", "/v1/chat/completions", host=f"{host}:{port}", body=_chat(), headers=headers)
    reply = await conn.request(raw, keep_pieces=True)
    await conn.aclose()
    if reply.status != 200:
        raise RuntimeError(f"{url} answered {reply.status}")
    times = token_times(reply.pieces, ndjson=False)
    return times[0] if times else reply.t_end


CLI_COMMANDS = (("--help",), ("list",), ("ps",))
"""Commands timed with no daemon running: each must not pay for the gateway's imports."""


def _cli_times(home: Path) -> dict[str, float]:
    """Wall seconds of each quick command, from spawn to exit, no daemon running."""
    env = home_env(home)
    out = {}
    for args in CLI_COMMANDS:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "blazar", *args], env=env, capture_output=True, check=True)
        out[" ".join(args)] = time.perf_counter() - t0
    return out


def _cold_cli(home: Path) -> dict[str, Any]:
    env = home_env(home)
    argv = [
        sys.executable,
        "-m",
        "blazar",
        "run",
        MODEL,
        PROMPT,
        "--temperature",
        "0",
        "--max-tokens",
        str(MAX_TOKENS),
    ]
    marks: dict[str, float] = {}

    def watch_stderr(stream: Any) -> None:
        for line in iter(stream.readline, b""):
            if b"started a background daemon" in line:
                marks.setdefault("daemon", time.perf_counter())

    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    watcher = threading.Thread(target=watch_stderr, args=(proc.stderr,), daemon=True)
    watcher.start()
    first = proc.stdout.read(1)
    t_first = time.perf_counter()
    proc.stdout.read()
    rc = proc.wait(120)
    watcher.join(5)
    if rc != 0 or not first:
        raise RuntimeError(f"`blazar run` exited with {rc} and printed {first!r}")
    info = json.loads((home / "run" / "daemon.json").read_text())
    engine = engine_of(info["url"])
    daemon_pid = int(info["pid"])
    pids = [daemon_pid, *descendants(daemon_pid)]
    subprocess.run(
        [sys.executable, "-m", "blazar", "stop"], env=env, cwd=ROOT, capture_output=True, timeout=60
    )
    if wait_gone(pids, timeout_s=30.0):
        raise RuntimeError("the background daemon or its engine outlived `blazar stop`")
    return {
        "first_token_s": t_first - t0,
        "daemon_up_s": marks["daemon"] - t0 if "daemon" in marks else None,
        "engine_argv": engine.argv,
    }


def _direct(argv: list[str], log_dir: Path) -> dict[str, Any]:
    engine = DirectEngine(argv, log_dir=log_dir)
    engine.start(wait=False)
    try:
        deadline = time.monotonic() + 180
        t_healthy = None
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                try:
                    if client.get(f"{engine.url}/health").status_code == 200:
                        t_healthy = time.perf_counter()
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.01)
        if t_healthy is None:
            raise RuntimeError("the direct engine did not become healthy")
        t_first = asyncio.run(_first_token(engine.url, {"Authorization": f"Bearer {engine.api_key}"}))
        return {"healthy_s": t_healthy - engine.t_spawn, "first_token_s": t_first - engine.t_spawn}
    finally:
        engine.stop()


def _wake(url: str) -> dict[str, Any]:
    httpx.post(f"{url}/admin/models/{MODEL}/unload", timeout=60.0).raise_for_status()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        engines = httpx.get(f"{url}/admin/engines", timeout=10.0).json()["engines"]
        if all(e["state"] in ("stopped", "failed") for e in engines if e["model"] == MODEL):
            break
        time.sleep(0.02)
    time.sleep(0.5)
    t0 = time.perf_counter()
    t_first = asyncio.run(_first_token(url, {}))
    return {"first_token_s": t_first - t0}


def run(ctx: Context) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="blazar-bench-startup-"))
    model = ensure_model()
    cli_home = make_home(tmp / "cli", model, config=engine_config(ctx.slots) + f"port = {free_port()}\n")
    wake_home = make_home(tmp / "wake", model, config=engine_config(ctx.slots))
    runs: list[dict[str, Any]] = []
    engine_argv: list[str] = []
    daemon = start_daemon(wake_home, timeout_s=120.0)
    try:
        load_model(daemon.url)
        for r in range(ctx.runs):
            log(f"startup: run {r + 1}/{ctx.runs}")
            cold = _cold_cli(cli_home)
            engine_argv = cold.pop("engine_argv")
            direct = _direct(engine_argv, ctx.work_dir)
            wake = _wake(daemon.url)
            runs.append({"cold_cli": cold, "direct": direct, "wake": wake, "cli": _cli_times(cli_home)})
    finally:
        pids = [daemon.proc.pid, *descendants(daemon.proc.pid)]
        daemon.stop()
        wait_gone(pids, timeout_s=15.0)
        shutil.rmtree(tmp, ignore_errors=True)

    def get(who: str, key: str) -> dict[str, Any]:
        return summarize(r[who][key] for r in runs)

    def vs_direct(who: str, fn: Any) -> dict[str, Any]:
        return summarize(fn(r[who]["first_token_s"], r["direct"]["first_token_s"]) for r in runs)

    rows = [
        ["`blazar run`, no daemon running → first token", get("cold_cli", "first_token_s"),
         vs_direct("cold_cli", lambda a, b: a - b), vs_direct("cold_cli", ratio)],
        ["  of which: until the daemon answered", get("cold_cli", "daemon_up_s"), "", ""],
        ["direct engine: spawn → first token", get("direct", "first_token_s"), 0.0, 1.0],
        ["  of which: spawn → /health 200", get("direct", "healthy_s"), "", ""],
        ["idle wake (model unloaded) → first token", get("wake", "first_token_s"),
         vs_direct("wake", lambda a, b: a - b), vs_direct("wake", ratio)],
    ]  # fmt: skip
    rows += [
        [f"`blazar {' '.join(args)}`, no daemon running (spawn → exit)", get("cli", " ".join(args)), "", ""]
        for args in CLI_COMMANDS
    ]
    values = {
        "cold_run_ratio": vs_direct("cold_cli", ratio),
        "idle_wake_ratio": vs_direct("wake", ratio),
        "cli_slowest_s": summarize(max(r["cli"].values()) for r in runs),
    }
    plots = []
    groups = ["blazar run (cold)", "direct engine", "idle wake"]
    if _plots.bars(
        ctx.plot_path("times"),
        title="Time to first token from a standing start",
        ylabel="seconds",
        groups=groups,
        series={
            "first token": [
                get("cold_cli", "first_token_s"),
                get("direct", "first_token_s"),
                get("wake", "first_token_s"),
            ]
        },
    ):
        plots.append({"file": ctx.plot_path("times").name, "title": "Start-up times"})
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "slots": ctx.slots},
        "values": values,
        "tables": [
            {
                "title": f"Seconds, median [min, max] over {len(runs)} runs",
                "columns": ["what", "seconds", "minus direct (s)", "÷ direct"],
                "rows": rows,
            }
        ],
        "plots": plots,
        "commands": {
            "cold CLI": f"python -m blazar run {MODEL} '{PROMPT}' --temperature 0 --max-tokens {MAX_TOKENS}",
            "stop": "python -m blazar stop",
            "engine (direct)": redact(engine_argv),
            "wake": f"POST /admin/models/{MODEL}/unload, then POST /v1/chat/completions (stream)",
        },
        "raw_runs": runs,
    }
