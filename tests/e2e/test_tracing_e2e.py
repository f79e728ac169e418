"""Request traces reach a real OTLP/HTTP receiver, tied to the caller's traceparent and to
the daemon's own trace id."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from tests.support import MODEL, make_home, start_daemon

pytestmark = pytest.mark.slow

PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"


class _Receiver(http.server.BaseHTTPRequestHandler):
    spans: list[object] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                type(self).spans.extend(scope.spans)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[object]]]:
    spans: list[object] = []
    handler = type("Receiver", (_Receiver,), {"spans": spans})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", spans
    finally:
        server.shutdown()


def _attrs(span: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in span.attributes:  # type: ignore[attr-defined]
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def test_a_chat_request_is_traced_as_a_child_of_the_callers_span(
    tmp_path: Path, model_path: Path, receiver: tuple[str, list[object]]
) -> None:
    url, spans = receiver
    home = make_home(tmp_path / "home", model_path, config=f'otel_endpoint = "{url}"\n')
    daemon = start_daemon(home)
    try:
        reply = httpx.post(
            f"{daemon.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8},
            headers={"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"},
            timeout=120,
        )
        assert reply.status_code == 200
        _, trace_id, span_id, _ = reply.headers["traceparent"].split("-")
        assert trace_id == PARENT_TRACE and span_id != PARENT_SPAN
        blazar_trace = reply.headers["x-blazar-trace-id"]
    finally:
        daemon.stop()  # shutting down exports what is still queued
    deadline = time.monotonic() + 30
    while not any(s.name == "POST /v1/chat/completions" for s in spans) and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.1)
    by_name = {s.name: s for s in spans}  # type: ignore[attr-defined]
    root = by_name["POST /v1/chat/completions"]
    assert root.trace_id.hex() == PARENT_TRACE  # type: ignore[attr-defined]
    assert root.span_id.hex() == span_id  # type: ignore[attr-defined]
    assert root.parent_span_id.hex() == PARENT_SPAN  # type: ignore[attr-defined]
    attrs = _attrs(root)
    assert attrs["blazar.trace_id"] == blazar_trace
    assert attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.request.model"] == MODEL
    children = [s for s in spans if s.parent_span_id == root.span_id]  # type: ignore[attr-defined]
    # the daemon's first request started the engine: it waited for it to load
    names = [s.name for s in sorted(children, key=lambda s: s.start_time_unix_nano)]  # type: ignore[attr-defined]
    assert names == ["admission.wait", "engine.load", "prefill", "decode"]
    for child in children:
        assert root.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano  # type: ignore[attr-defined]
        assert child.end_time_unix_nano <= root.end_time_unix_nano  # type: ignore[attr-defined]
