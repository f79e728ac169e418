"""What a request cost, told by the daemon: ``X-Blazar-Queue-Ms`` and ``X-Blazar-Overhead-Ms`` on
every inference answer of every dialect, the gateway's overhead in the ledger, and the per-phase
histograms of ``/metrics`` — end to end, with the instant upstream as the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from actors.ledger import Flush
from tests.instant import MODEL, Gateway, instant_config, serve_gateway

MESSAGES = [{"role": "user", "content": "Say hello."}]

GENERATING: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": MESSAGES}),
    ("/v1/completions", {"prompt": "Say hello."}),
    ("/v1/messages", {"messages": MESSAGES, "max_tokens": 16}),
    ("/v1/responses", {"input": "Say hello."}),
    ("/api/chat", {"messages": MESSAGES}),
    ("/api/generate", {"prompt": "Say hello."}),
]
EMBEDDING: list[tuple[str, dict[str, Any]]] = [
    ("/v1/embeddings", {"input": "hello"}),
    ("/api/embed", {"input": "hello"}),
]


def _cost(headers: Any) -> tuple[float, float]:
    return float(headers["x-blazar-queue-ms"]), float(headers["x-blazar-overhead-ms"])


def _sane(path: str, headers: Any) -> float:
    queue, overhead = _cost(headers)
    assert queue >= 0, (path, queue)
    # the gateway's own time: more than nothing, far less than a second on loopback
    assert 0 < overhead < 500, (path, overhead)
    return overhead


async def _row(gw: Gateway, trace_id: str) -> dict[str, Any]:
    with trio.fail_after(10):
        while True:
            await gw.runtime.ledger.ask(Flush())
            rows = (await gw.client.get("/admin/requests", params={"trace_id": trace_id})).json()["data"]
            if rows:
                return dict(rows[0])
            await trio.sleep(0.01)


async def test_every_dialect_says_what_a_request_cost(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--reply", "Hello there.")) as gw:
        # The first request of a model has its engine planned (its header read, fitted to
        # memory): the gateway's own work, once. Its load is the engine's.
        r = await gw.client.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES})
        assert _cost(r.headers)[1] > 0 and r.headers["x-blazar-status"] == "loading"
        for path, extra in GENERATING:
            for stream in (False, True):
                body = {"model": MODEL, "stream": stream, **extra}
                r = await gw.client.post(path, json=body)
                assert r.status_code == 200, (path, stream, r.text)
                assert (r.headers.get("x-accel-buffering") == "no") is stream, (path, stream)
                _sane(path, r.headers)
                row = await _row(gw, r.headers["x-blazar-trace-id"])
                # the ledger keeps the whole figure: never less than what the head said
                assert row["overhead_ms"] is not None and row["overhead_ms"] > 0, row
                assert row["overhead_ms"] < row["duration_ms"], row
                # and so does the request's card, which its own key may read after a stream
                card = (await gw.client.get(f"/v1/requests/{r.headers['x-blazar-trace-id']}")).json()
                assert card["overhead_ms"] == pytest.approx(row["overhead_ms"], abs=0.01), (card, row)
                assert card["queue_ms"] == pytest.approx(row["queue_ms"], abs=0.01), (card, row)
        # the first asks for the engine again with embeddings on: that restart is a load, not overhead
        for path, extra in EMBEDDING:
            r = await gw.client.post(path, json={"model": MODEL, **extra})
            assert r.status_code == 200, (path, r.text)
            _sane(path, r.headers)

        # a refusal is an answer of an inference route too: nothing queued, the gateway's time
        nothing = {"model": "no-such-model", "messages": MESSAGES}
        r = await gw.client.post("/v1/chat/completions", json=nothing)
        assert r.status_code == 404, r.text
        assert _cost(r.headers)[0] == 0 and _cost(r.headers)[1] > 0
        # a browser page may read them
        r = await gw.client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": MESSAGES},
            headers={"origin": "http://localhost:3000"},
        )
        exposed = r.headers.get("access-control-expose-headers", "").lower()
        assert "x-blazar-overhead-ms" in exposed and "x-blazar-queue-ms" in exposed, exposed

        # not an inference route: no cost headers
        r = await gw.client.get("/v1/models")
        assert "x-blazar-overhead-ms" not in r.headers


async def test_the_queue_wait_is_told_in_the_head(instant_home: Path) -> None:
    """With one slot, a second request waits for the first: its head says how long."""
    async with serve_gateway(instant_config("--chunks", "8", "--interval-ms", "60", slots=1)) as gw:
        body = {"model": MODEL, "messages": MESSAGES}
        await gw.client.post("/v1/chat/completions", json=body)  # the engine is loaded
        heads: list[Any] = []

        async def ask() -> None:
            r = await gw.client.post("/v1/chat/completions", json={**body, "stream": True})
            heads.append(r.headers)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            await trio.sleep(0.1)
            nursery.start_soon(ask)
        queues = sorted(_cost(h)[0] for h in heads)
        assert queues[0] < 50 and queues[1] > 200, queues
        assert all(0 < _cost(h)[1] < 500 for h in heads), heads


def _hist(text: str, family: str, model: str) -> tuple[float, float]:
    """A histogram's count and sum for ``model``."""
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    count = total = 0.0
    for s in fams[family].samples if family in fams else []:
        if s.labels.get("model") == model:
            if s.name == f"{family}_count":
                count = s.value
            elif s.name == f"{family}_sum":
                total = s.value
    return count, total


async def test_metrics_have_a_histogram_per_phase(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--reply", "Hello there.")) as gw:
        before = (await gw.client.get("/metrics")).text
        assert "# TYPE blazar_overhead_seconds histogram" in before
        for family in ("blazar_prefill_seconds", "blazar_decode_seconds", "blazar_tool_seconds"):
            assert f"# TYPE {family} histogram" in before, family
        for stream in (False, True, False):
            r = await gw.client.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "stream": stream}
            )
            assert r.status_code == 200
        after = (await gw.client.get("/metrics")).text
        count, total = _hist(after, "blazar_overhead_seconds", MODEL)
        assert count == 3 and 0 < total < 1.5, (count, total)
        assert _hist(after, "blazar_queue_wait_seconds", MODEL)[0] == 3
