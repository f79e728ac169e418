"""Request facts for the Responses API and for streams that fail midway, end to end with
the instant upstream as the engine: the live card, the ledger's row and ``/metrics``."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from actors.ledger import Flush
from tests.instant import MODEL, Gateway, instant_config, serve_gateway, sse_events

THINKING = "<think>Let me see what to say.</think>Hello there."
INPUT = "Say hello."


async def _ledger_rows(gw: Gateway, trace_id: str) -> list[dict[str, Any]]:
    """The request's ledger records; the gateway writes them once the response is sent."""
    with trio.fail_after(10):
        while True:
            await gw.runtime.ledger.ask(Flush())
            rows = (await gw.client.get("/admin/requests", params={"trace_id": trace_id})).json()["data"]
            if rows:
                return list(rows)
            await trio.sleep(0.01)


async def _ledger_row(gw: Gateway, trace_id: str) -> dict[str, Any]:
    rows = await _ledger_rows(gw, trace_id)
    assert len(rows) == 1, rows
    return rows[0]


async def _samples(gw: Gateway, family: str) -> list[Any]:
    text = (await gw.client.get("/metrics")).text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return list(fams[family].samples) if family in fams else []


def _sum(samples: list[Any], name: str, **labels: str) -> float:
    return sum(
        s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _has_facts(row: dict[str, Any]) -> None:
    assert row["engine"] and row["queue_ms"] is not None and row["load_ms"] is not None, row
    assert row["prompt_tokens"] and row["completion_tokens"], row
    assert row["dialect"] == "openai" and row["model"] == MODEL, row


async def test_responses_have_a_card_and_facts(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--reply", "Hello there, friend.")) as gw:
        for stream in (False, True):
            body = {"model": MODEL, "input": INPUT, "stream": stream}
            r = await gw.client.post("/v1/responses", json=body)
            assert r.status_code == 200, r.text
            trace_id = r.headers["x-blazar-trace-id"]
            if stream:
                doc = next(d for name, d in sse_events(r.content) if name == "response.completed")["response"]
            else:
                doc = r.json()
            row = await _ledger_row(gw, trace_id)
            _has_facts(row)
            assert (row["path"], row["status"], row["blazar_code"]) == ("/v1/responses", 200, None)
            # the ledger counts what the reply says it cost
            assert row["completion_tokens"] == doc["usage"]["output_tokens"]
            assert row["prompt_tokens"] == doc["usage"]["input_tokens"]
            card = (await gw.client.get(f"/v1/requests/{trace_id}")).json()
            assert (card["path"], card["state"], card["model"]) == ("/v1/responses", "done", MODEL)
        out = _sum(
            await _samples(gw, "blazar_completion_tokens"), "blazar_completion_tokens_total", model=MODEL
        )
        assert out == 2 * doc["usage"]["output_tokens"]

        # counting tokens generates nothing: no card
        for path, body in (
            ("/v1/responses/input_tokens", {"model": MODEL, "input": INPUT}),
            ("/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user", "content": INPUT}]}),
        ):
            r = await gw.client.post(path, json=body)
            assert r.status_code == 200, (path, r.text)
            gone = await gw.client.get(f"/v1/requests/{r.headers['x-blazar-trace-id']}")
            assert gone.status_code == 404, path


async def test_a_response_can_be_cancelled_by_its_card(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--interval-ms", "20")) as gw:
        body = {"model": MODEL, "input": INPUT, "stream": True, "max_output_tokens": 1000}
        async with gw.client.stream("POST", "/v1/responses", json=body) as r:
            trace_id = r.headers["x-blazar-trace-id"]
            lines = r.aiter_lines()
            while "output_text.delta" not in await lines.__anext__():
                pass
            ended = await gw.client.post(f"/v1/requests/{trace_id}/cancel")
            assert ended.json()["cancelled"] is True
            rest = "".join([line async for line in lines])
        assert "response.failed" in rest and "response.completed" not in rest
        row = await _ledger_row(gw, trace_id)
        assert row["blazar_code"] == "CLIENT_CLOSED_REQUEST" and row["completion_tokens"] is None


async def test_reasoning_tokens_are_counted(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--reply", THINKING)) as gw:
        for stream in (False, True):
            r = await gw.client.post("/v1/responses", json={"model": MODEL, "input": INPUT, "stream": stream})
            assert r.status_code == 200, r.text
            if stream:
                doc = next(d for name, d in sse_events(r.content) if name == "response.completed")["response"]
            else:
                doc = r.json()
            kinds = [item["type"] for item in doc["output"]]
            assert kinds == ["reasoning", "message"], doc["output"]
            usage = doc["usage"]
            reasoning = usage["output_tokens_details"]["reasoning_tokens"]
            # the thinking's pieces, not the tags' nor the answer's
            assert 0 < reasoning < usage["output_tokens"], usage
    async with serve_gateway(instant_config("--reply", "No thinking here.")) as gw:
        r = await gw.client.post("/v1/responses", json={"model": MODEL, "input": INPUT})
        assert r.json()["usage"]["output_tokens_details"]["reasoning_tokens"] == 0


async def test_background_response_records_its_job(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--reply", "Hello from the background.")) as gw:
        r = await gw.client.post("/v1/responses", json={"model": MODEL, "input": INPUT, "background": True})
        assert r.status_code == 200, r.text
        response_id, trace_id = r.json()["id"], r.headers["x-blazar-trace-id"]
        with trio.fail_after(20):  # the job's events, followed until it has ended
            await gw.client.get(f"/v1/responses/{response_id}", params={"stream": "true"})
        doc = (await gw.client.get(f"/v1/responses/{response_id}")).json()
        assert doc["status"] == "completed", doc
        # the creating request: quick, no engine, no tokens; the job: the facts
        created = await _ledger_row(gw, trace_id)
        assert created["path"] == "/v1/responses" and created["completion_tokens"] is None
        job = await _ledger_row(gw, response_id)
        _has_facts(job)
        assert (job["method"], job["status"], job["blazar_code"]) == ("JOB", 200, None)
        assert job["completion_tokens"] == doc["usage"]["output_tokens"]
        samples = await _samples(gw, "blazar_requests")
        assert _sum(samples, "blazar_requests_total", route="job:/v1/responses", status="200") == 1
        tokens = await _samples(gw, "blazar_completion_tokens")
        assert _sum(tokens, "blazar_completion_tokens_total", model=MODEL) == doc["usage"]["output_tokens"]


def _engine_pid(gw: Gateway) -> int:
    engine = gw.runtime.engine_if_loaded(MODEL)
    assert engine is not None
    pid = engine.statistics().pid
    assert pid is not None
    return pid


async def _killed_midway(gw: Gateway, path: str, body: dict[str, Any], mark: str) -> tuple[str, str]:
    """Stream ``body`` to ``path``, ``kill -9`` the engine after the first ``mark``; the trace
    id and what came after the kill."""
    async with gw.client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        trace_id = r.headers["x-blazar-trace-id"]
        lines = r.aiter_lines()
        while mark not in await lines.__anext__():
            pass
        os.kill(_engine_pid(gw), signal.SIGKILL)
        with trio.fail_after(20):
            rest = "\n".join([line async for line in lines])
    return trace_id, rest


async def test_a_stream_killed_midway_is_recorded_as_failed(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--interval-ms", "20")) as gw:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": INPUT}], "max_tokens": 1000}
        warm = await gw.client.post("/v1/chat/completions", json={**chat, "max_tokens": 1})
        assert warm.status_code == 200, warm.text
        relayed, rest = await _killed_midway(gw, "/v1/chat/completions", {**chat, "stream": True}, "tok")
        assert "ENGINE_CRASHED" in rest and "[DONE]" not in rest
        body = {"model": MODEL, "input": INPUT, "stream": True, "max_output_tokens": 1000}
        translated, rest = await _killed_midway(gw, "/v1/responses", body, "output_text.delta")
        assert "response.failed" in rest and "ENGINE_CRASHED" in rest

        for trace_id, path in ((relayed, "/v1/chat/completions"), (translated, "/v1/responses")):
            row = await _ledger_row(gw, trace_id)
            # the head said 200 and stays so; the code and the scrubbed message say it failed
            assert (row["path"], row["status"], row["blazar_code"]) == (path, 200, "ENGINE_CRASHED"), row
            assert "crashed" in row["error"], row
            samples = await _samples(gw, "blazar_requests")
            assert (
                _sum(samples, "blazar_requests_total", route=path, status="200", code="ENGINE_CRASHED") == 1
            )
        ok = _sum(samples, "blazar_requests_total", route="/v1/chat/completions", code="")
        assert ok == 1  # the warm-up, the one that succeeded


async def test_engine_memory_is_measured(instant_home: Path) -> None:
    async with serve_gateway(instant_config()) as gw:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": INPUT}], "max_tokens": 1}
        r = await gw.client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        samples = await _samples(gw, "blazar_engine_resident_bytes")
        resident = _sum(samples, "blazar_engine_resident_bytes", model=MODEL)
        assert resident > 1024 * 1024  # a Python process holds megabytes
        estimate = _sum(
            await _samples(gw, "blazar_model_memory_bytes"), "blazar_model_memory_bytes", model=MODEL
        )
        assert estimate > 0 and estimate != resident
