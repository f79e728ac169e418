"""A client's requests while 2,000 idle connections from several loopback addresses hold the caps.

The daemon runs with its default connection caps (``max_connections`` 1024,
``max_connections_per_client`` 256, ``header_timeout_s`` 10) and the instant upstream as its
engine. A normal client on 127.0.0.1 sends whole-answer OpenAI chat requests one after the
other, each over a new connection (``Connection: close``), as a script or a CLI calling the
daemon does; each is timed from ``connect`` to the last byte of the answer, and counts as a
success only with a 200. Each run measures it twice, one after the other: without a flood
(B), then while the flood holds the caps (A).

The flood is a separate process (``python -m bench.idleflood --flood …``): 2,000 connections,
250 from each of 127.0.0.2 … 127.0.0.9 (under the per-address cap, so only the total one
binds), every other one sending half a request head and none ever finishing one. Each that
the daemon closes (to make room, or at ``header_timeout_s``) or refuses is reopened, at most
``REOPEN_PER_S`` a second in all, so the daemon is held at its cap for the whole measurement.
The client's figures are taken only once all 2,000 have been opened. Both processes raise
their open-files limit for the sockets. Before the connection caps made room by closing
unused connections, the client's new connections were refused (503) for as long as the flood
held the caps.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._harness import Context
from bench._rigs import daemon_commands, instant_config, log, running_daemon
from bench._stats import percentile, summarize
from tests.support import MODEL

__all__ = ["TITLE", "run"]

TITLE = "Idle connection flood: a client's requests while 2,000 idle sockets hold the caps"
FLOOD = 2000
ADDRESSES = tuple(f"127.0.0.{i}" for i in range(2, 10))
REOPEN_PER_S = 200
HALF_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
TIMEOUT_S = 30.0
ROOT = Path(__file__).resolve().parent.parent


def _raise_open_files(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return int(soft)


# -- the flood (its own process) ---------------------------------------------------------------


def _flood(port: int, count: int, addresses: Sequence[str], reopen_per_s: float) -> None:
    """Hold ``count`` idle connections to ``port`` until stdin closes; then print what happened."""
    import trio

    _raise_open_files(count + 256)
    stats = {"opened": 0, "closed_by_daemon": 0, "refused_503": 0, "connect_failed": 0}
    first_round = trio.Event()
    opened_once = 0

    async def hold(index: int, tokens: trio.MemoryReceiveChannel[None]) -> None:
        nonlocal opened_once
        source = addresses[index % len(addresses)]
        first = True
        while True:
            if not first:
                await tokens.receive()
            sock = trio.socket.socket()
            try:
                await sock.bind((source, 0))
                await sock.connect(("127.0.0.1", port))
            except OSError:
                stats["connect_failed"] += 1
                sock.close()
                continue
            finally:
                if first:  # tried once: the flood is up when every connection has been
                    first = False
                    opened_once += 1
                    if opened_once == count:
                        first_round.set()
            stats["opened"] += 1
            try:
                if index % 2:
                    await sock.send(HALF_HEAD)
                data = await sock.recv(4096)
            except OSError:
                data = b""
            finally:
                sock.close()
            if data.startswith(b"HTTP/1.1 503"):
                stats["refused_503"] += 1
            else:
                stats["closed_by_daemon"] += 1

    async def pace(send: trio.MemorySendChannel[None]) -> None:
        while True:
            await send.send(None)
            await trio.sleep(1 / reopen_per_s)

    async def main() -> None:
        send, receive = trio.open_memory_channel[None](0)
        stdin = trio.lowlevel.FdStream(0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pace, send)
            for i in range(count):
                nursery.start_soon(hold, i, receive)
                if i % 100 == 99:
                    await trio.sleep(0.01)  # let the accepts keep up with the connects
            await first_round.wait()
            print(json.dumps({"ready": True}), flush=True)
            while await stdin.receive_some(4096):
                pass
            print(json.dumps(stats), flush=True)
            nursery.cancel_scope.cancel()

    trio.run(main)


class Flood:
    """The flood process: ``start`` returns once every connection has been opened once."""

    def __init__(self, port: int) -> None:
        self.command = [
            sys.executable,
            *("-m", "bench.idleflood", "--flood", str(port), "--connections", str(FLOOD)),
            *("--addresses", ",".join(ADDRESSES), "--reopen-per-s", str(REOPEN_PER_S)),
        ]
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Flood:
        self.proc = subprocess.Popen(
            self.command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line or not json.loads(line).get("ready"):
            raise RuntimeError(f"the flood did not start: {line!r}")
        return self

    def stop(self) -> dict[str, int]:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        line = self.proc.stdout.readline()
        self.proc.wait(timeout=30)
        return json.loads(line) if line else {}

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# -- the normal client -------------------------------------------------------------------------


def _request(port: int) -> bytes:
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _one(port: int, request: bytes) -> tuple[int, float]:
    """One request over a new connection from 127.0.0.1: its status (0: no answer) and seconds."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
            sock.sendall(request)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except OSError:
        return 0, time.perf_counter() - t0
    elapsed = time.perf_counter() - t0
    status = int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else 0
    return status, elapsed


def _client(port: int, n: int) -> dict[str, Any]:
    request = _request(port)
    statuses: dict[str, int] = {}
    ok_ms: list[float] = []
    all_ms: list[float] = []
    t0 = time.perf_counter()
    for _ in range(n):
        status, seconds = _one(port, request)
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        all_ms.append(seconds * 1000)
        if status == 200:
            ok_ms.append(seconds * 1000)
    wall = time.perf_counter() - t0
    return {
        "requests": n,
        "ok": len(ok_ms),
        "success_pct": 100.0 * len(ok_ms) / n,
        "statuses": statuses,
        "p50_ms": percentile(ok_ms, 50),
        "p99_ms": percentile(ok_ms, 99),
        "max_ms": max(all_ms),
        "wall_s": round(wall, 2),
    }


# -- the benchmark -----------------------------------------------------------------------------


def run(ctx: Context) -> dict[str, Any]:
    requests = ctx.pick(1000, 100)
    _raise_open_files(FLOOD + 1024)
    config = instant_config()
    pairs: list[dict[str, Any]] = []
    with running_daemon(config, tag="idleflood") as daemon:
        port = int(daemon.url.rsplit(":", 1)[1])
        _client(port, ctx.pick(100, 20))  # warm-up: the engine loaded, the paths hot
        for i in range(ctx.runs):
            quiet = _client(port, requests)
            with Flood(port) as flood:
                flooded = _client(port, requests)
                flood_stats = flood.stop()
            log(
                f"idleflood: run {i + 1}/{ctx.runs}: {quiet['success_pct']:.1f} % → "
                f"{flooded['success_pct']:.1f} % ok; p50 {quiet['p50_ms']:.2f} → {flooded['p50_ms']:.2f} ms"
            )
            pairs.append({"quiet": quiet, "flood": flooded, "flood_process": flood_stats})
            time.sleep(2)  # the flood's sockets closed with its process: let the daemon see them go

    def col(side: str, key: str) -> dict[str, Any]:
        return summarize(p[side][key] for p in pairs)

    rows = [
        [
            label,
            col(side, "success_pct"),
            col(side, "p50_ms"),
            col(side, "p99_ms"),
            col(side, "max_ms"),
        ]
        for label, side in (("no flood (B)", "quiet"), (f"{FLOOD} idle connections (A)", "flood"))
    ]
    flood_rows = [
        [key.replace("_", " "), summarize(p["flood_process"].get(key) for p in pairs)]
        for key in ("opened", "closed_by_daemon", "refused_503", "connect_failed")
    ]
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "requests_per_side": requests,
            "flood_connections": FLOOD,
            "flood_addresses": list(ADDRESSES),
            "reopen_per_s": REOPEN_PER_S,
            "caps": "max_connections 1024, max_connections_per_client 256, header_timeout_s 10 (defaults)",
        },
        "values": {
            "idle_flood_success_pct": col("flood", "success_pct"),
            "idle_flood_p99_ms": col("flood", "p99_ms"),
        },
        "tables": [
            {
                "title": f"The client's requests (a new connection each), {requests} a side per run",
                "columns": ["while", "success %", "p50 ms", "p99 ms", "slowest ms"],
                "rows": rows,
            },
            {
                "title": "The flood process, per run (while the client ran)",
                "columns": ["connections", "count"],
                "rows": flood_rows,
            },
        ],
        "runs_raw": pairs,
        "commands": daemon_commands(config) | {"flood": " ".join(Flood(port).command)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idleflood", description=__doc__)
    parser.add_argument("--flood", type=int, required=True, metavar="PORT")
    parser.add_argument("--connections", type=int, default=FLOOD)
    parser.add_argument("--addresses", default=",".join(ADDRESSES))
    parser.add_argument("--reopen-per-s", type=float, default=REOPEN_PER_S)
    args = parser.parse_args()
    _flood(args.flood, args.connections, args.addresses.split(","), args.reopen_per_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
