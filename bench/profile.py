"""CPU profile of the daemon's hot path (run by hand; BENCHMARK.md cites its output).

    python -m bench.profile [--requests 2000] [--concurrency 16] [--stream] [--sampler py-spy]

Starts ``blazar serve`` with the instant upstream as its engine, the same rig
as the overhead benchmark, sends the requests, stops the daemon and writes
``bench/results/<date>-profile-<mode>-c<C>[-py-spy].txt``: the functions and
packages that took the CPU.

``--sampler cprofile`` (the default) runs the daemon under cProfile (CPU time):
exact call counts, but it slows call-heavy code down several times, so read the
proportions, not the absolute times. ``--sampler py-spy`` samples the running
daemon from outside (``py-spy record``, in the ``bench`` extra; it needs
permission to ptrace the daemon): no distortion, no call counts.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import runpy
import shutil
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


def rig(*, slots: int = 64, chunks: int = 32, interval_ms: float = 1.0) -> str:
    """The daemon's config on the overhead rig: the instant upstream as its engine."""
    upstream = ROOT / "bench" / "instant-upstream"
    return RIG.format(upstream=upstream, slots=slots, chunks=chunks, interval_ms=interval_ms)


RIG = """slots = {slots}
default_ctx = 512
keep_alive_s = -1
max_queue = 4096
[engine]
llama_server = "{upstream}"
extra_args = ["--chunks", "{chunks}", "--interval-ms", "{interval_ms}", "-np", "{slots}"]
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
    ("HTTP/1.1 server: read and parse each request", "blazar/web/asgi/h1.py", "_read"),
    ("HTTP/1.1 server: an answer's head and whole body", "blazar/web/asgi/h1.py", "_send"),
    ("hypercorn (TLS, HTTP/2, WebSockets): read and parse", "hypercorn/protocol/h11.py", "handle"),
    ("hypercorn (TLS, HTTP/2, WebSockets): write", "hypercorn/protocol/http_stream.py", "app_send"),
    ("gateway layer (call, card, guard, ledger, cleanups)", "blazar/web/asgi/gateway.py", "__call__"),
    ("gateway route: body, handler, reply", "blazar/web/asgi/gateway.py", "_serve"),
    ("gateway route: send the reply", "blazar/web/asgi/gateway.py", "_send_reply"),
    ("the relay route (claim, upstream, response)", "blazar/serve/openai_chat.py", "relay"),
    ("claim: admission slot, engine, lease", "actors/claim.py", "claim_on"),
    ("upstream client: request and response head", "actors/upstream.py", "request"),
    ("upstream client: read the body", "actors/upstream.py", "receive_some"),
    ("gateway: a streamed chunk to the client", "blazar/web/middleware/exchange.py", "write_body"),
    ("the pump: relayed chunks (read, frame, write, count)", "blazar/web/asgi/pump.py", "_run"),
)


def _layers(stats: pstats.Stats, total: float) -> list[tuple[str, float]]:
    table = stats.stats  # type: ignore[attr-defined]
    out = []
    for label, path, name in _LAYERS:
        cum = sum(v[3] for (f, _line, fn), v in table.items() if f.endswith(path) and fn == name)
        out.append((label, cum / total if total else 0.0))
    return out


def _start_daemon(tmp: Path, cmd: list[str], args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    sys.path.insert(0, str(ROOT))
    from tests.support import ensure_model, home_env, make_home

    home = make_home(
        tmp / "home",
        ensure_model(),
        config=rig(slots=max(64, args.concurrency), chunks=args.chunks, interval_ms=args.interval_ms),
    )
    proc = subprocess.Popen(
        cmd, env=home_env(home), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    info = home / "run" / "daemon.json"
    while not info.exists():
        if proc.poll() is not None:
            raise SystemExit("the daemon did not start")
        time.sleep(0.05)
    return proc, str(json.loads(info.read_text())["url"])


def _result_path(args: argparse.Namespace, suffix: str = "") -> Path:
    mode = "stream" if args.stream else "nonstream"
    name = f"{time.strftime('%Y-%m-%d')}-profile-{mode}-c{args.concurrency}{suffix}.txt"
    return ROOT / "bench" / "results" / name


def _command(args: argparse.Namespace) -> str:
    return (
        f"python -m bench.profile --requests {args.requests} --concurrency {args.concurrency}"
        f" --chunks {args.chunks} --interval-ms {args.interval_ms:g}"
        f"{' --stream' if args.stream else ''}{' --sampler py-spy' if args.sampler == 'py-spy' else ''}"
    )


def _main_py_spy(args: argparse.Namespace) -> int:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    tmp = Path(tempfile.mkdtemp(prefix="blazar-profile-"))
    raw = tmp / "daemon.txt"
    proc, url = _start_daemon(tmp, [sys.executable, "-m", "blazar", "serve", "--port", "0"], args)
    try:
        trio.run(_load, url, 200, args.concurrency, args.stream)  # warm: engine up, pools filled
        sampler = subprocess.Popen(
            [spy, "record", "-p", str(proc.pid), "-r", "250", "-f", "raw", "-o", str(raw), "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached
        elapsed = trio.run(_load, url, args.requests, args.concurrency, args.stream)
        sampler.send_signal(signal.SIGINT)  # py-spy writes its output on interrupt
        sampler.wait(60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    mode = "stream" if args.stream else "nonstream"
    text = (
        f"py-spy samples (250 Hz, all threads) of `blazar serve`, instant upstream as the engine, "
        f"{args.requests} {mode} requests at C={args.concurrency} in {elapsed:.1f} s (wall).\n"
        f"Command: {_command(args)}\n\n" + _py_spy_report(raw)
    )
    out = _result_path(args, "-py-spy")
    out.write_text(text.replace(str(ROOT) + "/", ""))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


def _py_spy_report(raw: Path, top: int = 30) -> str:
    """Own samples by package and by function, and cumulative samples of the layers,
    from py-spy's collapsed stacks (``frame;frame;... count`` per line)."""
    own: dict[str, int] = defaultdict(int)
    packages: dict[str, int] = defaultdict(int)
    layers: dict[str, int] = defaultdict(int)
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        leaf = frames[-1]
        own[leaf.rsplit(":", 1)[0] + ")" if ":" in leaf else leaf] += n
        where = leaf[leaf.find("(") + 1 :]
        parts = Path(where.split(":", 1)[0]).parts
        packages[next((p for p in _PACKAGES if p in parts), "other")] += n
        calls = [(fn.rsplit(".", 1)[-1], loc) for fn, _, loc in (f.partition(" (") for f in frames)]
        for label, path, name in _LAYERS:
            if any(fn == name and path in loc for fn, loc in calls):
                layers[label] += n
    if not total:
        return "py-spy recorded no samples (is ptrace allowed?)\n"
    out = io.StringIO()
    out.write(f"{total} samples.\n\nOwn samples by package:\n")
    for package, n in sorted(packages.items(), key=lambda kv: -kv[1]):
        out.write(f"  {package:10s} {n / total:6.1%}\n")
    out.write("\nSamples inside each layer a request crosses (nested: shares overlap):\n")
    for label, _path, _name in _LAYERS:
        out.write(f"  {layers[label] / total:6.1%}  {label}\n")
    out.write("\nTop functions by own samples:\n")
    for name, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        out.write(f"  {n / total:6.1%}  {name}\n")
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--chunks", type=int, default=32, help="chunks per streamed answer")
    parser.add_argument(
        "--interval-ms", type=float, default=1.0, help="the upstream's pause before each chunk"
    )
    parser.add_argument("--sampler", choices=("cprofile", "py-spy"), default="cprofile")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # internal: the profiled child
    args = parser.parse_args()
    if args.serve:
        _serve_profiled(args.serve)
        return 0
    if args.sampler == "py-spy":
        return _main_py_spy(args)

    tmp = Path(tempfile.mkdtemp(prefix="blazar-profile-"))
    prof = tmp / "daemon.prof"
    proc, url = _start_daemon(tmp, [sys.executable, "-m", "bench.profile", "--serve", str(prof)], args)
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
        f"Command: {_command(args)}\n"
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
    out = _result_path(args)
    out.write_text(text.getvalue().replace(str(ROOT) + "/", "").replace(sys.prefix, "<venv>"))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
