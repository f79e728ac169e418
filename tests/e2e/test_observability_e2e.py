"""/metrics, /api/quantiles, the audit log and the ledger's request facts, after real
requests in all three dialects from the official clients against a real daemon."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

SECRET = "sk-test-0123456789abcdefSECRET"
"""The key the clients send: no key is configured, so the daemon ignores it, but it must never
be written anywhere."""
EMAIL = "jane.doe@example.com"
PROMPT = f"My address is {EMAIL}. Say hi."
OPTIONS = {"num_predict": 6, "temperature": 0, "seed": 1}


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    home = make_home(
        tmp_path_factory.mktemp("observe") / "home",
        model_path,
        config="audit_log = true\naudit_prompts = true\n",
    )
    d = start_daemon(home)
    try:
        yield d
    finally:
        d.stop()


def _families(url: str) -> dict[str, Any]:
    resp = httpx.get(f"{url}/metrics", timeout=30)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(resp.text)}


def _value(fams: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    return sum(
        s.value
        for s in fams[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _send_all_dialects(url: str) -> Counter[tuple[str, str]]:
    """Two requests (whole and streamed) per inference route, in each dialect; returns
    (route, dialect) → requests sent."""
    sent: Counter[tuple[str, str]] = Counter()
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key=SECRET, max_retries=0, timeout=60)
    messages: Any = [{"role": "user", "content": PROMPT}]
    r = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    assert r.choices[0].message.content is not None
    chunks = list(
        oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0, stream=True)
    )
    assert chunks
    sent["/v1/chat/completions", "openai"] += 2
    c = oai.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, stream=True)
    assert list(c)
    sent["/v1/completions", "openai"] += 1

    ant = anthropic.Anthropic(base_url=url, api_key=SECRET, max_retries=0, timeout=60)
    m = ant.messages.create(model=MODEL, max_tokens=6, messages=[{"role": "user", "content": PROMPT}])
    assert m.usage.output_tokens > 0
    with ant.messages.stream(
        model=MODEL, max_tokens=6, messages=[{"role": "user", "content": PROMPT}]
    ) as stream:
        assert stream.get_final_message().usage.output_tokens > 0
    sent["/v1/messages", "anthropic"] += 2

    oll = ollama.Client(host=url, timeout=60, headers={"Authorization": f"Bearer {SECRET}"})
    o = oll.chat(model=MODEL, messages=[{"role": "user", "content": PROMPT}], options=OPTIONS)
    assert o.done
    parts = list(
        oll.chat(model=MODEL, messages=[{"role": "user", "content": PROMPT}], options=OPTIONS, stream=True)
    )
    assert parts[-1].done
    sent["/api/chat", "ollama"] += 2
    g = oll.generate(model=MODEL, prompt="The sky is", options=OPTIONS)
    assert g.done
    sent["/api/generate", "ollama"] += 1
    return sent


def test_metrics_quantiles_audit_and_ledger(observed: DaemonProc) -> None:
    url = observed.url
    sent = _send_all_dialects(url)
    inference = sum(sent.values())

    fams = _families(url)
    # the request counters agree with the requests sent, route by route and dialect by dialect
    for (route, dialect), n in sent.items():
        got = _value(
            fams, "blazar_requests", "blazar_requests_total", route=route, dialect=dialect, status="200"
        )
        assert got == n, (route, dialect, got, n)
        assert _value(fams, "blazar_requests", "blazar_requests_total", route=route, model=MODEL) == n
    # a route template, not the raw path; the first scrape itself is not counted yet
    assert _value(fams, "blazar_requests", "blazar_requests_total", route="/metrics") == 0
    assert fams["blazar_requests"].type == "counter"

    # every inference request was timed end to end; the engine's timings gave TTFT and ITL
    assert (
        _value(fams, "blazar_request_duration_seconds", "blazar_request_duration_seconds_count") == inference
    )
    assert _value(fams, "blazar_time_to_first_token_seconds", "blazar_time_to_first_token_seconds_count") == (
        inference
    )
    assert _value(fams, "blazar_inter_token_seconds", "blazar_inter_token_seconds_count", model=MODEL) > 0
    assert _value(fams, "blazar_queue_wait_seconds", "blazar_queue_wait_seconds_count") == inference
    # where the time went, phase by phase: the engine timed every prompt and every answer
    for phase in ("blazar_prefill_seconds", "blazar_decode_seconds", "blazar_overhead_seconds"):
        assert _value(fams, phase, f"{phase}_count", model=MODEL) == inference, phase
    assert _value(fams, "blazar_decode_seconds", "blazar_decode_seconds_sum", model=MODEL) > 0
    # the gateway's own time: more than nothing, a small part of the whole (the first request
    # also planned the model's engine)
    overhead = _value(fams, "blazar_overhead_seconds", "blazar_overhead_seconds_sum", model=MODEL)
    total = _value(
        fams, "blazar_request_duration_seconds", "blazar_request_duration_seconds_sum", model=MODEL
    )
    assert 0 < overhead < total / 2, (overhead, total)
    assert "blazar_tool_seconds" in fams  # no MCP tools ran: exposed, empty
    # only the first request loaded the model
    assert _value(fams, "blazar_load_seconds", "blazar_load_seconds_count", model=MODEL) == 1
    prompt_in = _value(fams, "blazar_prompt_tokens", "blazar_prompt_tokens_total", model=MODEL)
    tokens_out = _value(fams, "blazar_completion_tokens", "blazar_completion_tokens_total", model=MODEL)
    assert prompt_in > inference and 0 < tokens_out <= 6 * inference

    # the runtime's state, read at scrape time
    assert _value(fams, "blazar_slots", "blazar_slots", model=MODEL) >= 1
    assert _value(fams, "blazar_slots_busy", "blazar_slots_busy", model=MODEL) == 0
    assert _value(fams, "blazar_queue_depth", "blazar_queue_depth", model=MODEL) == 0
    assert _value(fams, "blazar_model_loaded", "blazar_model_loaded", model=MODEL) == 1
    assert _value(fams, "blazar_engine_starts", "blazar_engine_starts_total", model=MODEL) == 1
    assert _value(fams, "blazar_engine_crashes", "blazar_engine_crashes_total", model=MODEL) == 0
    assert "blazar_evictions" in fams

    # the engine's own series, merged in under a model label, agree with what it generated
    predicted = _value(fams, "llamacpp:tokens_predicted", "llamacpp:tokens_predicted_total", model=MODEL)
    assert predicted == tokens_out
    assert _value(fams, "llamacpp:requests_processing", "llamacpp:requests_processing", model=MODEL) == 0

    # a second scrape counts the first
    again = _families(url)
    assert _value(again, "blazar_requests", "blazar_requests_total", route="/metrics", dialect="native") == 1

    q = httpx.get(f"{url}/api/quantiles", timeout=10).json()
    per_model = q["models"][MODEL]
    assert per_model["cold"]["count"] == 1
    assert per_model["warm"]["count"] == inference - 1
    for measure in ("ttft_ms", "tpot_ms", "queue_ms", "e2e_ms"):
        p = per_model["warm"][measure]
        assert p["p50"] <= p["p95"] <= p["p99"], measure
    assert q["window"]["max_requests"] == 1000

    # the ledger tells each request's story
    records = httpx.get(f"{url}/admin/requests", params={"limit": 200}).json()["data"]
    chats = [r for r in records if r["path"] in {route for route, _ in sent}]
    assert len(chats) == inference
    for r in chats:
        assert r["engine"] and r["queue_ms"] is not None and r["load_ms"] is not None, r
        assert r["prompt_tokens"] and r["completion_tokens"] and r["decode_ms"] is not None, r
    assert {r["dialect"] for r in chats} == {"openai", "anthropic", "ollama"}

    # the audit log: a line per request, its text scrubbed, the key nowhere
    audit = observed.home / "logs" / "audit.jsonl"
    lines: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = audit.read_text() if audit.exists() else ""
        lines = [json.loads(line) for line in text.splitlines()]
        if sum(1 for line in lines if line["route"] in {route for route, _ in sent}) >= inference:
            break
        time.sleep(0.1)
    served = [line for line in lines if line["route"] in {route for route, _ in sent}]
    assert len(served) == inference
    assert all(line["status"] == 200 and line["model"] == MODEL and line["trace_id"] for line in served)
    assert all(line["completion_tokens"] for line in served)
    assert any("[email]" in (line.get("prompt") or "") for line in served)
    assert any(line.get("answer") for line in served)
    assert not any(line["route"] == "/metrics" for line in lines)
    raw = audit.read_text()
    assert SECRET not in raw and EMAIL not in raw
    assert SECRET not in (observed.home / "logs" / "daemon.log").read_text()


def test_errors_are_counted_and_audited(observed: DaemonProc) -> None:
    url = observed.url
    resp = httpx.post(f"{url}/v1/chat/completions", json={"model": "no-such-model", "messages": []})
    assert resp.status_code in (400, 404)
    status = str(resp.status_code)
    resp = httpx.get(f"{url}/v1/requests/not-a-card")
    assert resp.status_code == 404
    fams = _families(url)
    # an unknown model is bucketed, never a label of its own
    assert _value(fams, "blazar_requests", "blazar_requests_total", model="no-such-model") == 0
    assert (
        _value(fams, "blazar_requests", "blazar_requests_total", route="/v1/chat/completions", status=status)
        >= 1
    )
    assert (
        _value(fams, "blazar_requests", "blazar_requests_total", route="/v1/requests/<card_id>", status="404")
        == 1
    )
    records = httpx.get(f"{url}/admin/requests", params={"limit": 20}).json()["data"]
    failed = next(r for r in records if r["path"] == "/v1/chat/completions" and r["status"] >= 400)
    assert failed["error"] and failed["blazar_code"]
