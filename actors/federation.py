"""The federation's decision: which machine serves a model, from what each peer last published.

Pure functions, no I/O and no trio: ``parse_capacity`` and ``parse_models`` turn a peer's
``GET /api/capacity`` (a Blazar daemon) or ``GET /v1/models`` (any OpenAI-compatible server:
a pass-through peer) into a ``Snapshot``; ``decide`` ranks the candidates for one model.

The rule, in order: a down peer, or one that does not have the model, is skipped; the model
warm here wins outright; then warm before cold; then the shortest expected queue wait; then
the most memory left once the model's estimate is taken from the machine's free memory; then
this machine before a peer, a Blazar peer before a pass-through one, and the name.

The decision's inputs come from the runtime, at the end of the module: ``peer_candidate`` reads
a peer's last snapshot, ``local_candidate`` this machine (its engines, queues and, when warmth
does not decide, a census); ``decision_for(runtime, model)`` decides over both, as the gateway
does for a request and for ``GET /api/route/MODEL``; ``peer_targets`` is where a request for
``remote:PEER/MODEL`` goes. Relaying the request's bytes there is the gateway's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import msgspec
import trio

from actors.census import take_census
from actors.engine import EngineState
from actors.errors import PeerIsSelf, PeerUnavailable

if TYPE_CHECKING:
    from actors.peer import PeerActor, PeerView
    from actors.peers import Peers
    from actors.runtime import Runtime

__all__ = [
    "LOCAL",
    "Candidate",
    "Decision",
    "InstalledModel",
    "LoadedModel",
    "PoolWorker",
    "Ranked",
    "Snapshot",
    "SnapshotError",
    "decide",
    "decision_for",
    "expected_wait_s",
    "local_candidate",
    "parse_capacity",
    "parse_models",
    "parse_workers",
    "peer_candidate",
    "peer_targets",
    "pool_snapshot",
    "same_model",
]

LOCAL = "local"
"""The name this machine has among the candidates."""


class SnapshotError(ValueError):
    """A peer's answer could not be read as capacity or as a model list."""


class LoadedModel(msgspec.Struct, frozen=True, kw_only=True):
    """One model running on a peer, as ``GET /api/capacity`` publishes it."""

    model: str
    state: str = "ready"
    slots: int = 0
    in_flight: int = 0
    queued: int = 0
    expected_wait_s: float = 0.0
    estimated_bytes: int | None = None


class InstalledModel(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    size_bytes: int | None = None
    kind: str = "chat"
    digest: str | None = None
    """Its main file's ``sha256:`` digest (None from a pass-through peer or an older daemon)."""


class PoolWorker(msgspec.Struct, frozen=True, kw_only=True):
    """One worker of a pool router, as the router lists it (SMG's ``GET /workers``)."""

    url: str
    id: str | None = None
    model: str | None = None
    """The model the router found on it (None: not discovered yet, or any)."""
    healthy: bool | None = None
    status: str | None = None
    """The router's word for it: ``ready``, ``pending``, ``draining``…"""
    load: int | None = None
    """Requests it has in flight, as the router counts them."""


class _SmgModel(msgspec.Struct, kw_only=True):
    id: str


class _SmgWorker(msgspec.Struct, kw_only=True):
    url: str
    id: str | None = None
    model_id: str | None = None
    models: list[_SmgModel] = []
    is_healthy: bool | None = None
    status: str | None = None
    load: int | None = None


class _SmgWorkers(msgspec.Struct, kw_only=True):
    workers: list[_SmgWorker]


def parse_workers(body: bytes) -> list[PoolWorker]:
    """A pool router's worker list (SMG's ``GET /workers``)."""
    try:
        doc = msgspec.json.decode(body, type=_SmgWorkers)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotError(f"not a router's worker list: {exc}") from None
    return [
        PoolWorker(
            url=w.url,
            id=w.id,
            model=w.model_id or (w.models[0].id if w.models else None),
            healthy=w.is_healthy,
            status=w.status,
            load=w.load,
        )
        for w in sorted(doc.workers, key=lambda w: w.url)
    ]


def pool_snapshot(workers: list[PoolWorker]) -> Snapshot:
    """A pool router as a pass-through peer: the models of its workers, and the workers."""
    models = sorted({w.model for w in workers if w.model is not None})
    return Snapshot(kind="openai", installed=[InstalledModel(name=m) for m in models], workers=workers)


class _CapacityDoc(msgspec.Struct, kw_only=True):
    """The parts of a peer's capacity the decision reads (older daemons lack some: defaults)."""

    census: dict[str, object]
    daemon: str = "blazar"
    version: str | None = None
    instance: str | None = None
    free_bytes: int | None = None
    memory_budget_bytes: int | None = None
    models: list[LoadedModel] = []
    installed: list[InstalledModel] = []
    lanes: list[str] = []


class _ModelEntry(msgspec.Struct, kw_only=True):
    id: str


class _ModelsDoc(msgspec.Struct, kw_only=True):
    data: list[_ModelEntry]


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What one peer last said about itself."""

    kind: Literal["blazar", "openai"]
    """``openai``: a pass-through peer (its model list only, no capacity)."""
    version: str | None = None
    instance: str | None = None
    """The daemon's id for this boot: a daemon that finds its own among its peers skips it."""
    free_bytes: int | None = None
    memory_budget_bytes: int | None = None
    loaded: list[LoadedModel] = []
    installed: list[InstalledModel] = []
    lanes: list[str] = []
    workers: list[PoolWorker] | None = None
    """A pool router's workers, with their health (None: not a pool)."""

    def has(self, model: str) -> bool:
        return any(same_model(m.name, model) for m in self.installed)

    def loaded_model(self, model: str) -> LoadedModel | None:
        return next(
            (m for m in self.loaded if same_model(m.model, model) and m.state in ("ready", "starting")), None
        )

    def size_of(self, model: str) -> int | None:
        return next((m.size_bytes for m in self.installed if same_model(m.name, model)), None)


def same_model(a: str, b: str) -> bool:
    """Whether two names are one model (``name`` and ``name:latest`` are)."""
    return a.removesuffix(":latest") == b.removesuffix(":latest")


def parse_capacity(body: bytes) -> Snapshot:
    try:
        doc = msgspec.json.decode(body, type=_CapacityDoc)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotError(f"not a Blazar capacity document: {exc}") from None
    free = doc.free_bytes
    if free is None:  # a daemon from before free_bytes: the census's RAM
        ram = doc.census.get("ram_available")
        free = ram if isinstance(ram, int) else None
    return Snapshot(
        kind="blazar",
        version=doc.version,
        instance=doc.instance,
        free_bytes=free,
        memory_budget_bytes=doc.memory_budget_bytes,
        loaded=doc.models,
        installed=doc.installed,
        lanes=doc.lanes,
    )


def parse_models(body: bytes) -> Snapshot:
    """A pass-through peer's ``/v1/models`` (OpenAI's list shape)."""
    try:
        doc = msgspec.json.decode(body, type=_ModelsDoc)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotError(f"not an OpenAI model list: {exc}") from None
    return Snapshot(kind="openai", installed=[InstalledModel(name=m.id) for m in doc.data])


def expected_wait_s(*, slots: int, running: int, queued: int, service_s: float | None) -> float:
    """How long a new request would wait for a slot: nothing while one is free; else its place
    in the queue over the slots, times a request's measured service time (1 s unmeasured)."""
    if slots <= 0 or (running < slots and queued == 0):
        return 0.0
    return round((queued + 1) / slots * (service_s if service_s is not None else 1.0), 3)


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A machine that could serve the model, as the decision sees it."""

    where: str
    """``local``, or the peer's name."""
    up: bool = True
    reason: str | None = None
    """Why a peer is down (with ``up`` false)."""
    has_model: bool = True
    warm: bool = False
    expected_wait_s: float | None = None
    free_bytes: int | None = None
    fit_bytes: int | None = None
    """The model's estimated need there (its size when nothing better is known)."""
    pass_through: bool = False
    age_s: float | None = None
    """How old the snapshot it was built from is."""


class Ranked(msgspec.Struct, frozen=True, kw_only=True):
    where: str
    rank: int | None
    """1 for the winner; None for a skipped candidate."""
    warm: bool
    expected_wait_s: float | None
    free_bytes: int | None
    fit_bytes: int | None
    headroom_bytes: int | None
    """Free memory once the model's estimate is taken from it."""
    pass_through: bool
    age_s: float | None
    skipped: str | None = None
    """Why it is not a candidate (down, does not have the model)."""


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    winner: str | None
    """``local``, a peer's name, or None: nowhere can serve it."""
    why: str
    candidates: list[Ranked]


def _headroom(c: Candidate) -> int | None:
    if c.free_bytes is None:
        return None
    return c.free_bytes - (c.fit_bytes or 0)


def _key(c: Candidate) -> tuple[int, float, float, int, int, str]:
    local = c.where == LOCAL
    head = _headroom(c)
    return (
        0 if (local and c.warm) else 1 if c.warm else 2,
        c.expected_wait_s if c.expected_wait_s is not None else math.inf,
        -head if head is not None else math.inf,
        0 if local else 1,
        1 if c.pass_through else 0,
        c.where,
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _why(winner: Candidate, runner: Candidate | None) -> str:
    name = "this machine" if winner.where == LOCAL else f"peer '{winner.where}'"
    if runner is None:
        state = "warm" if winner.warm else "cold"
        return f"{name}: the only candidate that has the model ({state} there)"
    other = "this machine" if runner.where == LOCAL else f"'{runner.where}'"
    if winner.where == LOCAL and winner.warm:
        return f"{name}: the model is warm here (local is preferred when warm)"
    if winner.warm and not runner.warm:
        return f"{name}: the model is warm there ({other} would have to load it)"
    w, r = winner.expected_wait_s, runner.expected_wait_s
    if w is not None and (r is None or w < r):
        against = f"{r:.1f} s on {other}" if r is not None else f"unknown on {other}"
        return f"{name}: the shortest expected queue wait ({w:.1f} s against {against})"
    hw, hr = _headroom(winner), _headroom(runner)
    if hw is not None and (hr is None or hw > hr):
        against = _gib(hr) if hr is not None else "unknown"
        return (
            f"{name}: the most free memory after the model's estimate "
            f"({_gib(hw)} against {against} on {other})"
        )
    return f"{name}: equal on warmth, queue wait and memory; picked by order (this machine, then by name)"


def decide(model: str, candidates: list[Candidate]) -> Decision:
    """Rank ``candidates`` for ``model`` (see the module doc); every one is reported with its
    numbers, the skipped ones with why."""
    usable = [c for c in candidates if c.up and c.has_model]
    ordered = sorted(usable, key=_key)
    rows: list[Ranked] = []
    for i, c in enumerate(ordered):
        rows.append(_row(c, rank=i + 1))
    for c in candidates:
        if not c.up:
            rows.append(_row(c, skipped=f"down: {c.reason or 'not reachable'}"))
        elif not c.has_model:
            rows.append(_row(c, skipped="does not have the model"))
    if not ordered:
        down = [c.where for c in candidates if not c.up]
        why = "no machine has the model"
        if down:
            why += f" among those reachable (down: {', '.join(down)})"
        return Decision(model=model, winner=None, why=why, candidates=rows)
    winner = ordered[0]
    runner = ordered[1] if len(ordered) > 1 else None
    return Decision(model=model, winner=winner.where, why=_why(winner, runner), candidates=rows)


def _row(c: Candidate, *, rank: int | None = None, skipped: str | None = None) -> Ranked:
    return Ranked(
        where=c.where,
        rank=rank,
        warm=c.warm,
        expected_wait_s=c.expected_wait_s,
        free_bytes=c.free_bytes,
        fit_bytes=c.fit_bytes,
        headroom_bytes=_headroom(c),
        pass_through=c.pass_through,
        age_s=c.age_s,
        skipped=skipped,
    )


# -- the decision's inputs, read from the runtime ---------------------------------------------------


def peer_candidate(view: PeerView, model: str) -> Candidate:
    """A peer as a candidate for ``model``, from what it last published."""
    snap = view.snapshot
    if view.state != "up" or snap is None:
        reason = view.last_error or ("not polled yet" if view.state == "unknown" else None)
        return Candidate(where=view.name, up=False, reason=reason, age_s=view.snapshot_age_s)
    loaded = snap.loaded_model(model)
    return Candidate(
        where=view.name,
        has_model=snap.has(model),
        warm=loaded is not None,
        expected_wait_s=loaded.expected_wait_s if loaded is not None else None,
        free_bytes=snap.free_bytes,
        fit_bytes=(loaded.estimated_bytes if loaded is not None else None) or snap.size_of(model),
        pass_through=snap.kind == "openai",
        age_s=view.snapshot_age_s,
    )


async def local_candidate(runtime: Runtime, model: str, *, measure: bool) -> Candidate:
    """This machine as a candidate for ``model``; ``measure``: read its free memory too (a
    census: only when warmth alone does not decide)."""
    engine = runtime.engine_named(model)
    record = None
    if engine is None:
        record = await trio.to_thread.run_sync(runtime.store.find, model)
        if record is None:
            return Candidate(where=LOCAL, has_model=False)
        engine = runtime.engine_named(record.name)
    warm = engine is not None and engine.state in (EngineState.READY, EngineState.STARTING)
    wait = None
    if warm and engine is not None:
        q = next((q for q in runtime.admission.statistics().queues if q.model == engine.spec.model), None)
        wait = (
            expected_wait_s(
                slots=engine.spec.slots, running=q.running, queued=q.queued, service_s=q.service_s
            )
            if q is not None
            else 0.0
        )
    free = fit = None
    if measure:
        census = await trio.to_thread.run_sync(take_census)
        free = sum(g.free for g in census.gpus) if census.gpus else census.ram_available
        name = engine.spec.model if engine is not None else model
        fit = runtime.memory.footprint(name) or (record.size if record is not None else None)
    return Candidate(where=LOCAL, warm=warm, expected_wait_s=wait, free_bytes=free, fit_bytes=fit)


async def decision_for(runtime: Runtime, model: str, *, measure: bool = True) -> Decision:
    """Which machine serves ``model`` now: this one or a peer (``runtime.peers``)."""
    local = await local_candidate(runtime, model, measure=measure)
    if (over := runtime.config.models.get(model)) is not None and over.nodes:
        return decide(model, [local])  # the head of its own multi-node engine: its workers are peers
    # A peer that is this daemon (its own address in a dns remote's answer) is no candidate:
    # this machine already is one.
    peers = [peer_candidate(v, model) for v in runtime.peers.views() if v.state != "self"]
    return decide(model, [local, *peers])


def _any(_row: Ranked) -> bool:
    return True


def peer_targets(
    peers: Peers, peer: str, model: str, *, speaks: Callable[[Ranked], bool] = _any
) -> list[PeerActor]:
    """Where ``remote:PEER/MODEL`` goes: that peer, or for the name of a ``dns`` remote its
    peers that have the model, best first; ``speaks``: whether a ranked peer can be asked
    (a pass-through peer speaks OpenAI's routes only). Raises ``PeerIsSelf``,
    ``PeerNotFound`` or ``PeerUnavailable``."""
    actor = peers.get(peer)
    if actor is not None:
        if actor.state == "self":
            raise PeerIsSelf(
                f"peer '{peer}' is this daemon itself — ask for '{model}' without remote: to have it "
                "served here"
            )
        if actor.state == "down":
            raise PeerUnavailable(
                f"peer '{peer}' is down ({actor.last_error}) — see `blazar peers`; it is used again "
                "once a poll finds it up"
            )
        return [actor]
    group = peers.members(peer)
    if not group:
        raise peers.not_found(peer)
    decision = decide(model, [peer_candidate(a.view(), model) for a in group if a.state != "self"])
    members = {a.peer: a for a in group}
    ranked = [members[r.where] for r in decision.candidates if r.rank is not None and speaks(r)]
    if not ranked:
        raise PeerUnavailable(f"no peer of '{peer}' can serve '{model}' now: {decision.why}")
    return ranked
