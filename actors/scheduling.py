"""Admission decisions: which queued request gets the next free slot of a model.

Pure functions over immutable values — no trio, no I/O, no clock, no randomness.
The admission actor owns one :class:`ModelQueue` per model, passes the current
time in as ``now_s`` and carries out the returned effects (:class:`Grant`,
:class:`Expire`).

Vocabulary: a model has ``capacity`` slots, ``running`` of them busy. A request
waiting for a slot is a :class:`Waiter`. A grant *passes* a waiter when it happens
while that waiter stays queued.

Ordering (:func:`order`), most important rule first:

1. **Tiers.** Waiters are ordered by *effective* tier, HIGH before NORMAL before
   LOW. The effective tier is the nominal tier unless the starvation guard (4)
   promoted the waiter.
2. **Deadlines (EDF).** Inside an effective tier, waiters with a deadline come
   first, earliest deadline first (ties by arrival). Fairness never delays them.
3. **Fair queuing.** The remaining waiters of the tier are served round-robin
   across clients (the fairness key), least recently served client first:
   clients that do not appear in ``recent_clients`` come first, in arrival order
   of each client's oldest waiter, then the clients of ``recent_clients`` from the
   one served longest ago to the one served last. Each round takes one waiter from
   every client; inside a client the order is FIFO. So a burst of 50 requests
   from one client delays another client's single request (same tier, no
   deadlines) by at most one grant; with ``n`` clients, by at most ``n - 1``.
4. **Starvation guard (promotion).** Every grant of a waiter whose effective tier
   is more urgent than a queued waiter's effective tier counts in that waiter's
   ``skipped_by_higher``. Each ``starvation_limit`` such skips promote it one tier
   up for ordering (LOW → NORMAL after ``L`` skips, → HIGH after ``2 L``).
   ``starvation_limit`` is a field of the queue so that every function agrees on
   it; ``None`` means ``8 * capacity``, ``0`` turns promotion off.
5. **High-tier guard.** Every grant of a waiter of a less urgent *nominal* tier
   counts in a queued waiter's ``skipped_by_lower``. Once that reaches
   ``capacity`` (at least 1), the waiter is ordered ahead of every promoted waiter
   of its effective tier (the rest of the order is kept).

Guarantees (tested in ``tests/actors/test_scheduling.py``):

* Without promotion (``starvation_limit=0``) tier priority is strict: no grant of
  a NORMAL or LOW waiter happens while a HIGH waiter is queued (and none of a LOW
  waiter while a NORMAL one is).
* With promotion, a lower-tier grant can pass a HIGH waiter only if the granted
  waiter was promoted to HIGH, and **once queued, a HIGH waiter is passed by at
  most ``capacity`` grants of lower-tier waiters** (rule 5; grants are made one at
  a time and the counters are updated between them, so this holds within one
  :func:`assign` call too; ``capacity`` is the queue's capacity, assumed fixed
  while the waiter is queued).
* With promotion, a LOW (or NORMAL) waiter is eventually granted under a
  continuous stream of HIGH arrivals that carry no deadline: after at most
  ``2 L`` (NORMAL: ``L``) HIGH grants it is ordered as HIGH, and from there fair
  queuing and FIFO bound its wait. (A stream of HIGH requests that all carry
  deadlines is served EDF first and can still delay it: deadlines win.)
* :func:`assign` never grants more than the free slots (``capacity - running``),
  never grants a waiter twice, never drives ``running`` below 0, and is work
  conserving: afterwards either no slot is free or no waiter is left.

Predicted wait (:func:`predicted_wait_s`, used by :func:`admit`): with ``k``
waiters ordered ahead, it is 0 when a free slot is left for the waiter
(``capacity - running > k``) or the service time is unknown, otherwise
``ceil(k / capacity) * service_s``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Literal

import msgspec

__all__ = [
    "CLASS_NAMES",
    "DEFAULT_STARVATION_FACTOR",
    "RECENT_CLIENTS_MAX",
    "Effect",
    "Expire",
    "Grant",
    "ModelQueue",
    "Rejection",
    "Tier",
    "Waiter",
    "admit",
    "assign",
    "class_name",
    "effective_tier",
    "grant_at_once",
    "may_take_slot",
    "order",
    "parse_class",
    "parse_tier",
    "position",
    "predicted_wait_s",
    "release",
    "reserved_for_others",
    "starvation_limit",
    "update_service",
    "withdraw",
]

DEFAULT_STARVATION_FACTOR = 8
"""Default starvation limit is this many times the model's capacity."""
RECENT_CLIENTS_MAX = 64
"""How many distinct recently served clients a queue remembers for fairness."""
SERVICE_STEP = 0.125
"""Relative step of the running median estimate (:func:`update_service`)."""


class Tier(enum.IntEnum):
    """Priority tier of a request; a lower value is more urgent."""

    HIGH = 0
    NORMAL = 1
    LOW = 2
    BACKGROUND = 3
    """Below LOW: work nobody waits for (the request classes name it ``background``)."""


def parse_tier(header: str | None) -> Tier:
    """The tier named by a priority header: ``high`` or ``low`` (any case), else NORMAL."""
    value = (header or "").strip().lower()
    if value == "high":
        return Tier.HIGH
    if value == "low":
        return Tier.LOW
    return Tier.NORMAL


class Waiter(msgspec.Struct, frozen=True, kw_only=True):
    """A request waiting for a slot of ``model``."""

    id: int
    """Unique, increasing in arrival order."""
    model: str
    tier: Tier
    client: str
    """Fairness key (API key, peer, user…)."""
    arrived_s: float
    deadline_s: float | None = None
    """Absolute time after which the request is useless."""
    skipped_by_lower: int = 0
    """Grants of less urgent (nominal) tiers that passed this waiter (rule 5)."""
    skipped_by_higher: int = 0
    """Grants of a more urgent effective tier that passed this waiter (rule 4)."""
    preempted: int = 0
    """Times this request lost its slot to a more urgent class before its first output: a
    preempted request waits at the head of its tier, with its first arrival kept."""


class ModelQueue(msgspec.Struct, frozen=True, kw_only=True):
    """Slots and waiters of one model."""

    model: str
    capacity: int
    running: int
    waiters: tuple[Waiter, ...] = ()
    """In arrival order."""
    service_s: float | None = None
    """Running estimate of the median service time (:func:`update_service`)."""
    recent_clients: tuple[str, ...] = ()
    """Distinct clients of the most recent grants, most recently served last."""
    starvation_limit: int | None = None
    """Skips by more urgent grants per promotion; ``None``: 8 * capacity; ``0``: never promote."""
    promote_after_s: float | None = None
    """Seconds of waiting (since first arrival) per promotion by one tier (rule 6); None: off."""
    clock_s: float = 0.0
    """The time of the last decision (``admit``, ``assign``): what rule 6 measures waits at."""
    reserved: tuple[int, ...] = ()
    """Slots reserved per tier (index: the tier), held free for it while it runs fewer (rule 7)."""
    running_by_tier: tuple[int, ...] = ()
    """Running requests per tier (index: the tier), for the reservations."""


class Grant(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Give a slot to this waiter (``running`` already counts it)."""

    waiter_id: int
    model: str
    promoted: bool = False
    """Granted in a more urgent tier than its own (rules 4 and 6): never preempted."""


class Expire(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Tell this waiter it has been dropped from the queue."""

    waiter_id: int
    reason: Literal["deadline", "timeout", "class_timeout"]


Effect = Grant | Expire


class Rejection(msgspec.Struct, frozen=True, kw_only=True):
    code: Literal["QUEUE_FULL", "DEADLINE_UNMEETABLE"]
    retry_after_s: float
    message: str


# --------------------------------------------------------------------------- ordering


def starvation_limit(queue: ModelQueue) -> int:
    """The queue's promotion threshold; 0 means promotion is off."""
    if queue.starvation_limit is None:
        return DEFAULT_STARVATION_FACTOR * max(1, queue.capacity)
    return max(0, queue.starvation_limit)


def _effective(waiter: Waiter, limit: int, queue: ModelQueue | None = None) -> int:
    steps = waiter.skipped_by_higher // limit if limit > 0 else 0
    if queue is not None and queue.promote_after_s is not None and queue.promote_after_s > 0:
        steps += max(0, int((queue.clock_s - waiter.arrived_s) // queue.promote_after_s))
    return max(int(Tier.HIGH), int(waiter.tier) - steps)


def effective_tier(queue: ModelQueue, waiter: Waiter) -> Tier:
    """The tier ``waiter`` is ordered in, after promotion by the starvation guards."""
    return Tier(_effective(waiter, starvation_limit(queue), queue))


def reserved_for_others(queue: ModelQueue, tier: Tier) -> int:
    """Free slots held for the other tiers' reservations that they do not use now (rule 7)."""
    held = 0
    for t, reserved in enumerate(queue.reserved):
        if t != int(tier):
            running = queue.running_by_tier[t] if t < len(queue.running_by_tier) else 0
            held += max(0, reserved - running)
    return held


def may_take_slot(queue: ModelQueue, tier: Tier) -> bool:
    """Whether a request of ``tier`` may take a free slot now: one is free beyond those the
    other tiers' reservations hold."""
    return queue.capacity - queue.running - reserved_for_others(queue, tier) > 0


def _fair(waiters: list[Waiter], recent: dict[str, int]) -> list[Waiter]:
    """Round-robin across clients, least recently served first; FIFO inside a client."""
    per_client: dict[str, list[Waiter]] = {}
    for w in sorted(waiters, key=lambda w: w.id):
        per_client.setdefault(w.client, []).append(w)
    clients = sorted(per_client, key=lambda c: (recent.get(c, -1), per_client[c][0].id))
    out: list[Waiter] = []
    rounds = max((len(v) for v in per_client.values()), default=0)
    for r in range(rounds):
        for c in clients:
            queue = per_client[c]
            if r < len(queue):
                out.append(queue[r])
    return out


def _guard(tier_order: list[Waiter], tier: int, guard: int) -> list[Waiter]:
    """Move promoted waiters behind the last guarded waiter of the tier (rule 5)."""
    last = -1
    for i, w in enumerate(tier_order):
        if w.tier == tier and w.skipped_by_lower >= guard:
            last = i
    if last < 0:
        return tier_order
    head = tier_order[: last + 1]
    return [w for w in head if w.tier == tier] + [w for w in head if w.tier != tier] + tier_order[last + 1 :]


def order(queue: ModelQueue) -> list[Waiter]:
    """The order in which the queue's waiters would be granted (see the module docstring)."""
    limit = starvation_limit(queue)
    guard = max(1, queue.capacity)
    recent = {c: i for i, c in enumerate(queue.recent_clients)}
    by_tier: dict[int, list[Waiter]] = {}
    for w in queue.waiters:
        by_tier.setdefault(_effective(w, limit, queue), []).append(w)
    out: list[Waiter] = []
    for tier in sorted(by_tier):
        # A preempted request goes back to the head of its tier (earliest first arrival first).
        requeued = sorted((w for w in by_tier[tier] if w.preempted), key=lambda w: (w.arrived_s, w.id))
        group = [w for w in by_tier[tier] if not w.preempted]
        out.extend(requeued)
        timed = sorted(
            (w for w in group if w.deadline_s is not None),
            key=lambda w: (w.deadline_s, w.id),
        )
        untimed = _fair([w for w in group if w.deadline_s is None], recent)
        out.extend(_guard(timed + untimed, tier, guard))
    return out


def position(queue: ModelQueue, waiter_id: int) -> int | None:
    """1-based place of the waiter in :func:`order`, or None when it is not queued."""
    for i, w in enumerate(order(queue)):
        if w.id == waiter_id:
            return i + 1
    return None


def _wait_for(queue: ModelQueue, ahead: int) -> float:
    free = max(0, queue.capacity - queue.running)
    if queue.service_s is None or free > ahead:
        return 0.0
    return math.ceil(ahead / max(1, queue.capacity)) * max(0.0, queue.service_s)


def predicted_wait_s(queue: ModelQueue, waiter_id: int) -> float:
    """Predicted seconds until the waiter is granted; raises KeyError when it is not queued."""
    pos = position(queue, waiter_id)
    if pos is None:
        raise KeyError(waiter_id)
    return _wait_for(queue, pos - 1)


# --------------------------------------------------------------------------- transitions


def _passed(w: Waiter, granted: Waiter, granted_tier: int, limit: int, queue: ModelQueue) -> Waiter:
    lower = 1 if granted.tier > w.tier else 0
    higher = 1 if granted_tier < _effective(w, limit, queue) else 0
    if not lower and not higher:
        return w
    return msgspec.structs.replace(
        w,
        skipped_by_lower=w.skipped_by_lower + lower,
        skipped_by_higher=w.skipped_by_higher + higher,
    )


def _grant(queue: ModelQueue, granted: Waiter) -> ModelQueue:
    limit = starvation_limit(queue)
    granted_tier = _effective(granted, limit, queue)
    waiters = tuple(
        _passed(w, granted, granted_tier, limit, queue) for w in queue.waiters if w.id != granted.id
    )
    recent = (*(c for c in queue.recent_clients if c != granted.client), granted.client)
    return msgspec.structs.replace(
        queue,
        waiters=waiters,
        running=queue.running + 1,
        running_by_tier=_count(queue.running_by_tier, granted.tier, +1),
        recent_clients=recent[-RECENT_CLIENTS_MAX:],
    )


def _count(counts: tuple[int, ...], tier: Tier, step: int) -> tuple[int, ...]:
    padded = list(counts) + [0] * (len(Tier) - len(counts))
    padded[int(tier)] = max(0, padded[int(tier)] + step)
    return tuple(padded)


def grant_at_once(queue: ModelQueue, waiter: Waiter, *, now_s: float) -> ModelQueue | None:
    """The uncontended case: with a free slot and nobody waiting, ``waiter`` is granted
    without queueing (what :func:`admit` then :func:`assign` would do); None otherwise."""
    if queue.waiters or queue.running >= queue.capacity or not may_take_slot(queue, waiter.tier):
        return None
    if waiter.deadline_s is not None and waiter.deadline_s <= now_s:
        return None  # admit refuses it, with the reason
    return _grant(msgspec.structs.replace(queue, clock_s=now_s), waiter)


def assign(
    queue: ModelQueue,
    *,
    now_s: float,
    queue_timeout_s: float,
    class_timeouts: Mapping[Tier, float] | None = None,
) -> tuple[ModelQueue, list[Effect]]:
    """Expire overdue waiters, then fill the free slots in :func:`order`.

    A waiter expires with reason ``"deadline"`` when ``deadline_s <= now_s``, else
    with ``"class_timeout"`` when its tier has a timeout in ``class_timeouts`` and it
    waited longer, else with ``"timeout"`` when it has waited longer than
    ``queue_timeout_s``. A preempted waiter never times out (its deadline still holds):
    it was admitted once and is owed its turn. Expiries come first in the effects
    (arrival order), then grants in grant order. Grants are made one at a time so that
    the skip counters and ``recent_clients`` of one grant already shape the next; a
    waiter whose tier may not take a slot (the reservations, rule 7) is passed over.
    """
    queue = msgspec.structs.replace(queue, clock_s=now_s)
    effects: list[Effect] = []
    keep: list[Waiter] = []
    for w in queue.waiters:
        own = (class_timeouts or {}).get(w.tier)
        if w.deadline_s is not None and w.deadline_s <= now_s:
            effects.append(Expire(waiter_id=w.id, reason="deadline"))
        elif w.preempted:
            keep.append(w)
        elif own is not None and now_s - w.arrived_s > own:
            effects.append(Expire(waiter_id=w.id, reason="class_timeout"))
        elif now_s - w.arrived_s > queue_timeout_s:
            effects.append(Expire(waiter_id=w.id, reason="timeout"))
        else:
            keep.append(w)
    if len(keep) != len(queue.waiters):
        queue = msgspec.structs.replace(queue, waiters=tuple(keep))
    limit = starvation_limit(queue)
    while queue.running < queue.capacity and queue.waiters:
        nxt = next((w for w in order(queue) if may_take_slot(queue, w.tier)), None)
        if nxt is None:
            break
        promoted = _effective(nxt, limit, queue) < int(nxt.tier)
        queue = _grant(queue, nxt)
        effects.append(Grant(waiter_id=nxt.id, model=queue.model, promoted=promoted))
    return queue, effects


def admit(
    queue: ModelQueue, waiter: Waiter, *, max_queue: int, now_s: float, class_depth: int | None = None
) -> tuple[ModelQueue, Rejection | None]:
    """Queue ``waiter`` or say why not.

    ``QUEUE_FULL`` when ``max_queue`` waiters are already queued; ``DEADLINE_UNMEETABLE``
    when the waiter's deadline has passed or would pass before its predicted grant.
    ``retry_after_s`` is the predicted wait at the place the waiter would take, at
    least 1 s. The queue comes back unchanged on rejection.
    """
    candidate = msgspec.structs.replace(queue, waiters=(*queue.waiters, waiter), clock_s=now_s)
    wait = predicted_wait_s(candidate, waiter.id)
    retry = max(1.0, wait)
    if class_depth is not None and not waiter.preempted:
        same = sum(1 for w in queue.waiters if w.tier == waiter.tier)
        if same >= class_depth:
            return queue, Rejection(
                code="QUEUE_FULL",
                retry_after_s=retry,
                message=(
                    f"the {class_name(waiter.tier)} queue for model '{queue.model}' is full ({same} waiting)"
                    f" — retry in {math.ceil(retry)} s"
                ),
            )
    if len(queue.waiters) >= max_queue:
        return queue, Rejection(
            code="QUEUE_FULL",
            retry_after_s=retry,
            message=(
                f"the queue for model '{queue.model}' is full ({len(queue.waiters)} waiting)"
                f" — retry in {math.ceil(retry)} s"
            ),
        )
    if waiter.deadline_s is not None and now_s + wait >= waiter.deadline_s:
        return queue, Rejection(
            code="DEADLINE_UNMEETABLE",
            retry_after_s=retry,
            message=(
                f"model '{queue.model}' cannot start this request before its deadline"
                f" (predicted wait {wait:.1f} s, {max(0.0, waiter.deadline_s - now_s):.1f} s left)"
                f" — allow more time or retry in {math.ceil(retry)} s"
            ),
        )
    return candidate, None


def withdraw(queue: ModelQueue, waiter_id: int) -> ModelQueue:
    """Remove a waiter that left (disconnect, cancel); unchanged when it is not queued."""
    waiters = tuple(w for w in queue.waiters if w.id != waiter_id)
    if len(waiters) == len(queue.waiters):
        return queue
    return msgspec.structs.replace(queue, waiters=waiters)


def release(queue: ModelQueue, tier: Tier | None = None) -> ModelQueue:
    """A running request (of ``tier``, when known) finished: one slot is free again
    (``running`` never below 0)."""
    by_tier = queue.running_by_tier if tier is None else _count(queue.running_by_tier, tier, -1)
    return msgspec.structs.replace(queue, running=max(0, queue.running - 1), running_by_tier=by_tier)


CLASS_NAMES = ("interactive", "default", "batch", "background")
"""The request classes, by tier: ``interactive`` is HIGH … ``background`` is BACKGROUND."""


def class_name(tier: Tier) -> str:
    return CLASS_NAMES[int(tier)]


def parse_class(value: str) -> Tier | None:
    """The tier a class name (any case) names; None when it names none."""
    name = value.strip().lower()
    return Tier(CLASS_NAMES.index(name)) if name in CLASS_NAMES else None


def update_service(previous_s: float | None, sample_s: float) -> float:
    """Running estimate of the median service time.

    A frugal streaming median: the estimate moves toward each sample by a factor
    of ``1 + SERVICE_STEP`` (up or down), never past the sample. It settles where
    half of the samples are above it, one outlier moves it by at most 12.5 %, it
    costs O(1) with no memory, and it always stays between the smallest and the
    largest sample seen. The first sample (or any sample after a zero estimate)
    is taken as is. Negative samples count as 0.
    """
    sample = max(0.0, sample_s)
    if previous_s is None or previous_s <= 0.0:
        return sample
    if sample > previous_s:
        return min(sample, previous_s * (1.0 + SERVICE_STEP))
    if sample < previous_s:
        return max(sample, previous_s / (1.0 + SERVICE_STEP))
    return previous_s
