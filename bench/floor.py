"""The floor under the gateway's CPU figures: the same server stack with nothing in it.

    python -m bench.floor [--requests 4000] [--streams 1200]

Measures, against the instant upstream and with the overhead benchmark's load
(C=16, non-stream, and streams of 34 events), the CPU of two bare ASGI apps on
hypercorn's trio worker, the server the daemon runs on:

* ``answer``: answers every request at once with a fixed body (hypercorn, h11
  and trio alone; non-stream only);
* ``relay``: relays every request to the instant upstream through the
  gateway's own upstream client (``actors.upstream.UpstreamPool``) and sends
  the answer back, chunk by chunk for streams — what the gateway does, minus
  the gateway;

and the daemon itself on the same rig, one after the other. The gateway's own
cost is the daemon's figure minus ``relay``'s. A last column paces one stream
at a time like a small model on a CPU (an event every 8 ms): a process woken
from sleep for every event costs several times more CPU per event than one
kept busy, gateway or not. Writes
``bench/results/<date>-floor.txt``; BENCHMARK.md cites it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHUNKS = 32
EVENTS_PER_STREAM = CHUNKS + 2
_ANSWER = (
    b'{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}]}'
)


def _app(mode: str, upstream_port: int) -> Any:
    from actors.upstream import UpstreamPool

    pool = UpstreamPool("127.0.0.1", upstream_port, headers={}, max_idle=64, idle_expiry_s=3.0)
    json_head = [(b"content-type", b"application/json")]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        if mode == "answer" or scope["method"] != "POST":
            headers = [*json_head, (b"content-length", b"%d" % len(_ANSWER))]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": _ANSWER})
            return
        upstream = await pool.request(
            "POST", scope["path"], body=b"".join(parts), headers={"content-type": "application/json"}
        )
        if upstream.header(b"content-type") != b"text/event-stream":
            data = await upstream.aread()
            headers = [*json_head, (b"content-length", b"%d" % len(data))]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": data})
            return
        sse = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": sse})
        while chunk := await upstream.receive_some():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def _serve(mode: str, port: int, upstream_port: int) -> None:
    """The child: one bare app on hypercorn's trio worker."""
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    trio.run(serve, _app(mode, upstream_port), config)


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(url: str, pid: int, requests: int, streams: int, *, streaming: bool = True) -> tuple[float, ...]:
    """CPU ms of process ``pid`` per non-stream request and per stream event at C=16, and per
    stream event at C=1 with the events 8 ms apart (the pace of a small model on a CPU)."""
    from bench._rigs import LoadGen
    from bench._workloads import job

    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}]}
    plain = [{"path": "/v1/chat/completions", "body": body}]
    stream = [{"path": "/v1/chat/completions", "body": {**body, "stream": True}}]
    paced = [{"path": "/v1/chat/completions", "body": {**body, "stream": True, "bench_interval_ms": 8.0}}]
    paced_streams = max(1, streams // 60)
    gen = LoadGen()
    try:
        # Warm-ups no longer than the measured runs: a smoke run's few requests need few
        gen.run(job(url, plain, concurrency=16, count=min(300, requests)))
        t0 = _cpu(pid)
        gen.run(job(url, plain, concurrency=16, count=requests))
        t1 = _cpu(pid)
        if not streaming:
            return ((t1 - t0) / requests * 1000,)
        gen.run(job(url, stream, concurrency=16, count=min(50, streams)))
        t1 = _cpu(pid)
        gen.run(job(url, stream, concurrency=16, count=streams))
        t2 = _cpu(pid)
        gen.run(job(url, paced, concurrency=1, count=paced_streams))
        t3 = _cpu(pid)
    finally:
        gen.close()

    def per_event_ms(seconds: float, n_streams: int) -> float:
        return seconds / (n_streams * EVENTS_PER_STREAM) * 1000

    return (t1 - t0) / requests * 1000, per_event_ms(t2 - t1, streams), per_event_ms(t3 - t2, paced_streams)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--streams", type=int, default=1200)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the result goes")
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)  # internal: MODE PORT UPSTREAM_PORT
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve[0], int(args.serve[1]), int(args.serve[2]))
        return 0

    sys.path.insert(0, str(ROOT))
    from bench._rigs import InstantUpstream, free_port, running_daemon, stop_process, wait_http
    from bench.overhead import UPSTREAM_ARGS
    from bench.profile import rig

    rows: list[tuple[str, tuple[float, ...]]] = []
    logs = Path(tempfile.mkdtemp(prefix="blazar-floor-"))
    with InstantUpstream(*UPSTREAM_ARGS, log_dir=logs) as upstream:
        for mode in ("answer", "relay"):
            port = free_port()
            cmd = [sys.executable, "-m", "bench.floor", "--serve", mode, str(port), str(upstream.port)]
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_http(f"http://127.0.0.1:{port}/", timeout_s=30.0, proc=proc)
                url = f"http://127.0.0.1:{port}"
                rows.append(
                    (mode, _measure(url, proc.pid, args.requests, args.streams, streaming=mode == "relay"))
                )
            finally:
                stop_process(proc)
        rig_config = rig()
        with running_daemon(rig_config, tag="floor") as daemon:
            rows.append(("blazar", _measure(daemon.url, daemon.proc.pid, args.requests, args.streams)))
    lines = [
        "CPU of the serving process against the instant upstream, C=16: bare ASGI apps on hypercorn's trio",
        "worker (`answer`: a fixed answer; `relay`: through actors.upstream.UpstreamPool), then the daemon.",
        f"Command: python -m bench.floor --requests {args.requests} --streams {args.streams}",
        f"Run {time.strftime('%Y-%m-%d %H:%M:%S')}.",
        "",
        f"{'server':8s} {'ms per non-stream request':>26s} {'ms per stream event':>20s}"
        f" {'ms per event, C=1, 8 ms apart':>31s}",
    ]
    for name, figures in rows:
        req, event, paced = (*figures, None, None)[:3]
        cells = [
            f"{req:26.3f}",
            f"{event:20.4f}" if event else f"{'-':>20s}",
            f"{paced:31.4f}" if paced else f"{'-':>31s}",
        ]
        lines.append(f"{name:8s} " + " ".join(cells))
    (relay_req, relay_event, relay_paced), (ours_req, ours_event, ours_paced) = rows[1][1], rows[2][1]
    lines += [
        "",
        f"The gateway's own share: {ours_req - relay_req:.3f} ms per request, "
        f"{ours_event - relay_event:.4f} ms per stream event at C=16, "
        f"{ours_paced - relay_paced:.4f} ms per event 8 ms apart.",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{time.strftime('%Y-%m-%d')}-floor.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
