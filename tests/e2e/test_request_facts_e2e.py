"""Request facts with the real engine and the official ``openai`` client: what the Responses
API cost lands in the ledger and in ``/metrics``, and a stream whose engine is killed
midway (``kill -9``) is recorded as failed."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import MODEL, DaemonProc

pytestmark = pytest.mark.slow


def _client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _row(daemon: DaemonProc, trace_id: str) -> dict[str, Any]:
    """The request's ledger row, written just after its reply was sent."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        rows = httpx.get(f"{daemon.url}/admin/requests", params={"trace_id": trace_id}).json()["data"]
        if rows:
            assert len(rows) == 1, rows
            return dict(rows[0])
        time.sleep(0.05)
    raise AssertionError(f"no ledger row for {trace_id}")


def _value(daemon: DaemonProc, family: str, sample: str, **labels: str) -> float:
    text = httpx.get(f"{daemon.url}/metrics", timeout=30).text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    if family not in fams:
        return 0.0
    return sum(
        s.value
        for s in fams[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_responses_tokens_reach_the_ledger_and_metrics(daemon: DaemonProc) -> None:
    client = _client(daemon)
    before = _value(daemon, "blazar_completion_tokens", "blazar_completion_tokens_total", model=MODEL)
    raw = client.responses.with_raw_response.create(model=MODEL, input="Say hi.", max_output_tokens=8)
    resp = raw.parse()
    usage = resp.usage
    assert usage is not None and usage.output_tokens > 0
    row = _row(daemon, raw.headers["x-blazar-trace-id"])
    assert (row["path"], row["status"], row["dialect"]) == ("/v1/responses", 200, "openai")
    assert row["engine"] and row["engine"].startswith("llamacpp"), row
    assert row["prompt_tokens"] == usage.input_tokens and row["completion_tokens"] == usage.output_tokens
    assert row["decode_ms"] is not None and row["prefill_ms"] is not None and row["queue_ms"] is not None

    events = list(
        client.responses.create(model=MODEL, input="Count to five.", max_output_tokens=8, stream=True)
    )
    assert events[-1].type in ("response.completed", "response.incomplete")
    final = events[-1].response  # type: ignore[union-attr]
    assert final.usage is not None and final.usage.output_tokens > 0
    after = _value(daemon, "blazar_completion_tokens", "blazar_completion_tokens_total", model=MODEL)
    assert after - before == usage.output_tokens + final.usage.output_tokens
    ok = _value(
        daemon, "blazar_requests", "blazar_requests_total", route="/v1/responses", status="200", code=""
    )
    assert ok == 2
    assert _value(daemon, "blazar_engine_resident_bytes", "blazar_engine_resident_bytes", model=MODEL) > 0


def test_engine_killed_midway_is_a_failed_request(daemon: DaemonProc) -> None:
    client = _client(daemon)
    client.responses.create(model=MODEL, input="Hi.", max_output_tokens=2)  # the engine is up
    pid = daemon.engines()[0]["pid"]
    assert isinstance(pid, int)
    failed_before = _value(
        daemon, "blazar_requests", "blazar_requests_total", route="/v1/responses", code="ENGINE_CRASHED"
    )
    events: list[str] = []
    with client.responses.with_streaming_response.create(
        model=MODEL, input="Write a long story about a dragon.", max_output_tokens=2000, stream=True
    ) as raw:
        trace_id = raw.headers["x-blazar-trace-id"]
        for line in raw.iter_lines():
            events.append(line)
            if sum("output_text.delta" in e for e in events) == 3:
                os.kill(pid, signal.SIGKILL)
    assert any("response.failed" in e for e in events)
    assert any("ENGINE_CRASHED" in e for e in events)
    row = _row(daemon, trace_id)
    # the head said 200 and was sent: the row keeps it, with the code and the scrubbed cause
    assert (row["status"], row["blazar_code"]) == (200, "ENGINE_CRASHED"), row
    assert row["error"] and "crashed" in row["error"]
    failed = _value(
        daemon,
        "blazar_requests",
        "blazar_requests_total",
        route="/v1/responses",
        status="200",
        code="ENGINE_CRASHED",
    )
    assert failed == failed_before + 1
    card = httpx.get(f"{daemon.url}/v1/requests/{trace_id}").json()
    assert (card["state"], card["status"], card["code"]) == ("failed", 200, "ENGINE_CRASHED"), card
    # the next request starts the engine again
    again = client.responses.create(model=MODEL, input="Hi.", max_output_tokens=2)
    assert again.usage is not None and again.usage.output_tokens > 0


def _stream_story(daemon: DaemonProc, on_third: Any) -> tuple[str, list[str]]:
    """Stream a long chat answer; call ``on_third()`` once three deltas have arrived."""
    lines: list[str] = []
    with _client(daemon).chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_tokens=200,
        stream=True,
    ) as raw:
        trace_id = raw.headers["x-blazar-trace-id"]
        for line in raw.iter_lines():
            lines.append(line)
            if sum('"delta"' in e for e in lines) == 3:
                on_third()
    return trace_id, [e for e in lines if e]


def test_an_unload_midway_is_a_stop_not_a_crash(daemon: DaemonProc) -> None:
    """The operator's unload while a stream runs ends it with ENGINE_STOPPED, never a crash;
    the card says how it ended."""
    _client(daemon).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi."}], max_tokens=2
    )
    unloads: list[httpx.Response] = []

    def unload() -> None:
        def run() -> None:
            unloads.append(httpx.post(f"{daemon.url}/admin/models/{MODEL}/unload", timeout=60))

        threading.Thread(target=run).start()

    trace_id, lines = _stream_story(daemon, unload)
    assert "ENGINE_STOPPED" in lines[-1] and "crash" not in lines[-1], lines[-3:]
    assert "[DONE]" not in lines[-1]
    card = httpx.get(f"{daemon.url}/v1/requests/{trace_id}").json()
    assert (card["state"], card["status"], card["code"]) == ("failed", 200, "ENGINE_STOPPED"), card
    assert (_row(daemon, trace_id)["blazar_code"]) == "ENGINE_STOPPED"
    again = _client(daemon).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi."}], max_tokens=2
    )
    assert again.usage is not None and again.usage.completion_tokens > 0


def test_ollama_keep_alive_zero_waits_for_the_stream_in_flight(daemon: DaemonProc) -> None:
    """As Ollama: ``keep_alive: 0`` from one client unloads the model once another client's
    stream has finished, never in the middle of it."""
    answers: list[httpx.Response] = []

    def unload() -> None:
        answers.append(httpx.post(f"{daemon.url}/api/generate", json={"model": MODEL, "keep_alive": 0}))

    trace_id, lines = _stream_story(daemon, unload)
    assert answers[0].status_code == 200 and answers[0].json()["done_reason"] == "unload"
    assert lines[-1] == "data: [DONE]", lines[-3:]
    assert httpx.get(f"{daemon.url}/v1/requests/{trace_id}").json()["state"] == "done"
    deadline = time.monotonic() + 30
    while _running(daemon) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(daemon)


def _running(daemon: DaemonProc) -> list[dict[str, object]]:
    return [e for e in daemon.engines() if e["state"] not in ("stopped", "failed")]
