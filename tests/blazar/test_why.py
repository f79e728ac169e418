"""The story of a request, told from its ledger record (pure)."""

from __future__ import annotations

from typing import Any

from actors.ledger import RequestRecord
from blazar.telemetry.why import Extras, pick, tell


def _record(**facts: Any) -> RequestRecord:
    base: dict[str, Any] = {
        "trace_id": "blz-t-1",
        "started_at": 1_764_600_000.0,
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "smollm2-135m",
        "status": 200,
        "duration_ms": 1000.0,
        "ttft_ms": 120.0,
        "blazar_code": None,
        "bytes_out": 100,
        "client": "127.0.0.1",
        "dialect": "openai",
    }
    return RequestRecord(**(base | facts))


def test_a_cold_request_that_evicted_another_model() -> None:
    story = tell(
        _record(
            duration_ms=3000.0,
            queue_ms=0.2,
            load_ms=2500.0,
            prefill_ms=50.0,
            decode_ms=400.0,
            prompt_tokens=30,
            completion_tokens=20,
            engine="llamacpp",
        ),
        Extras(state="done", evicted=("qwen3:0.6b",), queue_ahead=0),
    )
    assert story.outcome == "ok" and story.loaded and story.evicted == ["qwen3:0.6b"]
    assert story.slowest == "loading the engine"
    text = "\n".join(story.lines)
    assert "slot at once" in text
    assert "started for it and took 2.50 s, after evicting qwen3:0.6b" in text
    assert "30-token prompt in 50 ms (600 tokens/s)" in text
    assert "generated 20 tokens in 400 ms (50 tokens/s)" in text
    assert "83%" in text  # 2500 of 3000 ms


def test_a_queued_warm_request() -> None:
    story = tell(
        _record(duration_ms=2000.0, queue_ms=1500.0, load_ms=0.1, prefill_ms=20.0, decode_ms=400.0),
        Extras(queue_ahead=3),
    )
    assert not story.loaded and story.queue_ahead == 3 and story.slowest == "waiting for a slot"
    text = "\n".join(story.lines)
    assert "waited 1.50 s for an engine slot; 3 requests waited ahead of it" in text
    assert "already loaded" in text


def test_a_failed_request_names_its_code_and_what_it_means() -> None:
    story = tell(
        _record(status=400, blazar_code="PROMPT_TOO_LONG", error="the prompt has 9000 tokens", ttft_ms=None)
    )
    assert story.outcome == "failed" and story.code == "PROMPT_TOO_LONG"
    assert story.cause  # the catalog's meaning
    assert story.lines[-2] == "It ended with PROMPT_TOO_LONG: the prompt has 9000 tokens."
    assert story.lines[-1].startswith("PROMPT_TOO_LONG means: ")


def test_a_request_cancelled_from_outside_says_so() -> None:
    story = tell(
        _record(status=499, blazar_code="CLIENT_CLOSED_REQUEST"),
        Extras(state="cancelled", reason="cancelled by POST /v1/requests/{id}/cancel"),
    )
    assert story.outcome == "cancelled"
    assert "cancelled by POST" in story.lines[-2]


def test_pick_prefers_the_newest_failure_then_the_slowest() -> None:
    ok_slow = _record(trace_id="slow", duration_ms=9000.0)
    ok_fast = _record(trace_id="fast", duration_ms=10.0)
    failed_old = _record(trace_id="old-fail", status=503, blazar_code="ALL_SLOTS_BUSY")
    failed_new = _record(trace_id="new-fail", status=500, error="boom")
    listing = _record(trace_id="models", model=None, method="GET", path="/v1/models", status=404)
    assert pick([listing, ok_fast, failed_new, ok_slow, failed_old]).trace_id == "new-fail"  # type: ignore[union-attr]
    assert pick([listing, ok_fast, ok_slow]).trace_id == "slow"  # type: ignore[union-attr]
    assert pick([listing]) is None
