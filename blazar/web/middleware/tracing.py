"""OpenTelemetry traces of requests, exported over OTLP/HTTP (the ``[otel]`` extra).

Off unless ``otel_endpoint`` is configured (or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
set), and then imported lazily, so a daemon without it pays nothing. Each request
gets a server span, started when the request arrives so its ``traceparent`` can
go back in the response's headers, and ended with it. An incoming W3C
``traceparent`` makes it a child of the caller's span. The span carries the
daemon's own ``x-blazar-trace-id`` as ``blazar.trace_id``, so a trace found in a
tracing backend leads to ``blazar why`` and back.

An inference request's span gets children for the phases it went through:
``admission.wait``, ``engine.load``, ``prefill`` and ``decode``. They are made
when the request ends, from the durations its card measured (the engine's own
``prompt_ms``/``predicted_ms`` where it reports them), laid out back to back and
anchored at the first byte sent: nothing is done per relayed chunk, and the
request path never waits on the exporter (the SDK's batch processor exports from
its own thread).

In the gateway the span begins as soon as the request has its trace id, before the host
guard and the key step, so refused requests are traced too and every answer but a
preflight's (the refusal included) carries its ``traceparent``; it ends last, after the
cleanups and the ledger record, with the status and code the ledger recorded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from blazar.serve.cards import Card

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span

__all__ = ["RequestTracer", "TracingUnavailable", "endpoint_from", "open_tracer"]

_INSTALL_HINT = "install the tracing extra (`pip install 'blazar[otel]'`) or unset otel_endpoint"


class TracingUnavailable(Exception):
    """Tracing is configured but the OpenTelemetry SDK is not installed."""


def endpoint_from(configured: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The OTLP/HTTP traces URL: the config's base URL, else OpenTelemetry's own variables."""
    if configured:
        return configured.rstrip("/") + "/v1/traces"
    if traces := environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return traces
    if base := environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return base.rstrip("/") + "/v1/traces"
    return None


Scrub = Callable[[str], str]


class RequestTracer:
    """Starts and ends the spans of requests; one per daemon."""

    def __init__(self, provider: TracerProvider, *, scrub: Scrub | None = None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self._tracer = provider.get_tracer("blazar")
        self._propagator = TraceContextTextMapPropagator()
        self._trace = trace
        self._scrub = scrub or (lambda text: text)

    def begin(self, method: str, path: str, headers: Mapping[str, str], trace_id: str) -> Span:
        """The request's server span, a child of the caller's ``traceparent`` if it sent one."""
        parent = self._propagator.extract(headers) if "traceparent" in headers else None
        return self._tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=self._trace.SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path, "blazar.trace_id": trace_id},
        )

    @staticmethod
    def traceparent(span: Span) -> bytes:
        """The W3C header value naming ``span``, returned to the caller."""
        ctx = span.get_span_context()
        return b"00-%032x-%016x-%02x" % (ctx.trace_id, ctx.span_id, int(ctx.trace_flags))

    def end(self, span: Span, *, status: int, model: str | None, code: str | None, card: Card | None) -> None:
        """End the request's span (now), with the phases its card measured as children."""
        from opentelemetry.trace import Status, StatusCode

        end_ns = time.time_ns()
        attributes: dict[str, Any] = {"http.response.status_code": status}
        if model:
            attributes["gen_ai.request.model"] = model
        if code:
            attributes["blazar.code"] = code
        if card is not None:
            attributes.update(_card_attributes(card))
            self._phases(span, card, end_ns)
        span.set_attributes(attributes)
        if status >= 500 or code:
            span.set_status(
                Status(StatusCode.ERROR, self._scrub(card.reason or code or "") if card else code)
            )
        span.end(end_time=end_ns)

    def _phases(self, root: Span, card: Card, end_ns: int) -> None:
        context = self._trace.set_span_in_context(root)
        for name, start_ns, stop_ns in phases(card, end_ns):
            child = self._tracer.start_span(name, context=context, start_time=start_ns)
            child.end(end_time=stop_ns)

    def shutdown(self) -> None:
        """Export what is still queued (bounded by the SDK's own timeout)."""
        self.provider.shutdown()


def _card_attributes(card: Card) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for name, value in (
        ("blazar.key", card.key),
        ("blazar.engine", card.engine),
        ("blazar.state", str(card.state)),
        ("gen_ai.usage.input_tokens", card.prompt_tokens),
        ("gen_ai.usage.output_tokens", card.completion_tokens),
    ):
        if value is not None:
            attributes[name] = value
    return attributes


def phases(card: Card, end_ns: int) -> list[tuple[str, int, int]]:
    """``(name, start_ns, end_ns)`` of each phase the card measured, in wall-clock ns.

    The phases ran back to back: waiting for a slot, loading the engine, reading the
    prompt, generating. The first byte sent marks the end of the prompt (for a reply
    sent whole, the end of the request); decode runs from there to the end; the
    earlier phases are laid out backwards from it by their measured durations."""
    now_perf = time.perf_counter()
    wall_of = lambda perf: end_ns - int((now_perf - perf) * 1e9)  # noqa: E731 - a local conversion
    decode_ns = int((card.decode_ms or 0.0) * 1e6)
    if card.first_byte_s is not None and card.chunks > 1:
        first_ns = wall_of(card.first_byte_s)
    else:  # one body: the output came all at once at the end
        first_ns = end_ns - decode_ns
    first_ns = min(max(first_ns, wall_of(card.t0)), end_ns)
    out: list[tuple[str, int, int]] = []
    if card.decode_ms is not None or card.completion_tokens:
        out.append(("decode", first_ns, end_ns))
    cursor = first_ns
    for name, seconds in (
        ("prefill", (card.prefill_ms or 0.0) / 1000 if card.prefill_ms is not None else None),
        ("engine.load", card.load_s or None),
        ("admission.wait", card.queue_wait_s),
    ):
        if seconds is None:
            continue
        start = cursor - int(seconds * 1e9)
        out.append((name, start, cursor))
        cursor = start
    out.reverse()
    return out


def open_tracer(
    endpoint: str,
    *,
    service_name: str = "blazar",
    exporter: SpanExporter | None = None,
    schedule_delay_ms: float = 1000.0,
    scrub: Scrub | None = None,
) -> RequestTracer:
    """A tracer exporting to ``endpoint`` (an OTLP/HTTP traces URL) in the background."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(f"otel_endpoint is set but {exc.name} is missing: {_INSTALL_HINT}") from exc
    from blazar import __version__

    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name, "service.version": __version__})
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter or OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=schedule_delay_ms
        )
    )
    return RequestTracer(provider, scrub=scrub)
