"""Lifecycle decisions: which loaded models make room for a load, and what an idle timer does.

Pure functions over immutable values — no trio, no I/O, no clock. The lifecycle
actor (``actors/lifecycle.py``) gathers the residents, passes the current time in
as ``now_s`` and carries out what comes back.

* ``plan_load`` — before a model's engine starts: the unloads that let it fit
  (``choose_evictions``), a plan that must wait because only busy models stand in
  the way, or a refusal because memory rules it out.
* ``choose_evictions`` — the count and fit rule alone: least recently used idle
  residents first, only as many as needed, never one with work.
* ``tick`` — what one model's idle timer does when it falls due: unload the
  model, wait while it still has work, or re-arm once that work has ended.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

__all__ = [
    "EvictionPlan",
    "LoadRefusal",
    "Resident",
    "Timer",
    "arm",
    "choose_evictions",
    "format_bytes",
    "plan_load",
    "tick",
]


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


class LoadRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """A load that memory rules out now, so waiting for a busy model cannot help it as such."""

    code: Literal["MODEL_TOO_LARGE", "INSUFFICIENT_MEMORY"]
    message: str
    retry_after_s: float | None = None


def format_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


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


def plan_load(
    residents: list[Resident],
    *,
    incoming: str,
    need_bytes: int | None,
    budget_bytes: int | None,
    max_loaded: int,
    advice: Callable[[], str] = lambda: "",
) -> EvictionPlan | LoadRefusal:
    """The plan for loading ``incoming`` (estimated at ``need_bytes``) under ``max_loaded``
    and a memory budget of ``budget_bytes`` for all models together.

    Without a need or a budget only the count applies. A model larger than the whole
    budget is refused (``MODEL_TOO_LARGE``, with ``advice()`` on what would make it fit);
    one that fits the budget but not beside the busy residents is refused too
    (``INSUFFICIENT_MEMORY``, retry later). A plan refused only by the count waits.
    """
    fits = None
    if need_bytes is not None and budget_bytes is not None:
        need, budget = need_bytes, budget_bytes
        if need > budget:
            hint = advice()
            return LoadRefusal(
                code="MODEL_TOO_LARGE",
                message=(
                    f"'{incoming}' needs about {format_bytes(need)} but the memory budget is "
                    f"{format_bytes(budget)} even with no other model loaded{' — ' + hint if hint else ''}"
                ),
            )

        def fits(kept: list[Resident]) -> bool:
            return need + sum(r.memory_bytes or 0 for r in kept) <= budget

    plan = choose_evictions(residents, incoming=incoming, max_loaded=max_loaded, fits=fits)
    if not plan.ok and plan.short_of_memory and need_bytes is not None and budget_bytes is not None:
        busy = {r.model: r.memory_bytes or 0 for r in residents if r.busy and r.model != incoming}
        return LoadRefusal(
            code="INSUFFICIENT_MEMORY",
            message=(
                f"'{incoming}' needs about {format_bytes(need_bytes)}; the budget is "
                f"{format_bytes(budget_bytes)} and the busy models "
                + ", ".join(f"'{m}' ({format_bytes(b)})" for m, b in sorted(busy.items()))
                + f" hold {format_bytes(sum(busy.values()))} — retry when they are idle, or unload one "
                "(`blazar unload NAME`)"
            ),
            retry_after_s=5.0,
        )
    return plan


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
