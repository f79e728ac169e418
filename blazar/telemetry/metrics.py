"""``GET /metrics``: the daemon's Prometheus exposition, on a registry of its own.

Three sources, one text:

- per-request series (counters and histograms), observed once when a request ends,
  in the gateway layer — never per relayed chunk;
- the runtime's state (slots, queues, engines, loads, evictions), read from its
  actors' ``statistics()`` at scrape time by a custom collector;
- each ready llama.cpp engine's own ``/metrics``, fetched at scrape time and merged
  in with a ``model`` label.

Label values stay bounded: ``route`` is the route's template, never the raw
path; ``model`` is the canonical name of a model the runtime made an engine for
(anything else is ``other``); ``key`` is an API key's name (or empty); ``code`` is a
``blazar_code`` from the closed catalog (or empty).
docs/observability.md lists every series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from actors.admission import AdmissionStatistics
from actors.census import tree_rss
from actors.ledger import RequestRecord
from actors.runtime import Runtime
from blazar import __version__
from blazar.errors import CATALOG
from blazar.serve.candidates.choices import stats_for
from blazar.serve.stores.semantic import semantic_cache_of

__all__ = ["CONTENT_TYPE", "LOADED_MS", "Metrics", "engine_families"]

# The `_created` series double the output for a timestamp no dashboard reads.
disable_created_metrics()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_ENGINE_SCRAPE_S = 2.0

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 0.25, 0.5, 1.0)
_QUEUE_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


LOADED_MS = 100.0
"""A request that waited longer than this for its engine loaded it (it is "cold")."""


@dataclass(frozen=True, slots=True)
class _ModelSeries:
    e2e: Any
    queue: Any
    load: Any
    ttft: Any
    itl: Any
    prefill: Any
    decode: Any
    tools: Any
    overhead: Any


class Metrics:
    """The per-request series and the collectors, on one registry per app."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "blazar_requests",
            "HTTP requests answered, by route template, dialect, model, API key name, status and "
            "blazar_code (empty when it succeeded; a stream that failed after its 200 head has one)",
            ["route", "dialect", "model", "key", "status", "code"],
            registry=r,
        )
        self.ttft = Histogram(
            "blazar_time_to_first_token_seconds",
            "From the request's arrival to its first generated token (queue, load and prefill included)",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "blazar_inter_token_seconds",
            "Mean time between output tokens of one request (the engine's decode time / tokens)",
            ["model"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "blazar_queue_wait_seconds",
            "Time an inference request waited for an admission slot",
            ["model"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.load = Histogram(
            "blazar_load_seconds",
            "Time an inference request waited for its engine to become ready (loads only)",
            ["model"],
            buckets=_LOAD_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "blazar_request_duration_seconds",
            "End-to-end time of an inference request, arrival to last byte",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # Where a request's time went, phase by phase (docs/observability.md, "What a request cost").
        self.prefill = Histogram(
            "blazar_prefill_seconds",
            "Time the engine spent reading a request's prompt, as the engine reported it",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decode = Histogram(
            "blazar_decode_seconds",
            "Time the engine spent generating a request's output, as the engine reported it",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tools = Histogram(
            "blazar_tool_seconds",
            "Time the MCP tool calls the gateway ran for a request took, all rounds together",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "blazar_overhead_seconds",
            "The gateway's own time per inference request: arrival to last byte less queue, load, "
            "the engine's reported prompt and decode time and the MCP tools' time",
            ["model"],
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "blazar_prompt_tokens", "Prompt tokens the engines read", ["model", "key"], registry=r
        )
        self.completion_tokens = Counter(
            "blazar_completion_tokens", "Output tokens the engines generated", ["model", "key"], registry=r
        )
        r.register(_RuntimeCollector(runtime))
        r.register(_CandidatesCollector(runtime))
        r.register(_SemanticCacheCollector(runtime, self.model_label))
        # Label lookups cost more than the observations: each series' child is found once.
        self._request_children: dict[tuple[str, str, str, str, int, str], Any] = {}
        self._model_children: dict[str, _ModelSeries] = {}
        self._token_children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def model_label(self, name: str | None) -> str:
        """The bounded label of a requested model name: canonical when known, else ``other``."""
        if not name:
            return ""
        engine = self.runtime.engine_named(name)
        if engine is not None:
            return engine.spec.model
        return name if name in self.runtime.failover.chains else "other"  # chains: a bounded set

    def observe(self, record: RequestRecord, *, route: str, inference: bool, ttft_s: float | None) -> None:
        """One finished request: a handful of dictionary lookups and additions."""
        model = self.model_label(record.model)
        key = record.key or ""
        code = record.blazar_code or ""
        labels = (route, record.dialect or "", model, key, record.status, code)
        child = self._request_children.get(labels)
        if child is None:
            bounded = code if not code or code in CATALOG else "OTHER"  # the catalog is closed
            child = self._request_children[labels] = self.requests.labels(
                route, record.dialect or "", model, key, str(record.status), bounded
            )
        child.inc()
        if not inference:
            return
        series = self._model_children.get(model)
        if series is None:
            series = self._model_children[model] = _ModelSeries(
                self.e2e.labels(model),
                self.queue.labels(model),
                self.load.labels(model),
                self.ttft.labels(model),
                self.itl.labels(model),
                self.prefill.labels(model),
                self.decode.labels(model),
                self.tools.labels(model),
                self.overhead.labels(model),
            )
        series.e2e.observe(record.duration_ms / 1000)
        if record.queue_ms is not None:
            series.queue.observe(record.queue_ms / 1000)
        if record.load_ms is not None and record.load_ms > LOADED_MS:
            series.load.observe(record.load_ms / 1000)
        if ttft_s is not None:
            series.ttft.observe(ttft_s)
        if record.decode_ms is not None and record.completion_tokens:
            series.itl.observe(record.decode_ms / 1000 / record.completion_tokens)
        if record.prefill_ms is not None:
            series.prefill.observe(record.prefill_ms / 1000)
        if record.decode_ms is not None:
            series.decode.observe(record.decode_ms / 1000)
        if record.tools is not None:  # rare: a request the MCP loop ran tools for
            series.tools.observe(sum(t["ms"] for t in msgspec.json.decode(record.tools)) / 1000)
        if record.overhead_ms is not None:
            series.overhead.observe(record.overhead_ms / 1000)
        if record.prompt_tokens or record.completion_tokens:
            tokens = self._token_children.get((model, key))
            if tokens is None:
                tokens = self._token_children[(model, key)] = (
                    self.prompt_tokens.labels(model, key),
                    self.completion_tokens.labels(model, key),
                )
            if record.prompt_tokens:
                tokens[0].inc(record.prompt_tokens)
            if record.completion_tokens:
                tokens[1].inc(record.completion_tokens)

    async def render(self) -> bytes:
        """The whole exposition: ours, then each ready engine's own series."""
        engines = await self._engine_metrics()
        return generate_latest(self.registry) + generate_latest(_Families(engine_families(engines)))

    async def _engine_metrics(self) -> dict[str, str]:
        found: dict[str, str] = {}

        async def scrape(model: str, client: httpx.AsyncClient) -> None:
            try:
                resp = await client.get("/metrics", timeout=_ENGINE_SCRAPE_S)
            except httpx.HTTPError:
                return
            if resp.status_code == 200:
                found[model] = resp.text

        async with trio.open_nursery() as nursery:
            for engine in self.runtime.loaded():
                handle = engine.ready_handle()
                if handle is not None:
                    nursery.start_soon(scrape, engine.spec.model, handle.client)
        return found


def engine_families(texts: dict[str, str]) -> list[Metric]:
    """Engines' own expositions merged into one set of families, each sample labelled with
    its ``model``. An engine whose text fails to parse is left out rather than breaking the
    scrape. Names are as ``prometheus_client``'s parser reads them: a counter always ends in
    ``_total`` (llama.cpp's ``n_tokens_max`` becomes ``n_tokens_max_total``)."""
    merged: dict[str, Metric] = {}
    for model, text in sorted(texts.items()):
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError:
            continue
        for fam in families:
            kind = fam.type
            if kind not in ("counter", "gauge", "untyped", "unknown"):
                continue  # histograms and summaries: llama.cpp exposes none
            out = merged.get(fam.name)
            if out is None:
                out = merged[fam.name] = Metric(fam.name, fam.documentation, kind)
            for s in fam.samples:
                out.add_sample(s.name, {**s.labels, "model": model}, s.value)
    return list(merged.values())


class _Families(Collector):
    """Metric families already made, as a one-shot collector for ``generate_latest``."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


class _CandidatesCollector(Collector):
    """What ``n``, ``best_of`` and cascades cost: every candidate holds a slot and spends tokens."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        stats = stats_for(self.runtime)
        labels = ["feature"]
        requests = CounterMetricFamily(
            "blazar_candidate_requests", "Requests that ran several candidates, by feature", labels=labels
        )
        ran = CounterMetricFamily(
            "blazar_candidates", "Candidates run (each its own admission slot), by feature", labels=labels
        )
        tokens = CounterMetricFamily(
            "blazar_candidate_completion_tokens",
            "Output tokens of every candidate (chosen or not), by feature",
            labels=labels,
        )
        for feature in ("n", "best_of", "cascade"):
            requests.add_metric([feature], stats.requests.get(feature, 0))
            ran.add_metric([feature], stats.candidates.get(feature, 0))
            tokens.add_metric([feature], stats.tokens.get(feature, 0))
        escalations = CounterMetricFamily(
            "blazar_cascade_escalations", "Cascade steps run past the first (an answer failed its validator)"
        )
        escalations.add_metric([], stats.escalations)
        yield from (requests, ran, tokens, escalations)


class _SemanticCacheCollector(Collector):
    """What the semantic cache answered, missed and let pass, and what it keeps."""

    def __init__(self, runtime: Runtime, label: Callable[[str | None], str]) -> None:
        self.runtime = runtime
        self.label = label

    def collect(self) -> Iterator[Metric]:
        cache = semantic_cache_of(self.runtime)
        if cache is None:
            return
        outcomes: dict[tuple[str, str], int] = {}
        reasons: dict[str, int] = {}
        for model, counts in cache.counts.items():
            label = self.label(model)
            for outcome, n in (("hit", counts.hits), ("miss", counts.misses)):
                outcomes[label, outcome] = outcomes.get((label, outcome), 0) + n
            bypassed = sum(counts.bypasses.values())
            outcomes[label, "bypass"] = outcomes.get((label, "bypass"), 0) + bypassed
            for reason, n in counts.bypasses.items():
                reasons[reason] = reasons.get(reason, 0) + n
        requests = CounterMetricFamily(
            "blazar_semantic_cache_requests",
            "Chat requests the semantic cache looked at, by model and outcome (hit, miss, bypass)",
            labels=["model", "outcome"],
        )
        for (model, outcome), n in sorted(outcomes.items()):
            requests.add_metric([model, outcome], n)
        bypasses = CounterMetricFamily(
            "blazar_semantic_cache_bypasses",
            "Requests that bypassed the semantic cache, by reason",
            labels=["reason"],
        )
        for reason, n in sorted(reasons.items()):
            bypasses.add_metric([reason], n)
        cache.sweep()
        entries = GaugeMetricFamily("blazar_semantic_cache_entries", "Answers the semantic cache keeps now")
        entries.add_metric([], len(cache))
        yield from (requests, bypasses, entries)


def _class_families(adm: AdmissionStatistics) -> Iterator[Metric]:
    """Per request class (interactive, default, batch, background), over every model."""
    labels = ["class"]
    queued = GaugeMetricFamily("blazar_class_queue_depth", "Requests of the class waiting", labels=labels)
    running = GaugeMetricFamily("blazar_class_running", "Requests of the class holding a slot", labels=labels)
    granted = CounterMetricFamily("blazar_class_granted", "Slots granted to the class", labels=labels)
    waited = CounterMetricFamily(
        "blazar_class_wait_seconds", "Seconds its granted requests waited for slots", labels=labels
    )
    rejected = CounterMetricFamily(
        "blazar_class_rejected", "Requests of the class refused at once (its queue full)", labels=labels
    )
    expired = CounterMetricFamily(
        "blazar_class_expired", "Requests dropped from its queue (timeout, deadline)", labels=labels
    )
    preempted = CounterMetricFamily(
        "blazar_class_preempted", "Requests that gave their slot to an interactive one", labels=labels
    )
    for c in adm.classes:
        queued.add_metric([c.name], c.queued)
        running.add_metric([c.name], c.running)
        granted.add_metric([c.name], c.granted)
        waited.add_metric([c.name], c.waited_s)
        rejected.add_metric([c.name], c.rejected)
        expired.add_metric([c.name], c.expired)
        preempted.add_metric([c.name], c.preempted)
    yield from (queued, running, granted, waited, rejected, expired, preempted)


class _RuntimeCollector(Collector):
    """The runtime's state, read from its actors' statistics at scrape time."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        stats = self.runtime.statistics()
        info = GaugeMetricFamily("blazar_build_info", "The daemon's version", labels=["version"])
        info.add_metric([__version__], 1.0)
        yield info
        slots = GaugeMetricFamily("blazar_slots", "Admission slots per model", labels=["model"])
        busy = GaugeMetricFamily("blazar_slots_busy", "Admission slots in use per model", labels=["model"])
        depth = GaugeMetricFamily("blazar_queue_depth", "Requests waiting for a slot", labels=["model"])
        for q in stats.admission.queues:
            slots.add_metric([q.model], q.capacity)
            busy.add_metric([q.model], q.running)
            depth.add_metric([q.model], q.queued)
        yield from (slots, busy, depth)
        loaded = GaugeMetricFamily(
            "blazar_model_loaded", "1 while a model's engine is starting or ready", labels=["model", "engine"]
        )
        memory = GaugeMetricFamily(
            "blazar_model_memory_bytes",
            "Estimated memory a loaded model holds (weights, context, compute buffers)",
            labels=["model"],
        )
        resident = GaugeMetricFamily(
            "blazar_engine_resident_bytes",
            "Resident memory the engine's process tree holds now, measured (/proc), beside the estimate",
            labels=["model"],
        )
        starts = CounterMetricFamily(
            "blazar_engine_starts", "Engine processes launched (loads)", labels=["model"]
        )
        restarts = CounterMetricFamily(
            "blazar_engine_restarts", "Engine processes started again after one ended", labels=["model"]
        )
        crashes = CounterMetricFamily(
            "blazar_engine_crashes", "Engine processes that crashed", labels=["model"]
        )
        for e in stats.engines:
            up = e.state in ("ready", "starting")
            loaded.add_metric([e.model, e.engine], 1.0 if up else 0.0)
            footprint = self.runtime.memory.footprint(e.model) if up else None
            if footprint is not None:
                memory.add_metric([e.model], footprint)
            # a few reads of /proc per engine (no disk): cheap enough for every scrape
            rss = tree_rss(e.pid) if up and e.pid else None
            if rss is not None:
                resident.add_metric([e.model], rss)
            starts.add_metric([e.model], e.starts)
            restarts.add_metric([e.model], e.restarts)
            crashes.add_metric([e.model], e.crashes)
        yield from (loaded, memory, resident, starts, restarts, crashes)
        life = stats.lifecycle
        yield CounterMetricFamily(
            "blazar_evictions", "Models unloaded to make room for another", value=life.evictions
        )
        yield CounterMetricFamily(
            "blazar_idle_unloads", "Models unloaded when their keep-alive ran out", value=life.idle_unloads
        )
        adm = stats.admission
        yield CounterMetricFamily(
            "blazar_admission_rejected",
            "Requests admission refused (queue full, draining)",
            value=adm.rejected,
        )
        yield CounterMetricFamily(
            "blazar_admission_expired", "Requests whose deadline passed in the queue", value=adm.expired
        )
        yield from _class_families(adm)
        yield CounterMetricFamily(
            "blazar_ledger_dropped", "Request records the ledger could not keep", value=stats.ledger.dropped
        )
        yield from _failover_families(self.runtime)
        yield from _speculation_families(self.runtime)


def _speculation_families(runtime: Runtime) -> Iterator[Metric]:
    """Speculative decoding per model: tokens drafted and kept (the engines' own ``timings``,
    summed as requests end), the acceptance, and whether the governor parked it."""
    stats = runtime.speculation.statistics()
    drafted = CounterMetricFamily(
        "blazar_spec_draft_tokens", "Tokens speculative decoding drafted", labels=["model"]
    )
    accepted = CounterMetricFamily(
        "blazar_spec_accepted_tokens", "Drafted tokens the model kept", labels=["model"]
    )
    rate = GaugeMetricFamily(
        "blazar_spec_acceptance",
        "Kept / drafted tokens over the governor's last judged window (else over all requests)",
        labels=["model"],
    )
    governor = GaugeMetricFamily(
        "blazar_spec_governor",
        "1 for the governor's state of each model's speculation",
        labels=["model", "state"],
    )
    for m in stats.models:
        drafted.add_metric([m.model], m.drafted_total)
        accepted.add_metric([m.model], m.accepted_total)
        shown = m.window_acceptance if m.window_acceptance is not None else m.acceptance
        if shown is not None:
            rate.add_metric([m.model], shown)
        governor.add_metric([m.model, "parked" if m.parked else "on"], 1.0)
    yield from (drafted, accepted, rate, governor)


def _failover_families(runtime: Runtime) -> Iterator[Metric]:
    """Per chain and target: the requests it served, the times a request moved on from it
    (each a failover), and whether it is benched now."""
    if not runtime.failover.chains:
        return
    served = CounterMetricFamily(
        "blazar_failover_served", "Requests of a failover chain a target served", labels=["chain", "target"]
    )
    failed = CounterMetricFamily(
        "blazar_failovers",
        "Times a request of a failover chain moved on from a target that failed it",
        labels=["chain", "target"],
    )
    benched = GaugeMetricFamily(
        "blazar_failover_benched", "1 while a chain's target is benched", labels=["chain", "target"]
    )
    for chain in runtime.failover.report(trio.current_time()):
        for t in chain.targets:
            served.add_metric([chain.name, t.target], t.served)
            failed.add_metric([chain.name, t.target], t.failed)
            benched.add_metric([chain.name, t.target], 1.0 if t.state == "benched" else 0.0)
    yield from (served, failed, benched)
