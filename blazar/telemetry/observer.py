"""``Telemetry``: where the gateway layer hands each finished request, once.

It feeds the three readers of a request's facts — the Prometheus series
(``metrics``), the quantile window behind ``/api/quantiles`` (``quantiles``) and
the audit log (``audit``) — from the same ``RequestRecord`` the ledger gets, so
every reader (and a later tracer) sees the same timings. The work done here per
request is a few dictionary lookups and additions; text, scrubbing and disk are
the audit writer's thread's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from actors.ledger import RequestRecord
from actors.runtime import Runtime
from blazar.telemetry.audit import AuditLog
from blazar.telemetry.metrics import LOADED_MS, Metrics
from blazar.telemetry.quantiles import QuantileWindow, Sample
from blazar.telemetry.series import SeriesRing

__all__ = ["COLD_MS", "Telemetry", "dialect_label", "failed", "ttft_s"]

COLD_MS = LOADED_MS
"""A request that waited longer than this for its engine loaded it (``cold``)."""

_NATIVE_API = ("/api/errors", "/api/quantiles", "/api/why", "/api/explain")
_NOT_AUDITED = frozenset({"/health", "/healthz", "/metrics"})
"""Probes and scrapes: a line for each would bury the requests worth auditing."""


def dialect_label(path: str, headers: Mapping[str, str]) -> str:
    """Which API dialect a request speaks: ``openai``, ``anthropic``, ``ollama`` or ``native``."""
    if path.startswith("/v1/messages") or "anthropic-version" in headers:
        return "anthropic"
    if path.startswith("/v1/"):
        return "openai"
    if path.startswith("/api/") and not path.startswith(_NATIVE_API):
        return "ollama"
    return "native"


def ttft_s(record: RequestRecord) -> float | None:
    """Arrival to first generated token: the whole request less the engine's decode time
    (queue wait, load, prefill and the gateway's own time are in it); None without the
    engine's timings."""
    if record.decode_ms is None:
        return None
    return max(0.0, (record.duration_ms - record.decode_ms) / 1000)


def failed(record: RequestRecord) -> bool:
    """Whether a request counts as an error: its answer failed (a 4xx/5xx head, or a stream
    that failed after its 200 head); a client that went away (499) is no error of ours."""
    if record.status == 499:
        return False
    return record.status >= 400 or record.blazar_code is not None


class Telemetry:
    def __init__(self, runtime: Runtime, *, quantiles: QuantileWindow, audit: AuditLog | None = None) -> None:
        self.metrics = Metrics(runtime)
        self.quantiles = quantiles
        self.audit = audit
        self.series = SeriesRing()
        """Per-second counts of the last minutes, for the console (``/api/console/*``)."""

    @property
    def wants_text(self) -> bool:
        """Whether the audit log keeps prompts and answers (the gateway then keeps the reply's bytes)."""
        return self.audit is not None and self.audit.prompts

    def observe(
        self,
        record: RequestRecord,
        *,
        route: str,
        inference: bool,
        body: bytes | None = None,
        answer: bytes | None = None,
        drafts: tuple[int, int] | None = None,
    ) -> None:
        """``drafts``: the tokens speculative decoding drafted for an inference request, and
        kept (0, 0 when it did not speculate: the governor's clock moves on all the same)."""
        first = ttft_s(record) if inference else None
        self.metrics.observe(record, route=route, inference=inference, ttft_s=first)
        if drafts is not None and (model := self.metrics.model_label(record.model)) not in ("", "other"):
            self.metrics.runtime.note_drafts(model, *drafts)
        tpot = None
        if inference and record.decode_ms is not None and record.completion_tokens:
            tpot = record.decode_ms / 1000 / record.completion_tokens
        if inference:
            self.series.add(
                time.time(),
                error=failed(record),
                ttft_s=first,
                tpot_s=tpot,
                tokens_in=record.prompt_tokens,
                tokens_out=record.completion_tokens,
            )
        if inference and record.status < 400 and record.model:
            sample = Sample(
                at_s=time.monotonic(),
                ttft_s=first,
                tpot_s=tpot,
                queue_s=record.queue_ms / 1000 if record.queue_ms is not None else None,
                e2e_s=record.duration_ms / 1000,
            )
            cold = (record.load_ms or 0.0) > COLD_MS
            self.quantiles.add(self.metrics.model_label(record.model), sample, cold=cold)
        if self.audit is not None and route not in _NOT_AUDITED:
            if self.audit.prompts:
                self.audit.submit(record, route, body, answer)
            else:
                self.audit.submit(record, route)

    def summary(self) -> dict[str, object]:
        """What ``GET /api/quantiles`` answers."""
        q = self.quantiles
        return {
            "window": {"max_requests": q.max_requests, "max_age_s": q.max_age_s},
            "cold_ms": COLD_MS,
            "models": q.summary(time.monotonic()),
        }

    def close(self) -> None:
        if self.audit is not None:
            self.audit.close()
