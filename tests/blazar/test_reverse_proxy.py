"""Streams through a real reverse proxy: Debian's nginx in front of the gateway with nothing but
``proxy_pass`` (its buffering on, as it ships), the engine the instant upstream paced slowly.
Every stream says ``X-Accel-Buffering: no``, so each event reaches the client as the engine
sends it, not when the answer ends. ``make nginx`` installs nginx; without it these tests fail
saying so."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import pytest
import trio

from tests.instant import MODEL, Gateway, instant_config, serve_gateway
from tests.support import free_port

pytestmark = pytest.mark.slow  # a real nginx, paced streams: the full suite's tier

INTERVAL_MS = 150
CHUNKS = 8
"""The engine sends a chunk every 150 ms: a stream lasts about 1.2 s."""


def _nginx() -> str:
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if found is None:
        pytest.fail("nginx is not installed: run `make nginx` (scripts/setup-nginx.sh)")
    return found


def _config(tmp: Path, listen: int, upstream: str) -> str:
    """Every path nginx writes under ``tmp``; in the foreground; the proxy as Debian ships it."""
    temps = "\n".join(
        f"    {kind}_temp_path {tmp / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    user = "user root;\n" if os.geteuid() == 0 else ""  # as root, workers would run as nobody
    return f"""{user}daemon off;
worker_processes 1;
pid {tmp / "nginx.pid"};
error_log {tmp / "error.log"} warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
{temps}
    server {{
        listen 127.0.0.1:{listen};
        location / {{
            proxy_pass {upstream};
        }}
    }}
}}
"""


@contextmanager
def _proxy(tmp: Path, upstream: str) -> Iterator[str]:
    """nginx in front of ``upstream``, as a child process; its base URL."""
    binary = _nginx()
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(_config(tmp, port, upstream))
    proc = subprocess.Popen(
        [binary, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@asynccontextmanager
async def _behind_nginx(tmp: Path) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    config = instant_config("--chunks", str(CHUNKS), "--interval-ms", str(INTERVAL_MS))
    async with serve_gateway(config) as gw:
        with _proxy(tmp, str(gw.client.base_url).rstrip("/")) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                with trio.fail_after(10):  # nginx takes a moment to listen
                    while True:
                        try:
                            if (await client.get("/health")).status_code < 500:
                                break
                        except httpx.TransportError:
                            pass
                        await trio.sleep(0.05)
                # the engine is loaded before any stream is timed
                await gw.client.post(
                    "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1}
                )
                yield gw, client


async def _first_and_last(
    client: httpx.AsyncClient, path: str, body: dict[str, object]
) -> tuple[float, float]:
    """Seconds from sending to the first line with an event, and to the stream's end."""
    start = trio.current_time()
    first: float | None = None
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, await r.aread()
        assert "x-accel-buffering" not in r.headers  # nginx read it, and keeps it to itself
        async for line in r.aiter_lines():
            if first is None and line.strip() and not line.startswith(":"):
                first = trio.current_time() - start
    assert first is not None
    return first, trio.current_time() - start


STREAMED: list[tuple[str, dict[str, object]]] = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/api/chat", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}),
]
"""One route per stream framing: relayed SSE, NDJSON, translated SSE."""


async def test_the_first_event_passes_nginx_as_soon_as_the_engine_sends_it(
    instant_home: Path, tmp_path: Path
) -> None:
    total_s = CHUNKS * INTERVAL_MS / 1000
    async with _behind_nginx(tmp_path) as (_gw, client):
        for path, body in STREAMED:
            first, last = await _first_and_last(client, path, {"model": MODEL, "stream": True, **body})
            # the stream took as long as the engine paced it, and its first event came with the
            # engine's first chunk, not held until the end as a buffering proxy holds it
            assert last > total_s * 0.8, (path, first, last)
            assert first < total_s * 0.4, (path, first, last)


def _unbuffered(r: httpx.Response) -> None:
    assert r.status_code == 200, r.text
    assert r.headers.get("x-accel-buffering") == "no", (str(r.url), r.headers)
    assert r.headers.get("cache-control") == "no-cache", (str(r.url), r.headers)


async def test_every_kind_of_stream_tells_proxies_not_to_buffer(instant_home: Path) -> None:
    """The inference routes' streams are checked in test_request_cost.py; here the others: a
    background response's stream and its replay, a job's events, a resumable stream's replay."""
    async with serve_gateway(instant_config("--reply", "Hello from the job.")) as gw:
        with trio.fail_after(30):
            body = {"model": MODEL, "input": "Hi", "max_output_tokens": 8, "background": True, "stream": True}
            r = await gw.client.post("/v1/responses", json=body)
            _unbuffered(r)
            response_id = next(line for line in r.text.splitlines() if '"id":"resp' in line)
            response_id = response_id.split('"id":"', 1)[1].split('"', 1)[0]
            _unbuffered(await gw.client.get(f"/v1/responses/{response_id}", params={"stream": "true"}))
            jobs = (await gw.client.get("/v1/jobs")).json()["data"]
            assert jobs, "the background response is a job"
            _unbuffered(
                await gw.client.get(
                    f"/v1/jobs/{jobs[0]['id']}/events", headers={"accept": "text/event-stream"}
                )
            )
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
            r = await gw.client.post("/v1/chat/completions", json=chat, headers={"x-blazar-resumable": "on"})
            _unbuffered(r)
            stream_id = r.headers["x-blazar-stream-id"]
            _unbuffered(await gw.client.get("/v1/stream", params={"id": stream_id}))
