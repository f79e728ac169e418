"""A pool behind SMG on loopback: the daemon starts the router (``[[remotes]]`` with ``pool =
"smg"``, ``start = true``) over two llama.cpp engines — the test model's engine, which the daemon
loads and registers itself, and a second engine the test runs, named by its URL.

Requests for the model go to the router and are spread over both engines (the second engine's
own token counter shows its share); ``GET /api/peers`` lists the pool with both workers healthy;
``kill -9`` of the daemon's engine takes it out of the router at once and requests still succeed,
and the engine, loaded again, is registered anew; ``kill -9`` of the daemon takes the router down
with it. Answers are a few tokens: nothing here looks at speed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from actors.pool import NOT_FOUND, find_smg
from tests.support import (
    MODEL,
    ROOT,
    DaemonProc,
    descendants,
    free_port,
    make_home,
    start_daemon,
    wait_gone,
    wait_until,
)

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hello."}]


class Pool:
    def __init__(self, daemon: DaemonProc, engine: subprocess.Popen[bytes], engine_url: str) -> None:
        self.daemon, self.engine, self.engine_url = daemon, engine, engine_url

    def doc(self) -> dict[str, Any]:
        return httpx.get(f"{self.daemon.url}/api/peers", timeout=30).json()

    def workers(self) -> dict[str, dict[str, Any]]:
        """The router's workers by URL, as ``/api/peers`` shows them."""
        peer = next(p for p in self.doc()["peers"] if p["name"] == "replicas")
        return {w["url"]: w for w in (peer["snapshot"] or {}).get("workers") or []}

    def registrations(self) -> dict[str, dict[str, Any]]:
        pool = next(p for p in self.doc()["pools"] if p["name"] == "replicas")
        return {r["worker"]: r for r in pool["registrations"]}

    def healthy(self) -> list[str]:
        return sorted(u for u, w in self.workers().items() if w["healthy"] and w["status"] == "ready")

    def predicted_there(self) -> int:
        """Tokens the test's own engine has generated (its Prometheus counter)."""
        text = httpx.get(f"{self.engine_url}/metrics", timeout=10).text
        found = re.search(r"^llamacpp:tokens_predicted_total\s+(\S+)", text, re.M)
        assert found is not None, text[:500]
        return int(float(found.group(1)))

    def chat(self, n: int) -> int:
        """``n`` chat requests through the daemon; the tokens their answers had."""
        client = openai.OpenAI(base_url=f"{self.daemon.url}/v1", api_key="none", max_retries=0, timeout=60)
        tokens = 0
        for i in range(n):
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": f"Count to {i + 2}."}], max_tokens=3
            )
            assert raw.headers["x-blazar-peer"] == "replicas"
            answer = raw.parse()
            assert answer.choices[0].message.content
            assert answer.usage is not None
            tokens += answer.usage.completion_tokens
        return tokens


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Pool]:
    smg = find_smg(None)
    assert smg is not None, f"{NOT_FOUND} (make install puts it in .venv from requirements/dev.txt)"
    root = tmp_path_factory.mktemp("pool")
    port = free_port()
    engine = subprocess.Popen(
        [
            *(sys.executable, "-m", "actors.engines.llamacpp_host", "-m", str(model_path)),
            *("--port", str(port), "-a", MODEL, "-c", "1024", "-np", "1", "--metrics"),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,  # closed when this process ends: the host exits with it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    engine_url = f"http://127.0.0.1:{port}"
    home = make_home(
        root / "home",
        model_path,
        config=f"""
[models."{MODEL}"]
slots = 1
ctx = 1024

[[remotes]]
name = "replicas"
pool = "smg"
start = true
policy = "round_robin"
health_check_s = 1
workers = ["{MODEL}", "{engine_url}"]
poll_s = 0.5
poll_max_s = 1
""",
    )
    daemon = start_daemon(home)
    p = Pool(daemon, engine, engine_url)
    try:
        wait_until(lambda: len(p.healthy()) == 2, timeout_s=120, what="both workers healthy in the router")
        yield p
    finally:
        daemon.stop()
        engine.kill()
        engine.wait()


def test_requests_are_spread_over_both_engines(pool: Pool) -> None:
    before = pool.predicted_there()
    tokens = pool.chat(6)
    there = pool.predicted_there() - before
    assert 0 < there < tokens, f"the test's engine made {there} of the {tokens} tokens: not spread over both"


def test_peers_show_the_pool_with_its_workers(pool: Pool) -> None:
    doc = pool.doc()
    peer = next(p for p in doc["peers"] if p["name"] == "replicas")
    assert peer["pool"] == "smg" and peer["state"] == "up" and peer["kind"] == "openai"
    assert [m["name"] for m in peer["snapshot"]["installed"]] == [MODEL]
    workers = pool.workers()
    assert pool.engine_url in workers and len(workers) == 2
    assert all(w["healthy"] and w["model"] == MODEL for w in workers.values())
    (entry,) = doc["pools"]
    assert entry["router"] == "smg" and entry["models"] == [MODEL]
    assert entry["started"]["state"] == "ready" and entry["started"]["pid"]
    regs = pool.registrations()
    assert regs[MODEL]["state"] == "registered" and regs[MODEL]["url"] in workers
    assert regs[pool.engine_url]["state"] == "registered"
    listing = pool.daemon.cli("peers").stdout
    assert "pool (smg)" in listing and "2/2 workers healthy" in listing and pool.engine_url in listing
    # the console's read model, which its Engines view draws: the pool, its workers, its router
    snapshot = httpx.get(f"{pool.daemon.url}/api/console/snapshot", timeout=30).json()
    shown = next(p for p in snapshot["peers"] if p["name"] == "replicas")
    assert shown["pool"] == "smg" and shown["router"]["state"] == "ready"
    assert {w["url"] for w in shown["workers"]} == set(workers) and all(
        w["healthy"] for w in shown["workers"]
    )
    assert {r["worker"] for r in shown["registrations"]} == {MODEL, pool.engine_url}


def test_an_engine_killed_is_taken_out_and_requests_still_succeed(pool: Pool) -> None:
    (engine,) = [e for e in pool.daemon.engines() if e["model"] == MODEL]
    old_url = pool.registrations()[MODEL]["url"]
    os.kill(int(str(engine["pid"])), signal.SIGKILL)
    wait_until(
        lambda: old_url not in pool.healthy() and pool.registrations()[MODEL]["url"] != old_url,
        timeout_s=20,
        what="the killed engine taken out of the router",
    )
    assert pool.chat(3) > 0
    # loaded again (the pool holds its workers loaded) and registered on its new port
    wait_until(
        lambda: len(pool.healthy()) == 2 and old_url not in pool.healthy(),
        timeout_s=60,
        what="the engine back in the router",
    )


def test_the_router_dies_with_the_daemon(pool: Pool) -> None:
    (entry,) = pool.doc()["pools"]
    watchdog = int(entry["started"]["pid"])
    router = [watchdog, *descendants(watchdog)]
    assert len(router) >= 2, "the router runs under the watchdog"
    pool.daemon.proc.send_signal(signal.SIGKILL)
    pool.daemon.proc.wait()
    assert wait_gone(router, timeout_s=15) == [], "the router outlived the daemon"
