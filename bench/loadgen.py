"""The load generator: a separate process, so its CPU is not the gateway's.

    python -m bench.loadgen --url http://127.0.0.1:8080 --path /v1/chat/completions \\
        --body '{"model": "m", "messages": [...]}' --concurrency 16 --count 2000

A closed loop: ``concurrency`` workers, each on its own keep-alive connection,
send the next request as soon as the last one ended, until ``count`` measured
requests are done or ``duration_s`` has passed (after ``warmup`` unmeasured ones). Several request templates
are cycled in order. It prints one JSON object: wall time, per-request latency
and time to first byte, errors, and with ``--events`` the arrival time of every
token event (relative to the request's start).

``python -m bench.loadgen --serve`` reads one such job per line on stdin and
answers one JSON line per job: the harness keeps one generator process for a
whole benchmark, so no job pays for a process start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from typing import Any

from bench._http import Connection, Reply, build_request, split_url, token_times

__all__ = ["run_job"]


def _prepare(job: dict[str, Any]) -> list[tuple[bytes, bool]]:
    host, port = split_url(job["url"])
    out = []
    for spec in job["requests"]:
        body = spec.get("body")
        raw_body = None if body is None else (body if isinstance(body, str) else json.dumps(body)).encode()
        raw = build_request(
            spec.get("method", "POST"),
            spec["path"],
            host=f"{host}:{port}",
            body=raw_body,
            headers=spec.get("headers"),
        )
        out.append((raw, bool(spec.get("ndjson"))))
    return out


async def run_job(job: dict[str, Any]) -> dict[str, Any]:
    host, port = split_url(job["url"])
    templates = _prepare(job)
    concurrency = int(job.get("concurrency", 1))
    duration_s = job.get("duration_s")
    count = int(job.get("count", 10**9 if duration_s else 100))
    warmup = int(job.get("warmup", 0))
    keep_events = bool(job.get("events", False))
    timeout_s = float(job.get("timeout_s", 300.0))
    conns = [Connection(host, port) for _ in range(concurrency)]
    errors: list[str] = []

    async def phase(n: int, offset: int, record: bool, until: float = math.inf) -> list[tuple[int, Reply]]:
        todo = iter(range(offset, offset + n))
        done: list[tuple[int, Reply]] = []

        async def worker(conn: Connection) -> None:
            for i in todo:
                if time.perf_counter() >= until:
                    break
                raw = templates[i % len(templates)][0]
                try:
                    async with asyncio.timeout(timeout_s):
                        reply = await conn.request(raw, keep_pieces=keep_events and record)
                except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                    conn.abort()
                    continue
                if reply.status != 200:
                    errors.append(f"HTTP {reply.status}")
                if record:
                    done.append((i, reply))

        await asyncio.gather(*(worker(c) for c in conns))
        return done

    await asyncio.gather(*(c.open() for c in conns))
    if warmup:
        await phase(warmup, 0, record=False)
        errors.clear()
    t0 = time.perf_counter()
    until = t0 + float(duration_s) if duration_s else math.inf
    replies = await phase(count, warmup, record=True, until=until)
    t1 = time.perf_counter()
    for c in conns:
        await c.aclose()
    replies.sort(key=lambda p: p[1].t_start)
    result: dict[str, Any] = {
        "t0": t0,
        "wall_s": t1 - t0,
        "count": len(replies),
        "ok": sum(1 for _, r in replies if r.status == 200),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "latency_s": [round(r.t_end - r.t_start, 7) for _, r in replies],
        "ttfb_s": [round(r.t_first - r.t_start, 7) for _, r in replies],
        "pieces": sum(r.npieces for _, r in replies),
    }
    if keep_events:
        result["tokens"] = [
            [round(t - r.t_start, 7) for t in token_times(r.pieces, ndjson=templates[i % len(templates)][1])]
            for i, r in replies
        ]
    return result


def _serve() -> int:
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        if line == "quit":
            break
        try:
            result = asyncio.run(run_job(json.loads(line)))
        except Exception as exc:  # the harness reads the failure from the answer
            result = {"failed": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(result, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    p.add_argument("--serve", action="store_true", help="read JSON jobs on stdin, one per line")
    p.add_argument("--url", default="http://127.0.0.1:11435")
    p.add_argument("--path", default="/v1/chat/completions")
    p.add_argument("--method", default="POST")
    p.add_argument("--body", default=None, help="JSON request body")
    p.add_argument("--header", action="append", default=[], help="NAME: VALUE (repeatable)")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--count", type=int, default=None, help="measured requests (default 100)")
    p.add_argument("--duration-s", type=float, default=None, help="measure for this long instead")
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--events", action="store_true", help="time each token event")
    p.add_argument("--ndjson", action="store_true", help="the stream is NDJSON (Ollama)")
    ns = p.parse_args(argv)
    if ns.serve:
        return _serve()
    headers = dict(h.split(":", 1) for h in ns.header)
    job = {
        "url": ns.url,
        "requests": [
            {
                "method": ns.method,
                "path": ns.path,
                "body": ns.body,
                "headers": {k.strip(): v.strip() for k, v in headers.items()},
                "ndjson": ns.ndjson,
            }
        ],
        "concurrency": ns.concurrency,
        "count": ns.count or (10**9 if ns.duration_s else 100),
        "duration_s": ns.duration_s,
        "warmup": ns.warmup,
        "events": ns.events,
    }
    print(json.dumps(asyncio.run(run_job(job))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
