"""LifecycleActor: which models stay loaded, for how long, and which one goes first.

The decisions are pure functions in ``actors/eviction.py``: the eviction plan
before a load (``plan_load``) and what an idle timer does when it falls due
(``tick``). This actor owns the last-used times, each model's keep-alive, the
idle timers and the loads waiting for room, and carries the decisions out. It
reads engines and admission only through the callables it is given, so it
imports neither the runtime nor the engine actor.

Timers: a request that ends calls ``touch_nowait(model, keep_alive_s)``, which
re-arms the model's deadline at now + keep-alive (0: at once; negative: never).
The loop wakes at the earliest deadline (``next_deadline``), like a timer
wheel, instead of one task per model. A deadline that falls due while the model
still has work (a request in flight, queued or granted a slot) does not unload
it: the timer re-checks every ``recheck_s`` and, once the work has ended without
a touch, re-arms from then.

Loads: ``before_load`` asks for room and gets its answer once the evictions it
needs are done. A load that only busy models stand in the way of waits here,
planned again after every batch of messages (``settle``) and every
``recheck_s``, until ``load_wait_s`` has passed.

Stops run in the actor's own tasks and report back (``_Stopped``); what a stop
was for (a load, an unload, an idle timer) is finished by the actor when the
report arrives.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import assert_never

import msgspec
import trio

from actors.actor import Actor, ActorStatistics
from actors.errors import ActorStopped, InsufficientMemory, MaxLoadedModels, ModelBusy, ModelTooLarge
from actors.eviction import EvictionPlan, LoadRefusal, Resident, Timer, arm, plan_load, tick
from actors.mailbox import Envelope

log = logging.getLogger("blazar.lifecycle")

__all__ = [
    "LifecycleActor",
    "LifecycleMessage",
    "LifecycleStatistics",
    "LoadPreview",
    "ModelLifecycle",
    "PlanLoad",
    "ResidentStatistics",
    "Retune",
    "Touch",
    "Unload",
]


class Touch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A request for ``model`` ended; ``keep_alive_s`` None means the configured default."""

    model: str
    keep_alive_s: float | None = None


class PlanLoad(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """``model``'s engine is about to start: evict what must go (the reply comes once it has).

    ``need_bytes``: its estimated footprint (None: unknown, no memory check)."""

    model: str
    need_bytes: int | None = None


class Unload(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Unload ``model`` now (or every idle model when None); ``only_idle`` refuses a busy one,
    ``when_idle`` unloads a busy one as soon as its work ends (Ollama's ``keep_alive: 0``)."""

    model: str | None = None
    only_idle: bool = False
    when_idle: bool = False


class _Stopped(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Stop ``stop_id`` is over: these models were stopped, these skipped."""

    stop_id: int
    stopped: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    """Not stopped after all: they had work again by the time their turn came."""


class Retune(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """New limits (a config reload). An idle timer armed with the old default keep-alive
    is armed again from the model's last use with the new one."""

    keep_alive_s: float
    max_loaded_models: int
    load_wait_s: float
    model_keep_alive: dict[str, float] = {}


LifecycleMessage = Touch | PlanLoad | Unload | Retune | _Stopped


class ResidentStatistics(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    loaded: bool
    in_flight: int
    queued: int
    keep_alive_s: float
    last_used_at: float | None
    """UNIX time of the last use."""
    expires_at: float | None
    """UNIX time it unloads when it stays idle; None: kept forever."""


class LoadPreview(msgspec.Struct, frozen=True, kw_only=True):
    """What a load would do now: the models it would evict, or why it would be refused."""

    model: str
    need_bytes: int | None
    """Its estimated footprint (None: unknown, loaded unchecked)."""
    budget_bytes: int | None = None
    resident_bytes: dict[str, int | None] = {}
    evict: list[str] = []
    refused: str | None = None
    code: str | None = None


class LifecycleStatistics(ActorStatistics, frozen=True, kw_only=True):
    keep_alive_s: float
    max_loaded_models: int
    models: list[ResidentStatistics]
    evicting: list[str]
    reserved: list[str]
    idle_unloads: int
    evictions: int
    refused: int
    waiting_loads: int


@dataclass(frozen=True, slots=True)
class ModelLifecycle:
    """What the actor reads from the rest of the runtime, as plain callables.

    ``loaded()``: model → requests in flight, for every engine whose child is
    starting or ready. ``pending()``: model → requests admission holds for it
    (queued plus granted). ``stop(model)``: stop that model's engine.
    """

    loaded: Callable[[], Mapping[str, int]]
    pending: Callable[[], Mapping[str, int]]
    stop: Callable[[str], Awaitable[object]]
    footprint: Callable[[str], int | None] = lambda model: None
    """Estimated bytes a loaded model holds (None: unknown)."""
    memory_budget: Callable[[int], int | None] = lambda held: None
    """Bytes all models together may use, given ``held`` bytes held by the resident
    models now (None: no memory check)."""
    advice: Callable[[str, int], str] = lambda model, budget: ""
    """What would make ``model`` fit in ``budget`` bytes (smaller context, quantized KV…)."""


@dataclass(slots=True, eq=False)
class _Load:
    """A ``PlanLoad`` not answered yet: waiting for room, or for its evictions."""

    env: Envelope[LifecycleMessage]
    model: str
    need_bytes: int | None
    deadline_s: float
    plan: EvictionPlan | None = None
    """The last plan: the refusal it waits out, or the evictions it runs."""
    evicting: bool = False


@dataclass(slots=True, eq=False)
class _Stop:
    """What a running stop is for, finished when its ``_Stopped`` arrives."""

    models: tuple[str, ...]
    load: _Load | None = None
    unload: Envelope[LifecycleMessage] | None = None
    loaded: frozenset[str] = frozenset()
    """For an unload: what was loaded when it was asked (its answer names those)."""


_REFUSALS: dict[str, type[ModelTooLarge | InsufficientMemory]] = {
    "MODEL_TOO_LARGE": ModelTooLarge,
    "INSUFFICIENT_MEMORY": InsufficientMemory,
}


class LifecycleActor(Actor[LifecycleMessage]):
    """Owns idle timers, last-used times and eviction; see the module docstring."""

    def __init__(
        self,
        hooks: ModelLifecycle,
        *,
        keep_alive_s: float = 300.0,
        max_loaded_models: int = 0,
        load_wait_s: float = 120.0,
        model_keep_alive: Mapping[str, float] | None = None,
        recheck_s: float = 0.25,
        reserve_s: float = 10.0,
    ) -> None:
        super().__init__("lifecycle", capacity=math.inf)
        self.hooks = hooks
        self.keep_alive_s = keep_alive_s
        self.max_loaded_models = max_loaded_models
        self.load_wait_s = load_wait_s
        self.model_keep_alive = dict(model_keep_alive or {})
        self.recheck_s = recheck_s
        self.reserve_s = reserve_s
        self._timers: dict[str, Timer] = {}
        self._last_used: dict[str, float] = {}
        self._reserved: dict[str, float] = {}  # passed before_load, engine not seen starting yet
        self._evicting: set[str] = set()
        self._unload_when_idle: set[str] = set()  # asked to unload while busy (Ollama's keep_alive 0)
        self._loads: list[_Load] = []
        self._replan_s = math.inf  # when the waiting loads are planned again without a message
        self._stops: dict[int, _Stop] = {}
        self._stop_ids = itertools.count(1)
        self._counts = {"idle_unloads": 0, "evictions": 0, "refused": 0}

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        limit = self.max_loaded_models or "∞"
        return (
            f"<LifecycleActor {state} timers={len(self._timers)} max_loaded={limit} "
            f"evicting={len(self._evicting)} keep_alive={self.keep_alive_s:g}s>"
        )

    # -- API ----------------------------------------------------------------

    def touch_nowait(self, model: str, keep_alive_s: float | None = None) -> None:
        """A request for ``model`` ended: re-arm its idle timer. Never blocks or raises."""
        try:
            self.mailbox.tell_nowait(Touch(model=model, keep_alive_s=keep_alive_s))
        except (ActorStopped, trio.WouldBlock):
            pass

    async def before_load(self, model: str, need_bytes: int | None = None) -> tuple[str, ...]:
        """Call before starting ``model``'s engine: evicts idle models as ``max_loaded_models``
        and the memory budget require; waits (up to ``load_wait_s``) while every loaded
        model is busy, then raises ``MaxLoadedModels``. With ``need_bytes`` (its estimated
        footprint), raises ``ModelTooLarge`` when it exceeds the budget even alone and
        ``InsufficientMemory`` when only busy models stand in its way. Returns the models
        evicted to make room."""
        plan: EvictionPlan = await self.mailbox.ask(PlanLoad(model=model, need_bytes=need_bytes))
        return plan.evict

    async def unload(self, model: str, *, only_idle: bool = False, when_idle: bool = False) -> bool:
        """Stop ``model``'s engine now; True when it was loaded. ``only_idle`` raises
        ``ModelBusy`` instead of stopping a model with work; ``when_idle`` lets that work
        finish and stops it then, never ending another client's request."""
        unload = Unload(model=model, only_idle=only_idle, when_idle=when_idle)
        evicted: tuple[str, ...] = await self.mailbox.ask(unload)
        return bool(evicted)

    async def evict_idle(self) -> list[str]:
        """Stop every loaded model that has no work; returns their names."""
        evicted: tuple[str, ...] = await self.mailbox.ask(Unload(model=None, only_idle=True))
        return list(evicted)

    def expires_at(self, model: str) -> float | None:
        """UNIX time ``model`` unloads if it stays idle; None: forever, or not tracked."""
        timer = self._timers.get(model)
        if timer is None or timer.keep_alive_s < 0:
            return None
        now = trio.current_time()
        if timer.waiting or timer.deadline_s is None:  # busy: at least a full keep-alive from now
            return time.time() + timer.keep_alive_s
        return time.time() + max(0.0, timer.deadline_s - now)

    def residents(self) -> list[Resident]:
        """The models that count against ``max_loaded_models`` now (loading ones included)."""
        now = trio.current_time()
        loaded = self.hooks.loaded()
        pending = self.hooks.pending()
        reserved = self._live_reservations(now, loaded)
        names = (set(loaded) | reserved) - self._evicting
        return [
            Resident(
                model=m,
                last_used_s=self._last_used.get(m, -math.inf),
                in_flight=loaded.get(m, 0) + (1 if m in reserved else 0),
                queued=pending.get(m, 0),
            )
            for m in sorted(names)
        ]

    def preview(self, model: str, need: int | None) -> LoadPreview:
        """What loading ``model`` now would do, without doing it (``blazar plan``)."""
        decision, budget, residents = self._decide(model, need)
        if isinstance(decision, LoadRefusal):
            return LoadPreview(model=model, need_bytes=need, refused=decision.message, code=decision.code)
        return LoadPreview(
            model=model,
            need_bytes=need,
            budget_bytes=budget,
            resident_bytes={r.model: r.memory_bytes for r in residents if r.model != model},
            evict=list(decision.evict),
            refused=decision.refused,
            code=None if decision.ok else "MAX_LOADED_MODELS",
        )

    def statistics(self) -> LifecycleStatistics:
        loaded = self.hooks.loaded()
        pending = self.hooks.pending()
        now, wall = (trio.current_time(), time.time()) if self._running else (0.0, time.time())
        models = []
        for m in sorted(set(loaded) | set(self._timers)):
            timer = self._timers.get(m)
            last = self._last_used.get(m)
            models.append(
                ResidentStatistics(
                    model=m,
                    loaded=m in loaded,
                    in_flight=loaded.get(m, 0),
                    queued=pending.get(m, 0),
                    keep_alive_s=timer.keep_alive_s if timer else self._default_keep_alive(m),
                    last_used_at=None if last is None or not self._running else wall - (now - last),
                    expires_at=self.expires_at(m) if self._running else None,
                )
            )
        reserved = self._live_reservations(now, loaded) if self._running else set()
        return LifecycleStatistics(
            **self.actor_fields(),
            keep_alive_s=self.keep_alive_s,
            max_loaded_models=self.max_loaded_models,
            models=models,
            evicting=sorted(self._evicting),
            reserved=sorted(reserved),
            waiting_loads=len(self._loads),
            **self._counts,
        )

    # -- the loop's hooks -------------------------------------------------------

    def dispatch(self, env: Envelope[LifecycleMessage]) -> None:
        now = trio.current_time()
        match env.message:
            case Touch(model=model, keep_alive_s=keep):
                self._last_used[model] = now
                self._reserved.pop(model, None)
                ka = self._default_keep_alive(model) if keep is None else keep
                if model in self._unload_when_idle:
                    self._unload_when_idle.discard(model)
                    ka = 0.0
                self._timers[model] = arm(now, ka)
            case PlanLoad(model=model, need_bytes=need):
                # planned in settle, with the rest of the batch already applied
                self._loads.append(
                    _Load(env=env, model=model, need_bytes=need, deadline_s=now + self.load_wait_s)
                )
            case Unload(model=model, when_idle=True) if model and self._busy(model):
                self._unload_when_idle.add(model)  # its keep-alive is 0 once its work ends
                env.answer((model,))
            case Unload(model=model, only_idle=only_idle):
                self._unload(env, model, only_idle)
            case Retune() as retune:
                self._retune(retune)
                env.answer(None)
            case _Stopped(stop_id=stop_id, stopped=stopped, skipped=skipped):
                if (stop := self._stops.pop(stop_id, None)) is not None:
                    self._stopped(stop, stopped, skipped, now)
            case _:
                assert_never(env.message)

    def _retune(self, retune: Retune) -> None:
        before = {m: self._default_keep_alive(m) for m in self._timers}
        self.keep_alive_s = retune.keep_alive_s
        self.max_loaded_models = retune.max_loaded_models
        self.load_wait_s = retune.load_wait_s
        self.model_keep_alive = dict(retune.model_keep_alive)
        for model, timer in list(self._timers.items()):
            wanted = self._default_keep_alive(model)
            # A request's own keep-alive (not the default) is left as it was asked.
            if not timer.waiting and timer.keep_alive_s == before[model] and wanted != before[model]:
                self._timers[model] = arm(timer.last_used_s, wanted)

    def next_deadline(self) -> float:
        soonest = min(
            (t.deadline_s for t in self._timers.values() if t.deadline_s is not None), default=math.inf
        )
        waiting = [load.deadline_s for load in self._loads if not load.evicting]
        if waiting:  # a load whose evictions run waits for their report, not for its deadline
            soonest = min(soonest, self._replan_s, *waiting)
        return soonest

    def on_deadline(self) -> None:
        """Due idle timers unload their models (or wait while they still have work)."""
        now = trio.current_time()
        due = [m for m, t in self._timers.items() if t.deadline_s is not None and t.deadline_s <= now]
        if not due:
            return
        loaded = self.hooks.loaded()
        for model in due:
            timer, unload = tick(
                self._timers[model], now_s=now, busy=self._busy(model), recheck_s=self.recheck_s
            )
            if timer is not None:
                self._timers[model] = timer
                continue
            del self._timers[model]
            if unload and model in loaded and model not in self._evicting:
                self._stop_soon(_Stop(models=(model,)), check_idle=True)

    def settle(self) -> None:
        """Plan the waiting loads again: what changed in this batch may have made room."""
        if self._reserved:
            now = trio.current_time()
            live = self._live_reservations(now, self.hooks.loaded())
            self._reserved = {m: since for m, since in self._reserved.items() if m in live}
        if not self._loads:
            return
        now = trio.current_time()
        for load in list(self._loads):
            if not load.evicting:
                self._try_load(load, now)
        self._replan_s = now + max(self.recheck_s, 0.05)

    async def on_stop(self) -> None:
        stopped = ActorStopped(f"actor '{self.name}' stopped before answering")
        for load in self._loads:
            load.env.fail(stopped)
        for stop in self._stops.values():
            if stop.unload is not None:
                stop.unload.fail(stopped)
        self._loads.clear()
        self._stops.clear()

    # -- loads ------------------------------------------------------------------

    def _live_reservations(self, now: float, loaded: Mapping[str, int]) -> set[str]:
        """Models that passed ``before_load`` lately and whose engine is not seen yet."""
        return {m for m, since in self._reserved.items() if m not in loaded and now - since <= self.reserve_s}

    def _decide(
        self, model: str, need: int | None
    ) -> tuple[EvictionPlan | LoadRefusal, int | None, list[Resident]]:
        """The decision on loading ``model`` (estimated at ``need`` bytes) now, the memory
        budget it was made against and the residents it saw."""
        residents = [
            msgspec.structs.replace(r, memory_bytes=self.hooks.footprint(r.model)) for r in self.residents()
        ]
        held = sum(r.memory_bytes or 0 for r in residents if r.model != model)
        budget = self.hooks.memory_budget(held) if need is not None else None
        decision = plan_load(
            residents,
            incoming=model,
            need_bytes=need,
            budget_bytes=budget,
            max_loaded=self.max_loaded_models,
            advice=lambda: self.hooks.advice(model, budget) if budget is not None else "",
        )
        return decision, budget, residents

    def _try_load(self, load: _Load, now: float) -> None:
        """Answer, refuse, start the evictions for, or keep waiting ``load``."""
        self._last_used[load.model] = now
        decision, _budget, _residents = self._decide(load.model, load.need_bytes)
        if isinstance(decision, LoadRefusal):
            self._refuse(
                load, _REFUSALS[decision.code](decision.message, retry_after_s=decision.retry_after_s)
            )
            return
        load.plan = decision
        if not decision.ok:
            if now >= load.deadline_s:
                self._refuse(
                    load,
                    MaxLoadedModels(
                        f"{decision.refused}; waited {self.load_wait_s:.0f} s — retry when one is idle, "
                        "unload one (`blazar unload NAME`), or raise max_loaded_models in config.toml",
                        retry_after_s=max(1.0, self.recheck_s),
                    ),
                )
            return
        self._reserved[load.model] = now
        # Tracked from now on: the timer waits while the load and its request run.
        timer = self._timers.get(load.model)
        keep = timer.keep_alive_s if timer else self._default_keep_alive(load.model)
        self._timers[load.model] = Timer(last_used_s=now, keep_alive_s=keep, deadline_s=now, waiting=True)
        if not decision.evict:
            self._loads.remove(load)
            load.env.answer(decision)
            return
        for victim in decision.evict:
            log.info("evicting '%s' (least recently used) to load '%s'", victim, load.model)
            self._timers.pop(victim, None)
        self._counts["evictions"] += len(decision.evict)
        load.evicting = True
        self._stop_soon(_Stop(models=decision.evict, load=load), check_idle=True)

    def _refuse(self, load: _Load, exc: Exception) -> None:
        self._counts["refused"] += 1
        self._loads.remove(load)
        load.env.fail(exc)

    # -- stops ------------------------------------------------------------------

    def _unload(self, env: Envelope[LifecycleMessage], model: str | None, only_idle: bool) -> None:
        loaded = dict(self.hooks.loaded())  # a snapshot: the stops change what is loaded
        if model is None:
            victims = tuple(m for m in sorted(loaded) if m not in self._evicting and not self._busy(m))
        else:
            if only_idle and self._busy(model):
                raise ModelBusy(
                    f"model '{model}' is serving {loaded.get(model, 0)} request(s) and has "
                    f"{self.hooks.pending().get(model, 0)} admitted or queued — wait for them to "
                    "finish, then evict it again"
                )
            victims = (model,)
        for m in victims:
            self._timers.pop(m, None)
            self._reserved.pop(m, None)
        self._stop_soon(_Stop(models=victims, unload=env, loaded=frozenset(loaded)), check_idle=only_idle)

    def _stop_soon(self, stop: _Stop, *, check_idle: bool) -> None:
        stop_id = next(self._stop_ids)
        self._stops[stop_id] = stop
        self._evicting.update(stop.models)
        self.start_soon(self._stop, stop_id, stop.models, check_idle)

    def _stopped(self, stop: _Stop, stopped: tuple[str, ...], skipped: tuple[str, ...], now: float) -> None:
        self._evicting.difference_update(stop.models)
        for m in skipped:  # keep watching it: it idles again later
            if m not in self._timers:
                ka = self._default_keep_alive(m)
                self._timers[m] = Timer(last_used_s=now, keep_alive_s=ka, deadline_s=now, waiting=True)
        if stop.load is not None:
            load = stop.load
            load.evicting = False
            if skipped:  # a victim got work meanwhile: planned again in settle
                self._reserved.pop(load.model, None)
            else:
                self._loads.remove(load)
                load.env.answer(load.plan)
        elif stop.unload is not None:
            stop.unload.answer(tuple(m for m in stopped if m in stop.loaded))
        else:
            for model in stopped:
                log.info("unloaded '%s': idle for its keep-alive", model)
            self._counts["idle_unloads"] += len(stopped)

    async def _stop(self, stop_id: int, models: tuple[str, ...], check_idle: bool) -> None:
        stopped: list[str] = []
        skipped: list[str] = []
        try:
            for m in models:
                # Checked in the same step as the stop is sent: no request slips in between.
                if check_idle and self._busy(m):
                    skipped.append(m)
                    continue
                try:
                    await self.hooks.stop(m)
                    stopped.append(m)
                except ActorStopped:
                    stopped.append(m)
                except Exception:
                    log.exception("stopping the engine of '%s' failed", m)
        finally:
            try:
                self.mailbox.tell_nowait(
                    _Stopped(stop_id=stop_id, stopped=tuple(stopped), skipped=tuple(skipped))
                )
            except (ActorStopped, trio.WouldBlock):
                pass

    # -- reads ------------------------------------------------------------------

    def _default_keep_alive(self, model: str) -> float:
        return self.model_keep_alive.get(model, self.keep_alive_s)

    def _busy(self, model: str) -> bool:
        return self.hooks.loaded().get(model, 0) > 0 or self.hooks.pending().get(model, 0) > 0
