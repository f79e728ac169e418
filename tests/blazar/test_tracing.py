"""Request spans: ids, parents from ``traceparent``, phases laid out from a card."""

from __future__ import annotations

import itertools
import sys
import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from blazar.serve.cards import Card, CardState
from blazar.web.middleware.tracing import RequestTracer, endpoint_from, open_tracer, phases

PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


def _tracer() -> tuple[RequestTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return open_tracer("http://unused/v1/traces", exporter=exporter, schedule_delay_ms=10), exporter


def _finished(tracer: RequestTracer, exporter: InMemorySpanExporter) -> dict[str, object]:
    tracer.provider.force_flush()
    return {span.name: span for span in exporter.get_finished_spans()}


def test_endpoint_from_config_then_environment() -> None:
    assert endpoint_from("http://c:4318/") == "http://c:4318/v1/traces"
    assert endpoint_from(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318"}) == "http://e:4318/v1/traces"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"}
    assert endpoint_from(None, env) == "http://t/x"
    assert endpoint_from(None, {}) is None


def test_incoming_traceparent_is_the_parent_and_the_answer_names_our_span() -> None:
    tracer, exporter = _tracer()
    headers = {"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"}
    span = tracer.begin("POST", "/v1/chat/completions", headers, "blz-x-1")
    returned = tracer.traceparent(span).decode()
    version, trace_id, span_id, flags = returned.split("-")
    assert (version, trace_id, flags) == ("00", PARENT_TRACE, "01")
    assert span_id != PARENT_SPAN and len(span_id) == 16
    tracer.end(span, status=200, model="smollm2-135m", code=None, card=None)
    root = _finished(tracer, exporter)["POST /v1/chat/completions"]
    assert f"{root.context.span_id:016x}" == span_id  # type: ignore[attr-defined]
    assert f"{root.parent.span_id:016x}" == PARENT_SPAN  # type: ignore[attr-defined]
    assert root.attributes["blazar.trace_id"] == "blz-x-1"  # type: ignore[attr-defined]
    assert root.attributes["gen_ai.request.model"] == "smollm2-135m"  # type: ignore[attr-defined]


def test_without_traceparent_a_new_trace_starts() -> None:
    tracer, exporter = _tracer()
    span = tracer.begin("GET", "/v1/models", {}, "blz-x-2")
    assert span.get_span_context().trace_id != int(PARENT_TRACE, 16)
    tracer.end(span, status=404, model=None, code="NOT_FOUND", card=None)
    root = _finished(tracer, exporter)["GET /v1/models"]
    assert root.parent is None  # type: ignore[attr-defined]
    assert root.status.is_ok is False  # type: ignore[attr-defined]


def _card(**facts: object) -> Card:
    card = Card(trace_id="blz-x-3", path="/v1/chat/completions")
    for name, value in facts.items():
        setattr(card, name, value)
    return card


def test_phases_run_back_to_back_and_end_at_the_request_end() -> None:
    card = _card(queue_wait_s=0.5, load_s=2.0, prefill_ms=300.0, decode_ms=1000.0, completion_tokens=20)
    card.t0 = time.perf_counter() - 5.0
    card.first_byte_s = time.perf_counter() - 1.0
    card.chunks = 21
    end_ns = time.time_ns()
    laid = phases(card, end_ns)
    assert [name for name, _, _ in laid] == ["admission.wait", "engine.load", "prefill", "decode"]
    for (_, _, stop), (_, start, _) in itertools.pairwise(laid):
        assert stop == start
    durations = {name: (stop - start) / 1e9 for name, start, stop in laid}
    assert durations["admission.wait"] == pytest.approx(0.5)
    assert durations["engine.load"] == pytest.approx(2.0)
    assert durations["prefill"] == pytest.approx(0.3)
    assert durations["decode"] == pytest.approx(1.0, abs=0.05)
    assert laid[-1][2] == end_ns


def test_a_warm_request_has_no_load_phase_and_a_reply_sent_whole_decodes_before_its_end() -> None:
    card = _card(queue_wait_s=0.0, load_s=0.0, prefill_ms=50.0, decode_ms=200.0, completion_tokens=5)
    card.t0 = time.perf_counter() - 1.0
    card.first_byte_s, card.chunks = time.perf_counter(), 1
    end_ns = time.time_ns()
    laid = {name: (start, stop) for name, start, stop in phases(card, end_ns)}
    assert "engine.load" not in laid
    assert laid["decode"] == (end_ns - 200_000_000, end_ns)
    assert laid["prefill"][1] == laid["decode"][0]


def test_an_ended_request_span_has_its_phases_as_children() -> None:
    tracer, exporter = _tracer()
    span = tracer.begin("POST", "/api/chat", {}, "blz-x-4")
    card = _card(queue_wait_s=0.01, load_s=0.0, prefill_ms=5.0, decode_ms=20.0, completion_tokens=3, key="ci")
    card.state = CardState.DONE
    tracer.end(span, status=200, model="m", code=None, card=card)
    spans = _finished(tracer, exporter)
    root = spans["POST /api/chat"]
    assert {"admission.wait", "prefill", "decode"} <= spans.keys()
    for name in ("admission.wait", "prefill", "decode"):
        assert spans[name].parent.span_id == root.context.span_id  # type: ignore[attr-defined]
    assert root.attributes["gen_ai.usage.output_tokens"] == 3  # type: ignore[attr-defined]
    assert root.attributes["blazar.key"] == "ci"  # type: ignore[attr-defined]


def test_a_daemon_configured_to_trace_without_the_extra_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from blazar.config import Config, ConfigError
    from blazar.daemon.serve import _open_tracer

    # as if the [otel] extra were not installed: importing the exporter fails
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ConfigError, match=r"blazar\[otel\]"):
        _open_tracer(Config(otel_endpoint="http://127.0.0.1:4318"))
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert _open_tracer(Config()) is None  # not configured: nothing imported, nothing traced
