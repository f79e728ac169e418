"""The pure parts of telemetry: engine usage from replies and stream tails, the merge of the
engines' own metrics, and the audit log's writer."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from actors.failover import FailoverChains
from actors.ledger import RequestRecord
from blazar.dialects import engine_usage
from blazar.dialects.neutral import Usage
from blazar.telemetry.audit import AuditLog, text_of
from blazar.telemetry.metrics import Metrics, _Families, engine_families
from blazar.telemetry.observer import dialect_label, ttft_s

# As llama.cpp writes them (trimmed): a whole reply, and a stream's last events.
BODY = (
    b'{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"Hello"}}],'
    b'"usage":{"completion_tokens":5,"prompt_tokens":31,"total_tokens":36,'
    b'"prompt_tokens_details":{"cached_tokens":30}},"id":"chatcmpl-x",'
    b'"timings":{"cache_n":30,"prompt_n":1,"prompt_ms":7.448,"predicted_n":5,"predicted_ms":32.95}}'
)
FINAL = (
    b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"object":"chat.completion.chunk",'
    b'"timings":{"cache_n":0,"prompt_n":31,"prompt_ms":96.126,"predicted_n":5,"predicted_ms":31.635}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def test_usage_of_a_whole_reply() -> None:
    u = engine_usage.of_body(BODY)
    assert u == engine_usage.EngineUsage(
        prompt_tokens=31, completion_tokens=5, prefill_ms=7.448, decode_ms=32.95
    )
    assert engine_usage.of_body(b"not json") is None
    assert engine_usage.of_body(b'{"choices":[]}') is None


def test_usage_of_a_stream_tail_however_it_was_cut() -> None:
    expected = engine_usage.EngineUsage(
        prompt_tokens=31, completion_tokens=5, prefill_ms=96.126, decode_ms=31.635
    )
    assert engine_usage.of_stream_tail(FINAL + DONE) == expected
    assert (
        engine_usage.of_stream_tail(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n' + FINAL) == expected
    )
    assert engine_usage.of_stream_tail(FINAL[10:] + DONE) is None  # the event's head was cut off
    assert engine_usage.of_stream_tail(DONE) is None
    usage_only = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\n' + DONE
    assert engine_usage.of_stream_tail(usage_only) == engine_usage.EngineUsage(
        prompt_tokens=4, completion_tokens=2
    )


def test_usage_of_a_parsed_stream() -> None:
    timings = {"prompt_n": 8, "cache_n": 24, "prompt_ms": 20.0, "predicted_n": 8, "predicted_ms": 90.8}
    u = engine_usage.of_parts(Usage(prompt_tokens=32, completion_tokens=8), timings)
    assert u == engine_usage.EngineUsage(
        prompt_tokens=32, completion_tokens=8, prefill_ms=20.0, decode_ms=90.8
    )
    assert engine_usage.of_parts(None, timings) == engine_usage.EngineUsage(
        prompt_tokens=32, completion_tokens=8, prefill_ms=20.0, decode_ms=90.8
    )
    assert engine_usage.of_parts(None, None) is None


ENGINE = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {n}
# HELP llamacpp:n_tokens_max Largest observed sequence length
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 35
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""


def test_engine_metrics_merge_under_a_model_label() -> None:
    fams = engine_families({"a": ENGINE.format(n=33), "b": ENGINE.format(n=7), "broken": "{{{ not metrics"})
    text = generate_latest(_Families(fams)).decode()
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    prompt = parsed["llamacpp:prompt_tokens"]
    assert prompt.type == "counter"
    assert {(s.labels["model"], s.value) for s in prompt.samples} == {("a", 33.0), ("b", 7.0)}
    # a counter without _total gets it, as the parser reads it
    assert [s.name for s in parsed["llamacpp:n_tokens_max"].samples] == ["llamacpp:n_tokens_max_total"] * 2
    assert {s.labels["model"] for s in parsed["llamacpp:requests_processing"].samples} == {"a", "b"}


def test_dialect_and_ttft() -> None:
    assert dialect_label("/v1/messages", {}) == "anthropic"
    assert dialect_label("/v1/models", {"anthropic-version": "2023-06-01"}) == "anthropic"
    assert dialect_label("/v1/chat/completions", {}) == "openai"
    assert dialect_label("/api/chat", {}) == "ollama"
    assert dialect_label("/api/quantiles", {}) == "native"
    assert dialect_label("/metrics", {}) == "native"
    assert ttft_s(_record(duration_ms=150.0, decode_ms=100.0)) == 0.05
    assert ttft_s(_record(duration_ms=150.0)) is None


def _record(**kw: object) -> RequestRecord:
    base: dict[str, object] = {
        "trace_id": "blz-1-1",
        "started_at": 1_796_000_000.25,
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "m",
        "status": 200,
        "duration_ms": 10.0,
        "ttft_ms": 5.0,
        "blazar_code": None,
        "bytes_out": 10,
        "client": "203.0.113.9",
    }
    return RequestRecord(**{**base, **kw})  # type: ignore[arg-type]


def test_text_of_bodies_streams_and_lines() -> None:
    chat = b'{"model":"m","messages":[{"role":"system","content":"Be brief"},{"role":"user","content":"Hi"}]}'
    assert text_of(chat, sep="\n") == "Be brief\nHi"
    blocks = b'{"messages":[{"role":"user","content":[{"type":"text","text":"Hello"}]}],"system":"S"}'
    assert text_of(blocks, sep="|") == "Hello|S"
    sse = b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n'
    sse += b'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n'
    assert text_of(sse + DONE, sep="") == "Hello"
    ndjson = b'{"message":{"content":"Hi "}}\n{"message":{"content":"there"},"done":true}\n'
    assert text_of(ndjson, sep="") == "Hi there"


def test_audit_log_writes_scrubbed_lines_and_rotates(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "audit.jsonl"
    audit = AuditLog(path, max_bytes=600, backups=2, prompts=True)
    audit.start()
    try:
        body = b'{"messages":[{"role":"user","content":"mail me at a.b@example.org"}]}'
        answer = b'data: {"choices":[{"delta":{"content":"call +44 20 7946 0958"}}]}\n\n'
        audit.submit(
            _record(key="ci", prompt_tokens=3, completion_tokens=2, error="Bearer abcdef123456 refused"),
            "/v1/chat/completions",
            body,
            answer,
        )
        audit.flush()
        line = json.loads(path.read_text().splitlines()[0])
        assert line["time"] == "2026-11-30T00:53:20.250Z"
        assert line["key"] == "ci" and line["route"] == "/v1/chat/completions" and line["status"] == 200
        assert line["prompt"] == "mail me at [email]" and line["answer"] == "call [phone]"
        assert line["error"] == "Bearer [secret] refused"
        assert "client" not in line and "203.0.113.9" not in path.read_text()
        for _ in range(10):
            audit.submit(_record(), "/v1/models")
        audit.flush()
        assert (tmp_path / "logs" / "audit.jsonl.1").exists()
        assert not (tmp_path / "logs" / "audit.jsonl.3").exists()
        for name in ("audit.jsonl", "audit.jsonl.1"):  # private to the daemon's user, rotated too
            assert (tmp_path / "logs" / name).stat().st_mode & 0o777 == 0o600
    finally:
        audit.close()
    assert audit.written == 11 and audit.dropped == 0


def test_a_full_audit_queue_drops_instead_of_waiting(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, queue_max=2)  # not started: nothing drains
    for _ in range(5):
        audit.submit(_record(), "/v1/models")
    assert audit.dropped == 3


def test_error_event_at_the_end_of_a_stream() -> None:
    cut = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    failed = cut + b'data: {"error":{"code":500,"message":"slot lost","type":"server_error"}}\n\n'
    assert engine_usage.stream_error(failed) == "slot lost"
    assert engine_usage.stream_error(cut + b'data: {"error":"plain words"}\n\n') == "plain words"
    assert engine_usage.stream_error(cut + b'data: {"error":{"mess') == "an error event"
    assert engine_usage.stream_error(FINAL + DONE) is None
    # the word in generated text is no error event
    assert engine_usage.stream_error(b'data: {"choices":[{"delta":{"content":"\\"error\\":"}}]}\n\n') is None


class _NoEngines:
    """A runtime that has made no engine and has no failover chain: every model label is ``other``."""

    failover = FailoverChains([])

    def engine_named(self, name: str) -> None:
        return None


def test_request_counter_labels_the_code_from_the_closed_catalog() -> None:
    m = Metrics(_NoEngines())  # type: ignore[arg-type]
    for code in (None, "ENGINE_CRASHED", "ENGINE_CRASHED", "NOT_A_CODE"):
        m.observe(_record(blazar_code=code), route="/v1/responses", inference=False, ttft_s=None)
    counted = {
        (s.labels["status"], s.labels["code"]): s.value
        for fam in m.requests.collect()
        for s in fam.samples
        if s.name == "blazar_requests_total"
    }
    assert counted == {("200", ""): 1.0, ("200", "ENGINE_CRASHED"): 2.0, ("200", "OTHER"): 1.0}
