"""``Runtime``: the root of the actor tree, embeddable without the HTTP layer
(``actors.runtime_open.open_runtime`` starts the tree and hands it over).

    runtime (supervisor)
    ├ ledger            SQLite writer (WAL), one per home
    ├ jobs              durable long work (pulls; the gateway's background responses, batches)
    ├ admission         queues, slots and leases of every model
    ├ engines (supervisor)
    │   └ engine[model] → child process (llama.cpp)
    ├ mcp (supervisor)
    │   └ mcp[server]   → MCP server (stdio child or HTTP session), started on first use
    ├ pools (only with a pool entry in [[remotes]])
    │   ├ router[name]  → ``smg launch``, a child process (start = true)
    │   └ workers[name] → registers the pool's workers with its router (actors/pool.py)
    ├ peers (supervisor, only with [[remotes]])
    │   └ peer[name]    → polls the peer's capacity (actors/peer.py)
    ├ parts             multi-node engine parts run here for a head daemon (actors/node_parts.py)
    └ lifecycle         keep-alive timers, LRU eviction under max_loaded_models and memory


Every request goes through ``rt.claim`` (admission slot, eviction if needed, a
ready engine, a lease; released once, then the keep-alive timer re-armed):

    async with open_runtime(cfg) as rt:
        async with rt.claim("smollm2-135m") as claim:
            resp = await claim.handle.client.post("/v1/chat/completions", json={...})

``examples/embed.py`` is a complete program.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal, Unpack

import msgspec
import trio

from actors import pulls
from actors.admission import AdmissionActor, AdmissionStatistics
from actors.certificates import CertificateBook
from actors.claim import ClaimOptions, ClaimRequest
from actors.config import RuntimeConfig
from actors.context import choose_context, slot_ceiling
from actors.coreside import Coresidence, budget_source, resident_rows, verdict
from actors.engine import (
    EngineActor,
    EngineHandle,
    EngineState,
    EngineStatistics,
    EnsureReady,
    Reconfigure,
    StopEngine,
    WaitSpawned,
)
from actors.engines.llamacpp import LaunchSpec
from actors.engines.routing import LANES, lane_for
from actors.engines.spec import SpecLoad
from actors.engines.versions import BUNDLED, Versions
from actors.errors import ActorStopped, EngineCrashed, VisionProjectorMissing
from actors.failover import FailoverChains
from actors.jobs import JobRecord, JobsActor, JobsStatistics
from actors.ledger import LedgerActor, LedgerStatistics
from actors.lifecycle import LifecycleActor, LifecycleStatistics, LoadPreview, ModelLifecycle
from actors.mcp import McpServers
from actors.memory import MemoryPlanner
from actors.multinode_head import head_lane
from actors.node_parts import NodeParts
from actors.peers import Peers
from actors.planning import (
    LoadPlan,
    context_note,
    launch_spec_for,
    make_plan,
    plan_resolve,
    resolve_for,
    side_spec_for,
    unsupported_preview,
)
from actors.pool import Pools
from actors.rpc_fallback import workers_ready
from actors.sessions import model_dir
from actors.settings import Explanation, explain_running
from actors.speculation import SpeculationBook
from actors.supervisor import ChildSpec, Restart, Supervisor
from registry.catalog import Catalog
from registry.kinds import TEXT_KINDS, mismatch
from registry.store import ModelRecord, Store

__all__ = ["ReadyCard", "Runtime", "RuntimeStatistics"]

log = logging.getLogger("blazar.runtime")


class RuntimeStatistics(msgspec.Struct, frozen=True, kw_only=True):
    engines: list[EngineStatistics]
    ledger: LedgerStatistics
    jobs: JobsStatistics
    admission: AdmissionStatistics
    lifecycle: LifecycleStatistics
    reaped_orphans: list[int]


class ReadyCard(msgspec.Struct, frozen=True, kw_only=True):
    """A model made ready by ``Runtime.load``, as it runs now."""

    model: str
    engine: str
    lane: str
    version: str | None
    pid: int | None
    slots: int
    ctx_per_slot: int
    """What the running engine serves per slot."""
    ctx_asked: int | None
    """The context asked for, when it was lowered to what the model can serve."""
    memory_bytes: int | None
    """The estimated footprint at these settings (None: unknown)."""
    evicted: list[str]
    load_s: float
    keep_alive_s: float | None
    vision: bool


class Runtime:
    """Handles to the tree's actors. Requests reach engines through ``engine_for``."""

    def __init__(
        self,
        config: RuntimeConfig,
        *,
        store: Store,
        catalog: Catalog,
        root: Supervisor,
        engines: Supervisor,
        ledger: LedgerActor,
        admission: AdmissionActor,
        jobs: JobsActor | None = None,
        lifecycle: LifecycleActor | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.catalog = catalog
        self.root = root
        self.engines = engines
        self.ledger = ledger
        self.admission = admission
        self.jobs = jobs or JobsActor(ledger, data_dir=Path(config.home))
        """Long work: pulls (``pull``, registered by ``open_runtime``), and the kinds the
        embedder registers (the gateway's background responses, batches, …)."""
        self.memory = MemoryPlanner(config.memory_budget_mb)
        self.lifecycle = lifecycle or self._lifecycle_actor()
        self.mcp = McpServers(config.mcp, config.mcp_default, config.mcp_catalog)
        """The ``[[mcp]]`` servers (actors/mcp.py): each starts on its first use."""
        self.failover = FailoverChains(config.failover, federated=bool(config.remotes))
        """The ``[[failover]]`` chains and their targets' health (actors/failover.py)."""
        self.instance = secrets.token_hex(8)
        """This boot's id, published in ``GET /api/capacity``: a ``dns`` remote's answer holds this
        daemon's own address too (a Kubernetes headless service lists every pod), and the peer
        actor that reads its own id back marks that peer ``self``."""
        self.speculation = SpeculationBook(governor=config.spec_governor)
        """Drafted and accepted tokens per model, and the speculation governor's state."""
        self.pools = Pools(config.remotes, run_dir=Path(config.run_dir), grace_s=config.engine.stop_grace_s)
        """The pool entries of ``[[remotes]]``: routers started here, workers registered with
        them (actors/pool.py)."""
        self.peers = Peers(config.remotes, instance=self.instance, started=self.pools.started)
        """The ``[[remotes]]`` peers and what each last published (actors/peer.py); empty: no
        federation, nothing leaves the machine."""
        self.parts = NodeParts(lambda: self.config, store)
        """The parts of multi-node engines this daemon runs for a head daemon (actors/node_parts.py)."""
        self.certificates = CertificateBook.load(ledger.path)
        """The newest capability certificate of each model (actors/certificates.py), which
        admission checks requests against."""
        self._engines: dict[str, EngineActor] = {}
        self._lock = trio.Lock()
        self.reaped_orphans: list[int] = []
        self.preloaded = trio.Event()
        """Set once the models to preload at start have loaded or failed (at once without any)."""
        self._nursery: trio.Nursery | None = None

    def __repr__(self) -> str:
        return f"<Runtime home={self.config.home} engines={len(self._engines)}>"

    def launch_spec(
        self, record: ModelRecord, kinds: frozenset[str] = TEXT_KINDS, *, config: RuntimeConfig | None = None
    ) -> LaunchSpec:
        parked = self.speculation.parked(record.name)
        return launch_spec_for(config or self.config, self.store, record, kinds, parked=parked)

    def note_drafts(self, model: str, drafted: int, accepted: int) -> None:
        """A request on ``model`` ended having drafted ``drafted`` tokens (``accepted`` kept):
        counted, and given to the governor, which may park or resume speculation."""
        effect = self.speculation.observe(model, drafted, accepted, now_s=trio.current_time())
        engine = self._engines.get(model)
        if effect is None or engine is None or self._nursery is None:
            return
        log.warning("'%s': speculation %s", model, self.speculation.parked(model) or "resumed")

        async def apply() -> None:
            change: SpecLoad | Literal["off"] = "off"
            if effect == "resume":
                record = await trio.to_thread.run_sync(self.store.get, model)
                spec = await trio.to_thread.run_sync(self.launch_spec, record)
                change = spec.speculation or "off"
            with contextlib.suppress(ActorStopped):
                await engine.ask(Reconfigure(speculation=change))

        self._nursery.start_soon(apply)

    async def plan(self, model: str) -> LoadPlan:
        """The run decision for ``model`` as a load now would make it (``blazar plan``)."""
        record = await trio.to_thread.run_sync(self.store.get, model)
        resolved = await trio.to_thread.run_sync(plan_resolve, self.config, self.store, record)
        spec = resolved.spec
        engine = self._engines.get(spec.model)
        loaded = engine is not None and engine.state in (EngineState.READY, EngineState.STARTING)
        served = None
        if engine is not None and loaded:
            spec, served = engine.spec, engine.served_ctx  # as it runs (a num_ctx may have changed it)
        need = await self.memory.need(spec)
        preview = (
            LoadPreview(model=spec.model, need_bytes=need)
            if loaded
            else self.lifecycle.preview(spec.model, need)
        )
        runnable = resolved.refusal is None
        lane = engine.lane if engine is not None else None
        if lane is None and runnable:
            lane = await trio.to_thread.run_sync(lane_for, spec, self.config.engine, self.config.home)
        return make_plan(
            spec,
            self.config,
            self.memory,
            unsupported_preview(preview, resolved),
            loaded=loaded,
            served=served,
            route=resolved.route,
            lane=lane,
            runnable=runnable,
            rpc=resolved.rpc_split,
        )

    async def coreside(self, models: list[str]) -> Coresidence:
        """Would ``models`` fit together, each as it runs now or would start, in the budget a
        load is checked against now (``blazar coreside``)."""

        def specs() -> list[tuple[LaunchSpec, bool]]:
            found = []
            for name in models:
                record = self.store.get(name)
                engine = self._engines.get(record.name)
                if engine is not None and engine.state in (EngineState.READY, EngineState.STARTING):
                    found.append((engine.spec, True))
                else:
                    found.append((self.launch_spec(record), False))
            return found

        rows = await resident_rows(self.memory, await trio.to_thread.run_sync(specs))
        held = sum(
            self.memory.footprint(e.spec.model) or 0
            for e in self.loaded()
            if e.state in (EngineState.READY, EngineState.STARTING)
        )
        return verdict(rows, self.memory.budget(held), budget_source(self.config))

    async def switch_engines(self) -> list[str]:
        """Move every engine to its lane's active version (``blazar engine use`` and ``rollback``
        changed it): each finishes the requests it runs on the old one, then restarts on the new.
        A model that pins a version keeps it. Returns the models that move."""
        moved = []
        versions = Versions(self.config.home)
        active = await trio.to_thread.run_sync(lambda: {lane: versions.active_name(lane) for lane in LANES})
        for engine in self.loaded():
            over = self.config.models.get(engine.spec.alias or engine.spec.model)
            if over is not None and over.engine_version:
                continue
            name = active.get(engine.spec.lane, BUNDLED)
            wanted = None if name == BUNDLED else name
            if wanted == engine.spec.engine_version and engine.lane.release == wanted:
                continue
            spec = msgspec.structs.replace(engine.spec, engine_version=wanted)
            lane = await trio.to_thread.run_sync(lane_for, spec, self.config.engine, self.config.home)
            await engine.ask(Reconfigure(lane=lane))
            moved.append(engine.spec.model)
        return moved

    def engine_named(self, name: str) -> EngineActor | None:
        """The engine already made for ``name`` (a canonical name or one that resolved to it);
        None for a name no request has resolved yet. Never reads the store."""
        return self._engines.get(name)

    async def explain(self, model: str) -> Explanation:
        """The settings ``model`` runs with (or would, loaded now), and where each came from."""
        record = await trio.to_thread.run_sync(self.store.get, model)
        parked = self.speculation.parked(record.name)
        resolved = await trio.to_thread.run_sync(
            lambda: resolve_for(self.config, self.store, record, parked=parked)
        )
        engine = self._engines.get(record.name)
        loaded = engine is not None and engine.state in (EngineState.READY, EngineState.STARTING)
        running = engine.spec if engine is not None and loaded else None
        settings = explain_running(resolved, running)
        return Explanation(model=record.name, path=record.path, loaded=loaded, settings=settings)

    async def engine_for(
        self, model: str, lane: str | None = None, *, kinds: frozenset[str] = TEXT_KINDS
    ) -> EngineActor:
        """The engine actor of an installed model, created (not started) on first use.

        ``kinds``: what the caller's route serves (text by default; ``{"stt"}`` for
        transcription…); a model of another kind raises ``ModelKindMismatch``.

        ``lane`` asks for another lane than the model's own, one its ``lanes`` setting allows:
        that engine runs beside the other, as ``NAME@LANE`` (its own slots and queue).
        Raises ``registry.errors.ModelNotFound`` for a model that is not installed, and
        ``UnsupportedEngine`` for a lane the model may not run on.
        """
        key = model if lane is None else f"{model}@{lane}"
        engine = self._engines.get(key)
        if engine is not None:
            if engine.spec.kind not in kinds:
                raise mismatch(model, engine.spec.kind, "text" if kinds == TEXT_KINDS else min(kinds))
            return engine
        record = await trio.to_thread.run_sync(self.store.get, model)
        async with self._lock:
            engine = self._engines.get(record.name)
            if engine is None:
                spec = await trio.to_thread.run_sync(self.launch_spec, record, kinds)
                spec = await trio.to_thread.run_sync(self._with_sessions, spec, record)
                engine = await self._make_engine(record.name, spec)
            elif engine.spec.kind not in kinds:
                raise mismatch(model, engine.spec.kind, "text" if kinds == TEXT_KINDS else min(kinds))
            if model != record.name:
                self._engines[model] = engine
            if lane is not None and lane != engine.spec.lane:
                side = f"{record.name}@{lane}"
                engine = self._engines.get(side) or await self._make_engine(
                    side, await trio.to_thread.run_sync(self._side_spec, record, lane)
                )
                self._engines[key] = engine
        return engine

    async def side_engine(self, key: str, spec: LaunchSpec) -> EngineActor:
        """The engine kept under ``key`` for ``spec``, made (not started) on first use: an engine
        that runs a model differently beside its own (``actors/control.py``: steered)."""
        async with self._lock:
            engine = self._engines.get(key)
            if engine is None:
                engine = await self._make_engine(key, spec)
        return engine

    def _with_sessions(self, spec: LaunchSpec, record: ModelRecord) -> LaunchSpec:
        """``spec`` with the model's sessions folder (made here) where its engine can save
        slots: a llama.cpp engine that generates text (one that embeds or ranks keeps no
        prompt worth saving)."""
        if (
            spec.lane != "llamacpp"
            or spec.embeddings
            or spec.reranking
            or spec.kind in ("embedding", "rerank")
        ):
            return spec
        folder = model_dir(self.config.home, record.name)
        folder.mkdir(parents=True, exist_ok=True)
        return msgspec.structs.replace(spec, digest=record.digest, slot_save_path=str(folder))

    def _side_spec(self, record: ModelRecord, lane: str) -> LaunchSpec:
        return side_spec_for(self.config, self.store, record, lane)

    async def _make_engine(self, key: str, spec: LaunchSpec) -> EngineActor:
        if note := context_note(spec):
            level = logging.WARNING if spec.ctx_asked is not None else logging.INFO
            log.log(level, "'%s': context %s", spec.model, note)
        # Finding the lane's program looks at PATH and the data dir: off the event loop.
        lane = await trio.to_thread.run_sync(lane_for, spec, self.config.engine, self.config.home)
        if (over := self.config.models.get(spec.alias or spec.model)) is not None and over.nodes:
            lane = await trio.to_thread.run_sync(head_lane, lane, spec, self.config, self.store, self.peers)
        engine = EngineActor(
            spec,
            self.config.engine,
            run_dir=Path(self.config.run_dir),
            lane=lane,
            bank=self.config.session_bank,
        )
        await self.engines.start_child(ChildSpec(name=key, start=engine.run, restart=Restart.TRANSIENT))
        self._engines[key] = engine
        return engine

    def claim(self, model: str, **options: Unpack[ClaimOptions]) -> ClaimRequest:
        """Claim ``model``'s engine for one request (the request protocol, ``actors/claim.py``).

        ``await`` it for a ``Claim`` to ``release()`` later, or use it as ``async with``.
        ``ClaimOptions`` lists the options (priority, client, deadline, keep-alive).

        Raises ``registry.errors.ModelNotFound``, admission's refusals (queue full,
        deadline, timeout), the lifecycle's (no room to load) and the engine's
        (crashed, start timeout, breaker open).
        """
        return ClaimRequest(self, model, options)

    async def make_ready(self, engine: EngineActor) -> EngineHandle:
        """``engine``'s ready child, started if need be after making room for it."""
        handle, _ = await self.ready(engine)
        return handle

    async def ready(self, engine: EngineActor) -> tuple[EngineHandle, tuple[str, ...]]:
        """``make_ready``, and the models evicted to make room for ``engine``."""
        handle = engine.ready_handle()
        evicted: tuple[str, ...] = ()
        if handle is None:
            if engine.state is not EngineState.READY:
                if engine.state is not EngineState.STARTING:
                    await workers_ready(self, engine)  # a split model's RPC workers
                evicted = await self.before_load(engine)  # max_loaded_models and memory
            handle = await engine.ask(EnsureReady())
        return handle, evicted

    async def load(
        self,
        model: str,
        *,
        ctx: int | None = None,
        slots: int | None = None,
        keep_alive_s: float | None = None,
        vision: bool = False,
    ) -> ReadyCard:
        """Make ``model``'s engine ready now, through the request protocol (``claim``: an
        admission slot, room made for it, a lease, released at once), and say how it runs.

        ``ctx`` (per slot; clamped to what the model can serve as a request's ``num_ctx`` is,
        or refused with ``ContextTooLarge`` in strict mode) and ``slots`` restart the engine
        with them once its requests end. ``keep_alive_s`` arms its idle timer as a request's
        keep-alive would; ``vision`` refuses a model without a vision projector
        (``VisionProjectorMissing``). Raises what ``claim`` raises, and ``ModelKindMismatch``
        for a model that is not a text model."""
        engine = await self.engine_for(model)
        spec = engine.spec
        if vision and spec.projector is None:
            raise VisionProjectorMissing(
                f"model '{spec.model}' reads no images (it has no vision projector) — pick a model "
                "that has one (`blazar show NAME` lists its capabilities), or give it its mmproj "
                f"file: `blazar mmproj {spec.model} FILE.gguf`"
            )
        per_slot = clamped = None
        if ctx is not None:
            ceiling = slot_ceiling(spec.ctx_limit, spec.ctx_per_slot, engine.served_ctx)
            choice = choose_context(ctx, ceiling, strict=self.config.strict, model=spec.model, what="ctx")
            per_slot, clamped = choice.ctx, (ctx if choice.clamped else None)
        slots = slots if slots is not None and slots != spec.slots else None
        serving = engine.served_ctx or spec.ctx_per_slot
        if slots is not None or (per_slot is not None and per_slot != serving):
            base = msgspec.structs.replace(spec, slots=slots) if slots is not None else None
            await engine.ask(Reconfigure(ctx_per_slot=per_slot, spec=base))
        async with self.claim(model, keep_alive_s=keep_alive_s) as claim:
            running = claim.engine
            return ReadyCard(
                model=running.spec.model,
                engine=running.engine_kind,
                lane=running.spec.lane,
                version=running.version,
                pid=claim.handle.pid,
                slots=running.spec.slots,
                ctx_per_slot=running.served_ctx or running.spec.ctx_per_slot,
                ctx_asked=clamped,
                memory_bytes=self.memory.footprint(running.spec.model),
                evicted=list(claim.evicted),
                load_s=round(claim.load_ns / 1e9, 3),
                keep_alive_s=keep_alive_s,
                vision=running.spec.projector is not None,
            )

    @asynccontextmanager
    async def lease(self, model: str) -> AsyncIterator[tuple[EngineActor, EngineHandle]]:
        """``model``'s engine, made ready as for a request (room made for it) and leased while
        the block runs, but without an admission slot: for a look at the engine itself (its
        ``/slots``), which must not queue behind the very requests it looks at. The lease
        keeps the engine from being stopped or restarted under the look; a look that had to
        load the engine arms its idle timer, as a request would."""
        engine = await self.engine_for(model)
        cold = engine.ready_handle() is None
        handle, _ = await self.ready(engine)
        lease = engine.lease()
        try:
            yield engine, handle
        finally:
            lease.release()
            if cold:
                self.lifecycle.touch_nowait(engine.spec.model, None)

    def loaded(self) -> list[EngineActor]:
        seen: dict[int, EngineActor] = {}
        for engine in self._engines.values():
            seen[id(engine)] = engine
        return sorted(seen.values(), key=lambda e: e.spec.model)

    async def stop_engine(self, model: str) -> bool:
        engine = self._engines.get(model)
        if engine is None:
            return False
        try:
            await engine.ask(StopEngine(reason="unloaded"))
        except ActorStopped:
            pass
        return True

    def _lifecycle_actor(self) -> LifecycleActor:
        c = self.config
        return LifecycleActor(
            ModelLifecycle(
                loaded=self._loaded_in_flight,
                pending=self._admitted,
                stop=self.stop_engine,
                footprint=self.memory.footprint,
                memory_budget=self.memory.budget,
                advice=self.memory.advice,
            ),
            keep_alive_s=c.keep_alive_s,
            max_loaded_models=c.max_loaded_models,
            load_wait_s=c.queue_timeout_s,
            model_keep_alive={m: o.keep_alive_s for m, o in c.models.items() if o.keep_alive_s is not None},
        )

    def _loaded_in_flight(self) -> dict[str, int]:
        """Model → requests in flight, for each engine whose child is starting or ready."""
        return {
            e.spec.model: e.in_flight
            for e in self.loaded()
            if e.state in (EngineState.READY, EngineState.STARTING)
        }

    def _admitted(self) -> dict[str, int]:
        """Model → requests admission holds for it (granted a slot or queued)."""
        return {q.model: q.running + q.queued for q in self.admission.statistics().queues}

    async def before_load(self, engine: EngineActor) -> tuple[str, ...]:
        """Make room for ``engine``'s model (count limit and memory budget), or raise why not;
        returns the models evicted."""
        need = await self.memory.need(engine.spec)
        return await self.lifecycle.before_load(engine.spec.model, need)

    async def preload(
        self, models: list[str], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Load ``models`` one after another; a failure is logged and the next one tried.

        Reports itself started once the first load is under way (its engine's process
        spawned) or has failed, so that what the caller does next overlaps the engine's
        start: ``open_runtime`` waits for that much, the daemon then imports its gateway."""
        reported = False
        for name in models:
            try:
                engine = await self.engine_for(name)
                model = engine.spec.model
                if not reported:
                    await self._begin_load(engine)
                    task_status.started()
                    reported = True
                    if engine.state is EngineState.FAILED:  # at once: no binary, breaker open
                        raise EngineCrashed(engine.last_error or f"engine for '{model}' did not start")
                await self.make_ready(engine)
                self.lifecycle.touch_nowait(model, None)
                log.info("preloaded '%s'", model)
            except Exception as exc:
                log.warning("could not preload '%s': %s", name, getattr(exc, "message", None) or exc)
            if not reported:
                task_status.started()
                reported = True
        if not reported:
            task_status.started()
        self.preloaded.set()

    async def _begin_load(self, engine: EngineActor) -> None:
        """Start ``engine``'s child as a request would, and return once its process runs
        (or the start is over); ``make_ready`` then waits for the same start."""
        if engine.state in (EngineState.READY, EngineState.STARTING):
            return
        await self.before_load(engine)
        await engine.tell(EnsureReady())  # no reply slot: the start is what is wanted
        await engine.ask(WaitSpawned())  # handled after the EnsureReady: the start is under way

    def engine_if_loaded(self, model: str) -> EngineActor | None:
        """The model's engine actor if one exists, without creating it."""
        return self._engines.get(model)

    def start_soon(self, fn: Callable[[], Awaitable[object]]) -> None:
        """Run a background task owned by the runtime (it ends with the runtime)."""
        assert self._nursery is not None
        self._nursery.start_soon(fn)

    async def refresh(self, record: ModelRecord) -> bool:
        """``record`` was written to the store again (a pull, a create): its engine, if one
        runs, restarts with the new files or settings once the requests running on it have
        finished (they end on the old child, never cut); when what the engine runs did not
        change, nothing happens. Returns whether a restart was scheduled."""
        engine = self._engines.get(record.name)
        if engine is None:
            return False
        spec = await trio.to_thread.run_sync(self.launch_spec, record, frozenset({engine.spec.kind}))
        old = engine.spec
        same = (old.path, old.projector, old.chat_template, old.system, old.defaults) == (
            spec.path,
            spec.projector,
            spec.chat_template,
            spec.system,
            spec.defaults,
        )
        if same:
            return False
        spec = await trio.to_thread.run_sync(self._with_sessions, spec, record)
        await engine.ask(Reconfigure(spec=spec))
        return True

    async def forget(self, model: str) -> None:
        """Stop and drop the engine of a model that was removed from the store."""
        engine = self._engines.get(model)
        if engine is None:
            return
        await self.stop_engine(model)
        for key in [k for k, v in self._engines.items() if v is engine]:
            del self._engines[key]
        try:
            await self.engines.stop_child(engine.spec.model)
        except KeyError:
            pass

    async def reload_adapters(self, model: str) -> bool:
        """Give a loaded model's engine its adapters as the store now has them: it restarts once
        its requests have finished. False when no engine runs it (its next start reads them)."""
        engine = self._engines.get(model)
        if engine is None or engine.state not in (EngineState.READY, EngineState.STARTING):
            return False
        record = await trio.to_thread.run_sync(self.store.get, model)
        spec = await trio.to_thread.run_sync(self.launch_spec, record)
        await engine.ask(Reconfigure(loras=spec.loras))
        return True

    async def set_adapter_scales(
        self, model: str, scales: list[tuple[str | int, float]]
    ) -> tuple[ModelRecord, bool]:
        """Give ``model``'s LoRA adapters (by name or number) these scales: kept in the store, so
        every start uses them, and given to its running engine, which restarts with them once its
        requests have finished (llama.cpp's ``POST /lora-adapters`` changes the scales it lists
        but not those its requests run with, in the bundled build). The record, and whether an
        engine restarts."""
        from registry.adapters import set_scales

        record = await trio.to_thread.run_sync(set_scales, self.store, model, scales)
        return record, await self.reload_adapters(record.name)

    def running_adapter_scales(self, model: str) -> list[float] | None:
        """The scales ``model``'s running engine was started with, in order; None when no engine
        of it is ready."""
        engine = self._engines.get(model)
        if engine is None or engine.ready_handle() is None:
            return None
        return [lora.scale for lora in engine.spec.loras]

    async def sleeping(self, model: str) -> bool | None:
        """Whether ``model``'s engine sleeps now (``idle_sleep_s``: its KV cache and compute
        buffers freed until the next request); None when it cannot sleep or is not ready.
        Asking does not wake it (llama.cpp's ``/props``)."""
        import httpx

        engine = self._engines.get(model)
        handle = engine.ready_handle() if engine is not None else None
        if engine is None or handle is None or not engine.spec.idle_sleep_s:
            return None
        try:
            resp = await handle.client.get("/props", timeout=5.0)
            return bool(resp.json().get("is_sleeping", False))
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    async def pull(self, name: str) -> JobRecord:
        """Pull ``name`` (a catalog name, ``ollama:…``, ``hf:…``) into the store, as a job
        (``actors/pulls.py``): returns it once it is committed and queued. Follow it with
        ``jobs.follow(job.id)``, stop it with ``jobs.cancel(job.id)``; it is listed with the
        other jobs, and a pull that a crash cut short resumes on the next start."""
        return await self.jobs.submit(pulls.KIND, name.encode(), model=name)

    def statistics(self) -> RuntimeStatistics:
        return RuntimeStatistics(
            engines=[e.statistics() for e in self.loaded()],
            ledger=self.ledger.statistics(),
            jobs=self.jobs.statistics(),
            admission=self.admission.statistics(),
            lifecycle=self.lifecycle.statistics(),
            reaped_orphans=self.reaped_orphans,
        )
