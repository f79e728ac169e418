"""LifecycleActor: which models stay loaded, for how long, and which one goes first.

Two decisions, both pure functions (DESIGN §3):

* ``choose_evictions`` — before a model's engine starts, which idle resident
  models to unload so that ``max_loaded_models`` (and, later, memory: the
  ``fits`` hook) holds; least recently used first, never one with work, or a
  refusal that names the busy models.
* ``tick`` — what one model's idle timer does when it falls due: unload the
  model, wait while it still has work, or re-arm once that work has ended.

The actor owns the last-used times, each model's keep-alive and the idle timers.
One loop sleeps until the earliest deadline (``trio.move_on_at``), like a timer
wheel, instead of one task per model. It reads engines and admission only
through the callables it is given, so it imports neither the runtime nor the
engine actor.

Timers: a request that ends calls ``touch_nowait(model, keep_alive_s)``, which
re-arms the model's deadline at now + keep-alive (0: at once; negative: never).
A deadline that falls due while the model still has work (a request in flight,
queued or granted a slot) does not unload it: the timer re-checks every
``recheck_s`` and, once the work has ended without a touch, re-arms from then.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import msgspec
import trio

from actors.errors import (
    ActorStopped,
    BlazarRuntimeError,
    InsufficientMemory,
    MaxLoadedModels,
    ModelBusy,
    ModelTooLarge,
)
from actors.mailbox import Envelope, Mailbox

log = logging.getLogger("blazar.lifecycle")

__all__ = [
    "EvictionPlan",
    "LifecycleActor",
    "LifecycleStatistics",
    "LoadPreview",
    "ModelLifecycle",
    "Resident",
    "ResidentStatistics",
    "Timer",
    "choose_evictions",
    "tick",
]


# -- pure decisions -------------------------------------------------------------


class Resident(msgspec.Struct, frozen=True, kw_only=True):
    """A loaded (or loading) model as the eviction planner sees it."""

    model: str
    last_used_s: float
    """Monotonic time of its last use; smaller is older."""
    in_flight: int = 0
    queued: int = 0
    memory_bytes: int | None = None
    """What it holds, for fit planning (the ``fits`` hook); None when unknown."""

    @property
    def busy(self) -> bool:
        return self.in_flight > 0 or self.queued > 0


class EvictionPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Which models to unload before ``incoming`` loads, or why it cannot load now."""

    incoming: str
    evict: tuple[str, ...] = ()
    refused: str | None = None
    """Set when no plan exists: the reason, for the error message."""
    busy: tuple[str, ...] = ()
    """The residents that could not be evicted because they have work."""
    short_of_memory: bool = False
    """Refused because ``fits`` failed (memory), not because of ``max_loaded``."""

    @property
    def ok(self) -> bool:
        return self.refused is None


def choose_evictions(
    candidates: list[Resident],
    *,
    incoming: str,
    max_loaded: int,
    fits: Callable[[list[Resident]], bool] | None = None,
) -> EvictionPlan:
    """Plan the unloads that let ``incoming`` load beside what stays.

    ``max_loaded`` <= 0 means no limit on the count. ``fits(kept)`` (optional)
    says whether ``incoming`` fits beside the residents ``kept``. Idle residents
    go least recently used first (ties by name, so the plan is deterministic),
    and only as many as needed; a busy resident and ``incoming`` itself (when it
    is already resident) are never chosen. When even evicting every idle
    resident is not enough, nothing is evicted and the plan is refused.
    """
    others = [c for c in candidates if c.model != incoming]
    idle = sorted((c for c in others if not c.busy), key=lambda c: (c.last_used_s, c.model))
    busy = tuple(sorted(c.model for c in others if c.busy))

    def within_count(kept: list[Resident]) -> bool:
        return max_loaded <= 0 or len(kept) + 1 <= max_loaded

    def satisfied(kept: list[Resident]) -> bool:
        return within_count(kept) and (fits is None or fits(kept))

    kept = list(others)
    evict: list[str] = []
    while not satisfied(kept):
        if not idle:
            if not within_count(kept):
                reason = (
                    f"loading '{incoming}' would exceed max_loaded_models = {max_loaded} and every "
                    f"loaded model is busy ({', '.join(busy)})"
                )
            else:
                reason = f"'{incoming}' does not fit beside the busy loaded models ({', '.join(busy)})"
            return EvictionPlan(
                incoming=incoming, refused=reason, busy=busy, short_of_memory=within_count(kept)
            )
        victim = idle.pop(0)
        kept = [c for c in kept if c.model != victim.model]
        evict.append(victim.model)
    return EvictionPlan(incoming=incoming, evict=tuple(evict), busy=busy)


class Timer(msgspec.Struct, frozen=True, kw_only=True):
    """One model's idle timer (monotonic trio times)."""

    last_used_s: float
    keep_alive_s: float
    """Negative: kept loaded forever; 0: unloaded as soon as it is idle."""
    deadline_s: float | None
    """When the timer next looks at the model; None: never (kept forever)."""
    waiting: bool = False
    """The deadline passed while the model had work: re-checking until it is idle."""


def arm(last_used_s: float, keep_alive_s: float) -> Timer:
    """The timer of a model whose last request ended at ``last_used_s``."""
    deadline = None if keep_alive_s < 0 else last_used_s + keep_alive_s
    return Timer(last_used_s=last_used_s, keep_alive_s=keep_alive_s, deadline_s=deadline)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def tick(timer: Timer, *, now_s: float, busy: bool, recheck_s: float) -> tuple[Timer | None, bool]:
    """What a due (or not yet due) timer does now: ``(new timer, unload?)``.

    ``None`` as the new timer means the model is no longer tracked (it unloads).
    """
    if timer.deadline_s is None or now_s < timer.deadline_s:
        return timer, False
    if busy:
        return msgspec.structs.replace(timer, deadline_s=now_s + recheck_s, waiting=True), False
    if timer.waiting:
        # Its work ended without a touch: the idle time starts now.
        timer = arm(now_s, timer.keep_alive_s)
        if timer.deadline_s is None or now_s < timer.deadline_s:
            return timer, False
    return None, True


# -- the actor ------------------------------------------------------------------


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
    """Unload ``model`` now (or every idle model when None); ``only_idle`` refuses a busy one."""

    model: str | None = None
    only_idle: bool = False


class _Stopped(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    models: tuple[str, ...]
    skipped: tuple[str, ...] = ()
    """Not stopped after all: they had work again by the time their turn came."""


LifecycleMessage = Touch | PlanLoad | Unload | _Stopped


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


class LifecycleStatistics(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    running: bool
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


class LifecycleActor:
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
        self.name = "lifecycle"
        self.mailbox: Mailbox[LifecycleMessage] = Mailbox(self.name, math.inf)
        self.mailbox.close()  # not running until run() starts
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
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._running = False
        self._handled = 0
        self._waiting_loads = 0
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

    async def before_load(self, model: str, need_bytes: int | None = None) -> None:
        """Call before starting ``model``'s engine: evicts idle models as ``max_loaded_models``
        and the memory budget require; waits (up to ``load_wait_s``) while every loaded
        model is busy, then raises ``MaxLoadedModels``. With ``need_bytes`` (its estimated
        footprint), raises ``ModelTooLarge`` when it exceeds the budget even alone and
        ``InsufficientMemory`` when only busy models stand in its way."""
        deadline = trio.current_time() + self.load_wait_s
        self._waiting_loads += 1
        try:
            while True:
                changed = self._changed
                plan: EvictionPlan = await self.mailbox.ask(PlanLoad(model=model, need_bytes=need_bytes))
                if plan.ok:
                    return
                if trio.current_time() >= deadline:
                    self._counts["refused"] += 1
                    raise MaxLoadedModels(
                        f"{plan.refused}; waited {self.load_wait_s:.0f} s — retry when one is idle, "
                        "unload one (`blazar unload NAME`), or raise max_loaded_models in config.toml",
                        retry_after_s=max(1.0, self.recheck_s),
                    )
                with trio.move_on_at(min(deadline, trio.current_time() + max(self.recheck_s, 0.05))):
                    await changed.wait()
        finally:
            self._waiting_loads -= 1

    async def unload(self, model: str, *, only_idle: bool = False) -> bool:
        """Stop ``model``'s engine now; True when it was loaded. ``only_idle`` raises
        ``ModelBusy`` instead of stopping a model with work."""
        evicted: tuple[str, ...] = await self.mailbox.ask(Unload(model=model, only_idle=only_idle))
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
        for model, since in list(self._reserved.items()):
            if model in loaded or now - since > self.reserve_s:
                del self._reserved[model]
        names = (set(loaded) | set(self._reserved)) - self._evicting
        return [
            Resident(
                model=m,
                last_used_s=self._last_used.get(m, -math.inf),
                in_flight=loaded.get(m, 0) + (1 if m in self._reserved else 0),
                queued=pending.get(m, 0),
            )
            for m in sorted(names)
        ]

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
        return LifecycleStatistics(
            name=self.name,
            running=self._running,
            keep_alive_s=self.keep_alive_s,
            max_loaded_models=self.max_loaded_models,
            models=models,
            evicting=sorted(self._evicting),
            reserved=sorted(self._reserved),
            waiting_loads=self._waiting_loads,
            **self._counts,
        )

    # -- the loop -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[LifecycleActor] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.mailbox.reopen()
            self._running = True
            try:
                task_status.started(self)
                while True:
                    env: Envelope[LifecycleMessage] | None = None
                    with trio.move_on_at(self._next_wake()):
                        env = await self.mailbox.receive()
                    if env is not None:
                        self._dispatch(env)
                    # Messages already sent count before timers: a touch re-arms first.
                    while True:
                        try:
                            env = self.mailbox.receive_nowait()
                        except trio.WouldBlock:
                            break
                        self._dispatch(env)
                    self._fire_due()
            finally:
                self._running = False
                self.mailbox.close()
                nursery.cancel_scope.cancel()

    def _next_wake(self) -> float:
        return min(
            (t.deadline_s for t in self._timers.values() if t.deadline_s is not None), default=math.inf
        )

    def _default_keep_alive(self, model: str) -> float:
        return self.model_keep_alive.get(model, self.keep_alive_s)

    def _busy(self, model: str) -> bool:
        return self.hooks.loaded().get(model, 0) > 0 or self.hooks.pending().get(model, 0) > 0

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _dispatch(self, env: Envelope[LifecycleMessage]) -> None:
        self._handled += 1
        now = trio.current_time()
        try:
            match env.message:
                case Touch(model=model, keep_alive_s=keep):
                    self._last_used[model] = now
                    self._reserved.pop(model, None)
                    ka = self._default_keep_alive(model) if keep is None else keep
                    self._timers[model] = arm(now, ka)
                    self._notify()
                case PlanLoad(model=model, need_bytes=need):
                    self._plan_load(env, model, need, now)
                case Unload(model=model, only_idle=only_idle):
                    self._unload(env, model, only_idle)
                case _Stopped(models=models, skipped=skipped):
                    self._evicting.difference_update(models)
                    for m in skipped:  # keep watching it: it idles again later
                        if m not in self._timers:
                            ka = self._default_keep_alive(m)
                            self._timers[m] = Timer(
                                last_used_s=now, keep_alive_s=ka, deadline_s=now, waiting=True
                            )
                    self._notify()
                case _:
                    env.fail(TypeError(f"unexpected message {env.message!r}"))
        except BlazarRuntimeError as exc:
            env.fail(exc)

    def preview(self, model: str, need: int | None) -> LoadPreview:
        """What loading ``model`` now would do, without doing it (``blazar plan``)."""
        try:
            plan, budget, residents = self._decide(model, need)
        except (ModelTooLarge, InsufficientMemory) as exc:
            return LoadPreview(model=model, need_bytes=need, refused=exc.message, code=exc.code)
        return LoadPreview(
            model=model,
            need_bytes=need,
            budget_bytes=budget,
            resident_bytes={r.model: r.memory_bytes for r in residents if r.model != model},
            evict=list(plan.evict),
            refused=plan.refused,
            code=None if plan.ok else "MAX_LOADED_MODELS",
        )

    def _decide(self, model: str, need: int | None) -> tuple[EvictionPlan, int | None, list[Resident]]:
        """The eviction plan for loading ``model`` (estimated at ``need`` bytes), the memory
        budget and the residents; raises when memory rules the load out."""
        residents = [
            msgspec.structs.replace(r, memory_bytes=self.hooks.footprint(r.model)) for r in self.residents()
        ]
        held = sum(r.memory_bytes or 0 for r in residents if r.model != model)
        budget = self.hooks.memory_budget(held) if need is not None else None
        fits = None
        if need is not None and budget is not None:
            if need > budget:
                advice = self.hooks.advice(model, budget)
                raise ModelTooLarge(
                    f"'{model}' needs about {_gib(need)} but the memory budget is {_gib(budget)} even "
                    f"with no other model loaded{' — ' + advice if advice else ''}"
                )

            def fits(kept: list[Resident]) -> bool:
                return need + sum(r.memory_bytes or 0 for r in kept) <= budget

        plan = choose_evictions(residents, incoming=model, max_loaded=self.max_loaded_models, fits=fits)
        if not plan.ok and plan.short_of_memory and need is not None and budget is not None:
            busy = {r.model: r.memory_bytes or 0 for r in residents if r.busy and r.model != model}
            raise InsufficientMemory(
                f"'{model}' needs about {_gib(need)}; the budget is {_gib(budget)} and the busy models "
                + ", ".join(f"'{m}' ({_gib(b)})" for m, b in sorted(busy.items()))
                + f" hold {_gib(sum(busy.values()))} — retry when they are idle, or unload one "
                "(`blazar unload NAME`)",
                retry_after_s=5.0,
            )
        return plan, budget, residents

    def _plan_load(self, env: Envelope[LifecycleMessage], model: str, need: int | None, now: float) -> None:
        self._last_used[model] = now
        try:
            plan, _budget, _residents = self._decide(model, need)
        except (ModelTooLarge, InsufficientMemory):
            self._counts["refused"] += 1
            raise
        if not plan.ok:
            env.answer(plan)
            return
        self._reserved[model] = now
        # Tracked from now on: the timer waits while the load and its request run.
        timer = self._timers.get(model)
        keep = timer.keep_alive_s if timer else self._default_keep_alive(model)
        self._timers[model] = Timer(last_used_s=now, keep_alive_s=keep, deadline_s=now, waiting=True)
        if not plan.evict:
            env.answer(plan)
            return

        def done(stopped: tuple[str, ...], skipped: tuple[str, ...]) -> None:
            if skipped:  # a victim got work meanwhile: plan again
                self._reserved.pop(model, None)
                env.answer(
                    msgspec.structs.replace(plan, refused="an eviction victim became busy", busy=skipped)
                )
            else:
                env.answer(plan)

        for victim in plan.evict:
            log.info("evicting '%s' (least recently used) to load '%s'", victim, model)
            self._timers.pop(victim, None)
        self._counts["evictions"] += len(plan.evict)
        self._stop_soon(plan.evict, check_idle=True, done=done)

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

        def done(stopped: tuple[str, ...], skipped: tuple[str, ...]) -> None:
            env.answer(tuple(m for m in stopped if m in loaded))

        self._stop_soon(victims, check_idle=only_idle, done=done)

    def _stop_soon(
        self,
        models: tuple[str, ...],
        *,
        check_idle: bool,
        done: Callable[[tuple[str, ...], tuple[str, ...]], None] | None = None,
    ) -> None:
        self._evicting.update(models)
        assert self._nursery is not None
        self._nursery.start_soon(self._stop, models, check_idle, done)

    async def _stop(
        self,
        models: tuple[str, ...],
        check_idle: bool,
        done: Callable[[tuple[str, ...], tuple[str, ...]], None] | None,
    ) -> None:
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
                self.mailbox.tell_nowait(_Stopped(models=models, skipped=tuple(skipped)))
            except (ActorStopped, trio.WouldBlock):
                pass
            if done is not None:
                done(tuple(stopped), tuple(skipped))

    def _fire_due(self) -> None:
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
                self._stop_soon((model,), check_idle=True, done=self._unloaded_idle)

    def _unloaded_idle(self, stopped: tuple[str, ...], skipped: tuple[str, ...]) -> None:
        for model in stopped:
            log.info("unloaded '%s': idle for its keep-alive", model)
            self._counts["idle_unloads"] += 1
