"""The console's read model: one snapshot of what the daemon is doing, for ``/api/console/*``,
the web console and ``blazar watch``.

A snapshot is assembled from what the daemon already keeps — the runtime's
``statistics()`` (engines, admission queues, keep-alive), the model store, the
request cards, the telemetry (quantiles and the per-second series), the jobs in
the ledger, and the hardware census — without touching the request path.
``gather`` reads the sources once (the disk and ``/proc`` in a worker thread) into
a ``Shared`` part that every viewer has in common; ``view_for`` then keeps what one
viewer may see (its models, and its own requests unless it is admin). The row
builders are plain functions of plain inputs, tested without HTTP.

Field names are a contract with the console page (docs/console.md): a field that
is not known is null, never absent.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from actors.admission import ClassStatistics
from actors.census import Census, take_census, tree_rss
from actors.engine import EngineState, EngineStatistics
from actors.jobs import JobRecord, read_jobs
from actors.ledger import read_rows
from actors.lifecycle import ResidentStatistics
from actors.peer import PeerView
from actors.pool import PoolView
from actors.runtime import Runtime
from blazar import __version__
from blazar.auth.keys import ADMIN, FAMILIES, Key
from blazar.dialects.ollama_models import model_capabilities
from blazar.serve.cards import Card, Cards, CardState
from blazar.serve.jobs import background, batch_runner
from blazar.telemetry.observer import Telemetry
from registry.gguf import ModelInfo
from registry.store import ModelRecord

__all__ = [
    "RECENT",
    "Shared",
    "class_rows",
    "gather",
    "job_results",
    "job_row",
    "memory_of",
    "model_rows",
    "peer_rows",
    "view_for",
    "viewer_of",
]

RECENT = 50
"""Finished requests a snapshot lists, newest first."""
_JOBS_RECENT = 20
"""Finished jobs a snapshot lists beside every queued and running one."""
_LOADED = (EngineState.READY, EngineState.STARTING)


@dataclass(frozen=True, slots=True)
class CardRow:
    """A card's view with what ``view_for`` filters on."""

    key: str | None
    model: str | None
    view: dict[str, Any]


@dataclass(slots=True)
class Shared:
    """The part of a snapshot every viewer has in common (built once per tick)."""

    time: float
    models: list[dict[str, Any]]
    requests: list[CardRow]
    recent: list[CardRow]
    rates: dict[str, Any]
    series: list[dict[str, Any]]
    quantiles: dict[str, Any]
    jobs: list[dict[str, Any]]
    memory: dict[str, Any]
    classes: list[dict[str, Any]] = field(default_factory=list)
    """Admission's request classes over every model (``class_rows``)."""
    peers: list[dict[str, Any]] = field(default_factory=list)
    """The ``[[remotes]]`` peers and pool routers as last polled (``peer_rows``)."""
    built_s: float = field(default=0.0)
    """``trio.current_time()`` when it was built (how old a shared snapshot is)."""


# -- rows -------------------------------------------------------------


def model_rows(
    records: Sequence[ModelRecord],
    infos: Mapping[str, ModelInfo | None],
    engines: Sequence[EngineStatistics],
    *,
    queues: Mapping[str, tuple[int, int]],
    residents: Mapping[str, ResidentStatistics],
    footprint: Callable[[str], int | None],
    rss: Mapping[int, int | None],
) -> list[dict[str, Any]]:
    """Every installed model (and any engine whose model is no longer in the store), with
    its engine's state when it has one. ``infos``: digest → GGUF facts; ``queues``: model →
    (running, queued) from admission; ``residents``: model → keep-alive facts; ``rss``: pid →
    resident bytes of its process tree."""
    by_model = {e.model: e for e in engines}
    rows: list[dict[str, Any]] = []
    for record in records:
        rows.append(_model_row(record, infos.get(record.digest), by_model.pop(record.name, None)))
    for stats in by_model.values():  # engines of models removed since they were made
        rows.append(_model_row(None, None, stats, name=stats.model))
    engine_of = {e.model: e for e in engines}
    for row in rows:
        name = row["name"]
        engine = engine_of.get(name)
        running, queued = queues.get(name, (0, 0))
        resident = residents.get(name)
        row["busy"] = max(running, engine.in_flight if engine is not None else 0)
        row["queued"] = queued
        row["memory_bytes"] = footprint(name) if row["loaded"] else None
        row["rss_bytes"] = rss.get(engine.pid) if engine is not None and engine.pid else None
        row["expires_at"] = resident.expires_at if resident is not None and resident.loaded else None
    return rows


def _model_row(
    record: ModelRecord | None, info: ModelInfo | None, stats: EngineStatistics | None, *, name: str = ""
) -> dict[str, Any]:
    loaded = stats is not None and stats.state in _LOADED
    return {
        "name": record.name if record is not None else name,
        "size_bytes": record.size if record is not None else None,
        "quant": info.file_type if info is not None else None,
        "ctx_train": info.context_length if info is not None else None,
        "capabilities": (
            model_capabilities(
                embedding=record.kind == "embedding",
                rerank=record.kind == "rerank",
                tools=True,
                vision=record.projector is not None,
            )
            if record is not None
            else []
        ),
        "source": record.source if record is not None else None,
        "loaded": loaded,
        "state": stats.state if stats is not None else None,
        "engine": stats.engine if stats is not None else None,
        "pid": stats.pid if stats is not None else None,
        "port": stats.port if stats is not None else None,
        "slots": stats.slots if stats is not None else None,
        "busy": 0,
        "queued": 0,
        "ctx_per_slot": (stats.ctx_served or stats.ctx_per_slot) if stats is not None else None,
        "memory_bytes": None,
        "rss_bytes": None,
        "expires_at": None,
        "restarts": stats.restarts if stats is not None else 0,
        "last_error": stats.last_error if stats is not None else None,
        "lane": stats.lane if stats is not None else None,
        "engine_version": stats.version if stats is not None else None,
        "breaker": stats.breaker if stats is not None else None,
        "breaker_retry_after_s": stats.breaker_retry_after_s if stats is not None else None,
        "stderr_tail": stats.stderr_tail if stats is not None else None,
    }


_ENDED = ("completed", "failed", "cancelled")


def job_results(job: JobRecord, files: Collection[str] = ()) -> list[dict[str, str]]:
    """Where an ended job's results are read, on its own dialect's routes: a background
    response's object, an Anthropic batch's results, an OpenAI batch's output and error
    files (those of ``files``, the file ids that exist). None for a pull or a running job."""
    if job.state not in _ENDED:
        return []
    if job.kind == background.KIND:
        return [{"label": "response", "url": f"/v1/responses/{job.id}", "filename": f"{job.id}.json"}]
    if job.kind != batch_runner.KIND:
        return []
    if job.id.startswith("msgbatch_"):
        url = f"/v1/messages/batches/{job.id}/results"
        return [{"label": "results", "url": url, "filename": f"{job.id}.jsonl"}]
    out_id, err_id = batch_runner.output_file_ids(job.id)
    return [
        {"label": label, "url": f"/v1/files/{file_id}/content", "filename": f"{job.id}_{label}.jsonl"}
        for label, file_id in (("output", out_id), ("errors", err_id))
        if file_id in files
    ]


def job_row(
    job: JobRecord, last_progress: Mapping[str, Any] | None = None, files: Collection[str] = ()
) -> dict[str, Any]:
    """One job; ``last_progress``: a pull's latest progress event (completed/total bytes);
    ``files``: the batch files that exist (``job_results``)."""
    progress: float | None = None
    detail: str | None = job.error
    if job.state == "completed":
        progress = 1.0
    elif last_progress is not None:
        total, done = last_progress.get("total"), last_progress.get("completed")
        if isinstance(total, int) and isinstance(done, int) and total > 0:
            progress = min(1.0, max(0.0, done / total))
        status = last_progress.get("status")
        if detail is None and isinstance(status, str):
            detail = status
    else:
        total, done = job.progress.get("total"), job.progress.get("completed")
        if isinstance(total, int | float) and isinstance(done, int | float) and total > 0:
            progress = min(1.0, max(0.0, done / total))
    if detail is None and job.model:
        detail = job.model
    return {
        "id": job.id,
        "kind": job.kind,
        "state": job.state,
        "progress": progress,
        "created_at": job.created_at,
        "detail": detail,
        "results": job_results(job, files),
    }


def memory_of(census: Census, budget: int | None) -> dict[str, Any]:
    return {
        "total_bytes": census.ram_total or None,
        "available_bytes": census.ram_available if census.ram_total else None,
        "budget_bytes": budget,
        "gpus": [{"name": g.name, "total_bytes": g.total, "free_bytes": g.free} for g in census.gpus],
    }


def class_rows(classes: Iterable[ClassStatistics]) -> list[dict[str, Any]]:
    """Each request class: waiting and running now, and since the start its grants, mean
    wait, refusals (queue full), timeouts and preemptions (docs/scheduling.md)."""
    return [
        {
            "name": c.name,
            "queued": c.queued,
            "running": c.running,
            "granted": c.granted,
            "mean_wait_ms": round(c.waited_s / c.granted * 1000, 1) if c.granted else None,
            "rejected": c.rejected,
            "expired": c.expired,
            "preempted": c.preempted,
        }
        for c in classes
    ]


def peer_rows(peers: Iterable[PeerView], pools: Iterable[PoolView]) -> list[dict[str, Any]]:
    """Each peer as last polled (never polled here: a snapshot reads what the peers' actors
    keep), with a pool router's workers as it lists them and, for a router started here, its
    process and the workers this daemon gives it."""
    by_entry = {p.name: p for p in pools}
    rows = []
    for v in peers:
        pool = by_entry.get(v.remote)
        workers = v.snapshot.workers if v.snapshot is not None else None
        rows.append(
            {
                "name": v.name,
                "url": v.url,
                "state": str(v.state),
                "kind": v.kind,
                "pool": v.pool,
                "snapshot_age_s": v.snapshot_age_s,
                "last_error": v.last_error,
                "loaded": [m.model for m in v.snapshot.loaded] if v.snapshot is not None else [],
                "workers": msgspec.to_builtins(workers) if workers is not None else None,
                "router": msgspec.to_builtins(pool.started) if pool is not None and pool.started else None,
                "registrations": msgspec.to_builtins(pool.registrations) if pool is not None else [],
            }
        )
    return rows


def card_rows(cards: Iterable[Card], position: Callable[[Card], int | None]) -> list[CardRow]:
    return [CardRow(c.key, c.model, msgspec.to_builtins(c.view(position(c)))) for c in cards]


# -- gathering ----------------------------------------------------------


def _pull_progress(jobs_path: Any, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each running pull's latest progress event."""
    found: dict[str, dict[str, Any]] = {}
    for job_id in job_ids:
        rows = read_rows(
            jobs_path,
            "SELECT data FROM job_events WHERE job_id = ? AND kind = 'progress' ORDER BY seq DESC LIMIT 1",
            (job_id,),
        )
        if rows:
            found[job_id] = msgspec.json.decode(rows[0][0])
    return found


def _read_jobs(jobs_path: Any) -> list[dict[str, Any]]:
    active = [
        *read_jobs(jobs_path, state="running", limit=100),
        *read_jobs(jobs_path, state="queued", limit=100),
    ]
    seen = {j.id for j in active}
    recent = [j for j in read_jobs(jobs_path, limit=_JOBS_RECENT + len(active)) if j.id not in seen]
    jobs = sorted([*active, *recent[:_JOBS_RECENT]], key=lambda j: j.created_at, reverse=True)
    pulls = _pull_progress(jobs_path, [j.id for j in jobs if j.kind == "pull" and j.state == "running"])
    files = _batch_files(jobs_path, [j.id for j in jobs if j.kind == batch_runner.KIND and j.state in _ENDED])
    return [job_row(j, pulls.get(j.id), files) for j in jobs]


def _batch_files(ledger_path: Any, batch_ids: Sequence[str]) -> set[str]:
    """Which output and error files of these (OpenAI) batches exist."""
    wanted = [f for b in batch_ids if b.startswith("batch_") for f in batch_runner.output_file_ids(b)]
    if not wanted:
        return set()
    marks = ",".join("?" * len(wanted))
    return {row[0] for row in read_rows(ledger_path, f"SELECT id FROM files WHERE id IN ({marks})", wanted)}


async def gather(
    runtime: Runtime, telemetry: Telemetry, cards: Cards, infos: dict[str, ModelInfo | None]
) -> Shared:
    """Read every source once. ``infos`` caches GGUF facts by digest across snapshots."""
    stats = runtime.statistics()
    queues = {q.model: (q.running, q.queued) for q in stats.admission.queues}
    residents = {r.model: r for r in stats.lifecycle.models}
    pids = [e.pid for e in stats.engines if e.pid]
    store = runtime.store

    def read() -> tuple[list[ModelRecord], Census, dict[int, int | None], list[dict[str, Any]]]:
        records = store.list()
        for r in records:
            if r.digest not in infos:
                try:
                    infos[r.digest] = store.info(r)
                except Exception:  # a file that is not GGUF, or unreadable: shown without
                    infos[r.digest] = None
        try:
            jobs = _read_jobs(runtime.jobs.path)
        except Exception:  # the ledger busy or not yet made: no jobs this tick
            jobs = []
        return records, take_census(pids), {p: tree_rss(p) for p in pids}, jobs

    records, census, rss, jobs = await trio.to_thread.run_sync(read)
    models = model_rows(
        records,
        infos,
        stats.engines,
        queues=queues,
        residents=residents,
        footprint=runtime.memory.footprint,
        rss=rss,
    )
    held = sum(m["memory_bytes"] or 0 for m in models)
    admission = runtime.admission

    def position(card: Card) -> int | None:
        if card.state is CardState.QUEUED and card.model and card.waiter_id is not None:
            return admission.position(card.model, card.waiter_id)
        return None

    now = time.time()
    return Shared(
        time=now,
        models=models,
        requests=card_rows(list(cards.live.values()), position),
        recent=card_rows(itertools.islice(reversed(cards.finished), RECENT), position),
        rates=telemetry.series.rates(now),
        series=telemetry.series.points(now),
        quantiles=telemetry.summary()["models"],  # type: ignore[arg-type]
        jobs=jobs,
        memory=memory_of(census, runtime.memory.budget(held)),
        classes=class_rows(stats.admission.classes),
        peers=peer_rows(runtime.peers.views() if runtime.peers else [], runtime.pools.views()),
        built_s=trio.current_time(),
    )


# -- one viewer -------------------------------------------------------


def viewer_of(key: str | None, grant: Key | None) -> dict[str, Any]:
    """Who is looking: no grant is a daemon without keys (everything is open)."""
    if grant is None:
        return {"key": key, "admin": True, "scopes": list(FAMILIES)}
    return {"key": key, "admin": grant.allows_family(ADMIN), "scopes": list(grant.families)}


def view_for(shared: Shared, *, key: str | None, grant: Key | None) -> dict[str, Any]:
    """The snapshot one viewer gets: the models its key may use, and the requests it may see
    (all for an admin key or no keys, else only its own, as ``GET /v1/requests``)."""
    admin = grant is None or grant.allows_family(ADMIN)

    def visible_model(name: str | None) -> bool:
        return grant is None or name is None or grant.allows_model(name)

    def visible(row: CardRow) -> bool:
        return admin or (grant is not None and row.key == grant.name)

    return {
        "time": shared.time,
        "version": __version__,
        "viewer": viewer_of(key, grant),
        "models": [
            m if admin else {**m, "stderr_tail": None} for m in shared.models if visible_model(m["name"])
        ],
        "requests": [r.view for r in shared.requests if visible(r)],
        "recent": [r.view for r in shared.recent if visible(r)],
        "rates": shared.rates,
        "series": shared.series,
        "quantiles": {m: q for m, q in shared.quantiles.items() if visible_model(m)},
        "jobs": shared.jobs,
        "memory": shared.memory,
        "classes": shared.classes if admin else [],
        "peers": shared.peers if admin else [],
    }
