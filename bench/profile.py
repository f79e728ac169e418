"""CPU profile of the daemon's hot path (run by hand; BENCHMARK.md cites its output).

    python -m bench.profile [--requests 2000] [--concurrency 16] [--stream]

Starts ``blazar serve`` under cProfile (CPU time, not wall time) with the
instant upstream as its engine, the same rig as the overhead benchmark, sends
the requests, stops the daemon and writes
``bench/results/<date>-profile-<mode>-c<C>.txt``: the CPU per request and the
functions and packages that took it. cProfile slows call-heavy code down; read
the proportions, not the absolute times.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
RIG = """slots = 64
default_ctx = 512
keep_alive_s = -1
max_queue = 4096
[engine]
llama_server = "{upstream}"
extra_args = ["--chunks", "32", "--interval-ms", "1.0"]
"""
_PACKAGES = (
    "hypercorn",
    "quart",
    "werkzeug",
    "h11",
    "httpx",
    "httpcore",
    "trio",
    "msgspec",
    "actors",
    "blazar",
)


def _serve_profiled(out: str) -> None:
    """The child: the daemon's own entry point under cProfile."""
    profile = cProfile.Profile(time.process_time)
    sys.argv = ["blazar", "serve", "--port", "0"]
    profile.enable()
    try:
        runpy.run_module("blazar", run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        profile.disable()
        profile.dump_stats(out)


async def _load(url: str, n: int, concurrency: int, stream: bool) -> float:
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        (await client.post("/v1/chat/completions", json=body)).raise_for_status()
        gate = trio.Semaphore(concurrency)

        async def one() -> None:
            async with gate:
                (await client.post("/v1/chat/completions", json=body)).raise_for_status()

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
        return time.perf_counter() - t0


def _by_package(stats: pstats.Stats) -> dict[str, float]:
    own: dict[str, float] = defaultdict(float)
    for (filename, _line, _name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        parts = Path(filename).parts
        package = next((p for p in _PACKAGES if p in parts), "other")
        own[package] += tottime
    return dict(sorted(own.items(), key=lambda kv: -kv[1]))


_LAYERS = (
    ("hypercorn: read, parse and dispatch each request", "hypercorn/protocol/h11.py", "handle"),
    ("hypercorn: write each response event", "hypercorn/protocol/http_stream.py", "app_send"),
    ("gateway middleware (trace ids, cards, ledger)", "blazar/web/app.py", "__call__"),
    ("quart: request to response", "quart/asgi.py", "handle_request"),
    ("quart: send the response", "quart/asgi.py", "_send_response"),
    ("the relay route (claim, upstream, response)", "blazar/web/openai.py", "relay"),
    ("claim: admission slot, engine, lease", "blazar/web/claim.py", "claim_engine"),
    ("upstream client: request and response head", "actors/upstream.py", "request"),
    ("upstream client: read the body", "actors/upstream.py", "aread"),
)


def _layers(stats: pstats.Stats, total: float) -> list[tuple[str, float]]:
    table = stats.stats  # type: ignore[attr-defined]
    out = []
    for label, path, name in _LAYERS:
        cum = sum(v[3] for (f, _line, fn), v in table.items() if f.endswith(path) and fn == name)
        out.append((label, cum / total if total else 0.0))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # internal: the profiled child
    args = parser.parse_args()
    if args.serve:
        _serve_profiled(args.serve)
        return 0

    sys.path.insert(0, str(ROOT))
    from tests.support import ensure_model, home_env, make_home

    tmp = Path(tempfile.mkdtemp(prefix="blazar-profile-"))
    home = make_home(
        tmp / "home", ensure_model(), config=RIG.format(upstream=ROOT / "bench" / "instant-upstream")
    )
    prof = tmp / "daemon.prof"
    cmd = [sys.executable, "-m", "bench.profile", "--serve", str(prof)]
    proc = subprocess.Popen(
        cmd, env=home_env(home), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    info = home / "run" / "daemon.json"
    while not info.exists():
        if proc.poll() is not None:
            raise SystemExit("the daemon did not start")
        time.sleep(0.05)
    url = json.loads(info.read_text())["url"]
    elapsed = trio.run(_load, url, args.requests, args.concurrency, args.stream)
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)

    stats = pstats.Stats(str(prof))
    total = stats.total_tt  # type: ignore[attr-defined]
    mode = "stream" if args.stream else "nonstream"
    text = io.StringIO()
    text.write(
        f"cProfile (CPU time) of `blazar serve`, instant upstream as the engine, {args.requests} {mode} "
        f"requests at C={args.concurrency} in {elapsed:.1f} s (wall).\n"
        f"Command: python -m bench.profile --requests {args.requests} --concurrency {args.concurrency}"
        f"{' --stream' if args.stream else ''}\n"
        f"CPU {total:.2f} s in all, {total / args.requests * 1000:.2f} ms per request "
        "(inflated by the profiler: read the shares).\n\nOwn CPU time by package:\n"
    )
    for package, seconds in _by_package(stats).items():
        text.write(f"  {package:10s} {seconds:7.2f} s  {seconds / total:6.1%}\n")
    text.write("\nCumulative CPU of the layers a request crosses (nested: shares overlap):\n")
    for label, share in _layers(stats, total):
        text.write(f"  {share:6.1%}  {label}\n")
    text.write("\nTop functions by own time:\n")
    stats.stream = text  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(30)
    out = ROOT / "bench" / "results" / f"{time.strftime('%Y-%m-%d')}-profile-{mode}-c{args.concurrency}.txt"
    out.write_text(text.getvalue().replace(str(ROOT) + "/", "").replace(sys.prefix, "<venv>"))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
