"""The relayed OpenAI routes end to end, with the instant upstream as the engine.

What the engine sends is what the client gets, byte for byte; the request is
admitted, counted and released on the way, and the ledger records it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

from actors.ledger import Flush
from tests.instant import MODEL, Gateway, instant_config, serve_gateway, sse_events

REPLY = "Grüße aus Zürich — 東京, ✓ done."
MESSAGES = [{"role": "user", "content": "Say hello."}]


def _body(path: str, **extra: Any) -> dict[str, Any]:
    if path == "/v1/chat/completions":
        return {"model": MODEL, "messages": MESSAGES, **extra}
    return {"model": MODEL, "prompt": "Say hello.", **extra}


def _text(path: str, choice: dict[str, Any], *, stream: bool) -> str:
    if path == "/v1/completions":
        return str(choice["text"])
    part = choice["delta"] if stream else choice["message"]
    return str(part.get("content") or "")


async def _direct(gw: Gateway, path: str, body: bytes) -> bytes:
    """The same request sent straight to the engine child, past the gateway."""
    engine = gw.runtime.engine_if_loaded(MODEL)
    assert engine is not None
    handle = engine.ready_handle()
    assert handle is not None
    resp = await handle.client.post(path, content=body, headers={"Content-Type": "application/json"})
    return resp.content


async def _ledger_row(gw: Gateway, trace_id: str) -> dict[str, Any]:
    """The request's ledger record; the gateway writes it once the response is sent."""
    for _ in range(200):
        await gw.runtime.ledger.ask(Flush())
        rows = (await gw.client.get("/admin/requests", params={"trace_id": trace_id})).json()["data"]
        if rows:
            assert len(rows) == 1, rows
            return rows[0]
        await trio.sleep(0.01)
    raise AssertionError(f"no ledger record for {trace_id}")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_relayed_answers_are_the_engines_bytes(instant_home: Path, path: str) -> None:
    plain = msgspec.json.encode(_body(path))
    streamed = msgspec.json.encode(_body(path, stream=True, stream_options={"include_usage": True}))
    json_headers = {"Content-Type": "application/json"}
    async with serve_gateway(instant_config("--reply", REPLY)) as gw:
        r = await gw.client.post(path, content=plain, headers=json_headers)
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
        assert r.headers["x-blazar-status"] == "loading"  # this request started the engine
        doc = r.json()
        assert doc["model"] == MODEL
        [choice] = doc["choices"]
        assert _text(path, choice, stream=False) == REPLY and choice["finish_reason"] == "stop"
        usage = doc["usage"]
        assert usage["completion_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert r.content == await _direct(gw, path, plain)

        row = await _ledger_row(gw, r.headers["x-blazar-trace-id"])
        assert (row["status"], row["model"], row["path"]) == (200, MODEL, path)
        assert row["bytes_out"] == len(r.content)

        r = await gw.client.post(path, content=streamed, headers=json_headers)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert "x-blazar-status" not in r.headers  # the engine was ready
        events = [data for _, data in sse_events(r.content)]
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert all(c["model"] == MODEL for c in chunks)
        text = "".join(_text(path, c["choices"][0], stream=True) for c in chunks if c["choices"])
        assert text == REPLY
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
        if path == "/v1/chat/completions":  # llama.cpp sends usage on chat streams only
            [usage_chunk] = [c for c in chunks if c.get("usage")]
            assert usage_chunk["usage"]["completion_tokens"] == usage["completion_tokens"]
        assert r.content == await _direct(gw, path, streamed)

        row = await _ledger_row(gw, r.headers["x-blazar-trace-id"])
        assert row["status"] == 200 and row["bytes_out"] == len(r.content)
        assert row["ttft_ms"] is not None


async def _queue(client: httpx.AsyncClient) -> dict[str, Any]:
    stats = (await client.get("/admin/engines")).json()
    [queue] = [q for q in stats["admission"]["queues"] if q["model"] == MODEL]
    return queue


async def test_one_slot_queues_the_second_request_and_a_cancelled_stream_frees_it(
    instant_home: Path,
) -> None:
    # The engine paces stream chunks 10 ms apart: this stream would take 20 s to finish.
    slow = _body("/v1/chat/completions", stream=True, max_tokens=2000)
    quick = _body("/v1/chat/completions", max_tokens=3)  # not a stream: answered at once
    config = instant_config("--interval-ms", "10", slots=1)
    async with serve_gateway(config) as gw, trio.open_nursery() as nursery:
        client = gw.client
        answered = trio.Event()
        second: dict[str, Any] = {}

        async def ask_second() -> None:
            second["response"] = await client.post("/v1/chat/completions", json=quick)
            second["at"] = trio.current_time()
            answered.set()

        with trio.fail_after(10):
            async with client.stream("POST", "/v1/chat/completions", json=slow) as first:
                assert first.status_code == 200
                chunks = first.aiter_raw()  # held: a dropped iterator would close the stream
                await chunks.__anext__()  # generating: it holds the only slot
                nursery.start_soon(ask_second)
                for _ in range(500):  # the statistics a client sees, polled
                    queue = await _queue(client)
                    if queue["queued"]:
                        break
                    await trio.sleep(0.01)
                assert (queue["capacity"], queue["running"], queue["queued"]) == (1, 1, 1)
                [card] = (await client.get("/v1/requests", params={"state": "queued"})).json()["data"]
                assert card["queue_position"] == 1 and card["model"] == MODEL
                await trio.sleep(0.1)
                assert not answered.is_set()  # still waiting behind the stream
                closed_at = trio.current_time()
            # Leaving the block closed the first stream midway: its slot is free at once.
            await answered.wait()
        assert second["at"] - closed_at < 1.0
        r = second["response"]
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        queue = await _queue(client)
        assert (queue["running"], queue["queued"]) == (0, 0)
        stats = (await client.get("/admin/engines")).json()
        assert stats["admission"]["granted"] == 2 and stats["admission"]["withdrawn"] == 0
        [engine] = stats["engines"]
        assert engine["in_flight"] == 0 and engine["state"] == "ready"
