"""The floor under the gateway's CPU figures: the daemon's data plane with nothing in it.

    python -m bench.floor [--requests 4000] [--streams 1200]

Measures, against the instant upstream and with the overhead benchmark's load (C=16,
non-stream, and streams of 34 events), the CPU of two bare relays and of the daemon, one
after the other:

* ``pipe``: a TCP proxy in plain Python (one epoll, no event loop library, no HTTP
  parsing): each client connection gets its own upstream connection, and whatever
  arrives on one side is written to the other. One read and one write per arrival is
  what any relay in Python pays at least: the floor under every figure here.
* ``stack``: the daemon's own data plane without the gateway: its HTTP/1.1 server
  (``blazar.web.asgi.h1``), its upstream client (``actors.upstream.UpstreamPool``) and
  its pump (``blazar.web.asgi.pump``, through ``direct.BodyWriter.pipe``) under an ASGI
  app that relays every request and does nothing else;
* ``blazar``: the daemon itself on the same rig.

The gateway's own cost is the daemon's figure minus ``stack``'s; what trio, the server
and the pump add to the syscalls is ``stack`` minus ``pipe``. Two more columns pace the
events: one stream at a time with its events 8 ms apart, like a small model on a CPU (a
process woken from sleep for every event costs several times more CPU per event than one
kept busy), and 256 streams at once with their events 10 ms apart (the scale rig's
pace). Writes ``bench/results/<date>-floor.txt``; BENCHMARK.md cites it.
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
WIDE = 256
"""Streams at once in the last column."""


def _serve_pipe(port: int, upstream_port: int) -> None:
    """The child: the TCP proxy (see the module). Writes block: the load generator reads
    everything it is sent, so a write never waits long, and the floor pays no bookkeeping
    for a partial one."""
    import select
    import socket

    listener = socket.create_server(("127.0.0.1", port), backlog=1024)
    listener.setblocking(False)
    epoll = select.epoll()
    epoll.register(listener.fileno(), select.EPOLLIN)
    peer: dict[int, socket.socket] = {}
    own: dict[int, socket.socket] = {}
    while True:
        for fd, _events in epoll.poll():
            if fd == listener.fileno():
                client, _ = listener.accept()
                upstream = socket.create_connection(("127.0.0.1", upstream_port))
                for sock in (client, upstream):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    own[sock.fileno()] = sock
                    epoll.register(sock.fileno(), select.EPOLLIN)
                peer[client.fileno()], peer[upstream.fileno()] = upstream, client
                continue
            data = own[fd].recv(65536)
            if data:
                peer[fd].sendall(data)
                continue
            other = peer.pop(fd)
            del peer[other.fileno()]
            for sock in (own.pop(fd), own.pop(other.fileno())):
                epoll.unregister(sock.fileno())
                sock.close()


def _serve_stack(port: int, upstream_port: int) -> None:
    """The child: the daemon's HTTP/1.1 server, upstream client and pump, relaying."""
    import trio

    from actors.upstream import UpstreamPool
    from blazar.web.asgi.direct import DIRECT_BODY
    from blazar.web.asgi.h1 import H1Connection

    def refusal(status: int) -> bytes:
        return b"HTTP/1.1 %d Refused\r\ncontent-length: 0\r\nconnection: close\r\n\r\n" % status

    async def main() -> None:
        pool = UpstreamPool("127.0.0.1", upstream_port, headers={}, max_idle=WIDE, idle_expiry_s=30.0)
        json_type = {"content-type": "application/json"}

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            parts = []
            while True:
                message = await receive()
                parts.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            upstream = await pool.request("POST", scope["path"], body=b"".join(parts), headers=json_type)
            kind = upstream.header(b"content-type") or b"application/json"
            if kind != b"text/event-stream":
                data = await upstream.aread()
                headers = [(b"content-type", kind), (b"content-length", b"%d" % len(data))]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": data})
                return
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
            # As the gateway does: the first chunk through the connection, the rest by the pump.
            first = await upstream.receive_some()
            await send({"type": "http.response.body", "body": first, "more_body": True})
            if first and not await scope["extensions"][DIRECT_BODY].pipe(upstream, lambda _: None):
                raise RuntimeError("the pump did not take the stream")
            while chunk := await upstream.receive_some():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

        async def connection(stream: trio.SocketStream) -> None:
            served = H1Connection(
                stream.socket,
                app,
                header_timeout_s=30.0,
                keep_alive_timeout_s=60.0,
                max_head=65536,
                refusal=refusal,
                state={},
                on_busy=lambda _busy: None,
            )
            await served.run()

        await trio.serve_tcp(connection, port, host="127.0.0.1", backlog=1024)

    trio.run(main)


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(url: str, pid: int, requests: int, streams: int) -> tuple[float, ...]:
    """CPU ms of process ``pid`` per non-stream request and per stream event at C=16, per
    stream event at C=1 with the events 8 ms apart (the pace of a small model on a CPU),
    and per stream event with ``WIDE`` streams at once, their events 10 ms apart."""
    from bench._rigs import LoadGen
    from bench._workloads import job

    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}]}
    plain = [{"path": "/v1/chat/completions", "body": body}]
    stream = [{"path": "/v1/chat/completions", "body": {**body, "stream": True}}]
    paced = [{"path": "/v1/chat/completions", "body": {**body, "stream": True, "bench_interval_ms": 8.0}}]
    wide = [{"path": "/v1/chat/completions", "body": {**body, "stream": True, "bench_interval_ms": 10.0}}]
    paced_streams = max(1, streams // 60)
    wide_streams = max(WIDE, streams // WIDE * WIDE)
    gen = LoadGen()
    marks = []
    try:
        # Warm-ups no longer than the measured runs: a smoke run's few requests need few
        gen.run(job(url, plain, concurrency=16, count=min(300, requests)))
        marks.append(_cpu(pid))
        gen.run(job(url, plain, concurrency=16, count=requests))
        marks.append(_cpu(pid))
        gen.run(job(url, stream, concurrency=16, count=min(50, streams)))
        marks.append(_cpu(pid))
        gen.run(job(url, stream, concurrency=16, count=streams))
        marks.append(_cpu(pid))
        gen.run(job(url, paced, concurrency=1, count=paced_streams))
        marks.append(_cpu(pid))
        gen.run(job(url, wide, concurrency=WIDE, count=wide_streams))
        marks.append(_cpu(pid))
    finally:
        gen.close()

    def per_event_ms(seconds: float, n_streams: int) -> float:
        return seconds / (n_streams * EVENTS_PER_STREAM) * 1000

    return (
        (marks[1] - marks[0]) / requests * 1000,
        per_event_ms(marks[3] - marks[2], streams),
        per_event_ms(marks[4] - marks[3], paced_streams),
        per_event_ms(marks[5] - marks[4], wide_streams),
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--streams", type=int, default=1200)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the result goes")
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)  # internal: MODE PORT UPSTREAM_PORT
    args = parser.parse_args()
    if args.serve:
        serve = {"pipe": _serve_pipe, "stack": _serve_stack}[args.serve[0]]
        serve(int(args.serve[1]), int(args.serve[2]))
        return 0

    sys.path.insert(0, str(ROOT))
    from bench._rigs import InstantUpstream, free_port, running_daemon, stop_process, wait_http
    from bench.overhead import UPSTREAM_ARGS
    from bench.profile import rig

    rows: list[tuple[str, tuple[float, ...]]] = []
    logs = Path(tempfile.mkdtemp(prefix="blazar-floor-"))
    with InstantUpstream(*UPSTREAM_ARGS, "-np", str(WIDE), log_dir=logs) as upstream:
        for mode in ("pipe", "stack"):
            port = free_port()
            cmd = [sys.executable, "-m", "bench.floor", "--serve", mode, str(port), str(upstream.port)]
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_http(f"http://127.0.0.1:{port}/health", timeout_s=30.0, proc=proc)
                url = f"http://127.0.0.1:{port}"
                rows.append((mode, _measure(url, proc.pid, args.requests, args.streams)))
            finally:
                stop_process(proc)
        with running_daemon(rig(slots=WIDE), tag="floor") as daemon:
            rows.append(("blazar", _measure(daemon.url, daemon.proc.pid, args.requests, args.streams)))
    lines = [
        "CPU of the serving process against the instant upstream: a TCP proxy in plain Python",
        "(`pipe`), the daemon's HTTP/1.1 server, upstream client and pump relaying with no gateway",
        "(`stack`), then the daemon.",
        f"Command: python -m bench.floor --requests {args.requests} --streams {args.streams}",
        f"Run {time.strftime('%Y-%m-%d %H:%M:%S')}; {_machine()}.",
        "",
        f"{'server':8s} {'ms/request, C=16':>17s} {'ms/event, C=16':>15s}"
        f" {'ms/event, C=1, 8 ms apart':>26s} {f'ms/event, {WIDE} streams, 10 ms apart':>36s}",
    ]
    widths = (17, 15, 26, 36)
    for name, figures in rows:
        lines.append(f"{name:8s} " + " ".join(f"{v:{w}.4f}" for v, w in zip(figures, widths, strict=True)))
    pipe, stack, ours = (figures for _name, figures in rows)
    lines += [
        "",
        "The gateway's own share (blazar - stack): "
        + ", ".join(f"{b - a:.4f}" for a, b in zip(stack, ours, strict=True))
        + " ms, column by column.",
        "What trio, the server and the pump add to the syscalls (stack - pipe): "
        + ", ".join(f"{b - a:.4f}" for a, b in zip(pipe, stack, strict=True))
        + " ms.",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{time.strftime('%Y-%m-%d')}-floor.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _machine() -> str:
    from bench._system import machine_info

    info = machine_info()
    return f"{info['cpu_model']}, {info['cpus_usable']} cores usable"


if __name__ == "__main__":
    sys.exit(main())
