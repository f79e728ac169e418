"""AdmissionActor: the sole owner of every model's queue, slots and leases.

A request asks for a slot with ``acquire``; the actor refuses it at once (with
a reason and a Retry-After) or queues it, and after each batch of messages
(``settle``) ``actors.scheduling.assign`` grants the free slots and expires what
waited too long, so one burst of requests is ordered as a whole. Which waiter
goes next is decided there, by pure functions; this actor only applies their
effects and keeps time (it wakes at the earliest deadline, ``next_deadline``).

Exactly-once: every granted id is in ``_granted`` until its release (or a
``Withdraw`` from an asker that was cancelled while the grant was on its way)
removes it, and only that removal frees the slot. A waiter that disconnects is
withdrawn at once and never reaches an engine.

The uncontended case skips the mailbox: when a model has a free slot, nobody
waits for one and no message is queued ahead, ``acquire`` is granted on the
spot (``grant_now``), and a release (``release_now``) frees the slot and grants
the next waiters at once. Both are synchronous, so each is one atomic step on
the event loop, exactly like the message the actor would have handled; every
other case (queueing, deadlines, refusals) goes through the mailbox.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import assert_never

import msgspec
import trio

from actors.actor import Actor, ActorStatistics
from actors.config import AdmissionConfig
from actors.errors import ActorStopped, AdmissionRejected, Preempted
from actors.mailbox import Envelope
from actors.preemption import Running, choose_victims
from actors.scheduling import (
    CLASS_NAMES,
    Expire,
    Grant,
    ModelQueue,
    Tier,
    Waiter,
    admit,
    assign,
    class_name,
    grant_at_once,
    position,
    release,
    update_service,
    withdraw,
)

__all__ = [
    "AdmissionActor",
    "AdmissionStatistics",
    "ClassStatistics",
    "Draining",
    "Requeue",
    "Slot",
    "acquire",
]


class Admit(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    waiter_id: int
    model: str
    capacity: int
    tier: int
    client: str
    deadline_s: float | None = None
    arrived_s: float | None = None
    """A preempted request's first arrival (its waits and promotion count from it)."""
    preempted: int = 0
    """Times the request was preempted: above 0 it queues at the head of its class."""

    def waiter(self, arrived_s: float) -> Waiter:
        """The queue entry this request becomes."""
        return Waiter(
            id=self.waiter_id,
            model=self.model,
            tier=Tier(self.tier),
            client=self.client,
            arrived_s=self.arrived_s if self.arrived_s is not None else arrived_s,
            deadline_s=self.deadline_s,
            preempted=self.preempted,
        )


class Withdraw(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    waiter_id: int
    model: str


class Draining(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Stop admitting: every new and queued request is refused (shutdown)."""


class Retune(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """New queue limits (a config reload): they apply to the next decisions, and a waiter
    already queued is timed out by the new ``queue_timeout_s``."""

    max_queue: int
    queue_timeout_s: float
    classes: AdmissionConfig | None = None


AdmissionMessage = Admit | Withdraw | Draining | Retune


class QueueStatistics(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    capacity: int
    running: int
    queued: int
    service_s: float | None


class ClassStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """One request class, over every model."""

    name: str
    queued: int
    running: int
    granted: int
    waited_s: float
    """Seconds the granted requests of the class waited, summed (with ``granted``: the mean)."""
    rejected: int
    expired: int
    preempted: int


class AdmissionStatistics(ActorStatistics, frozen=True, kw_only=True):
    draining: bool
    granted: int
    rejected: int
    expired: int
    withdrawn: int
    preempted: int
    queues: list[QueueStatistics]
    classes: list[ClassStatistics]


@dataclass
class _Held:
    """A granted request, as the actor tracks it for preemption."""

    model: str
    tier: Tier
    granted_s: float
    promoted: bool
    window: trio.CancelScope | None = None
    """Set while the holder runs its preemptible window (``Slot.preemptible``)."""
    preempting: bool = False


@dataclass
class _ClassCounts:
    granted: int = 0
    waited_s: float = 0.0
    rejected: int = 0
    expired: int = 0
    preempted: int = 0


class Requeue(msgspec.Struct, frozen=True, kw_only=True):
    """What a preempted request carries into its next ``acquire``."""

    arrived_s: float
    preempted: int


@dataclass
class Slot:
    """A granted slot; ``release`` (idempotent) gives it back."""

    admission: AdmissionActor
    waiter_id: int
    model: str
    granted_at_s: float
    queued_s: float
    ahead: int = 0
    """Requests already waiting for the model when this one arrived (0: granted at once)."""
    tier: Tier = Tier.NORMAL
    arrived_s: float = 0.0
    """When the request first asked (kept across preemptions)."""
    preemptions: int = 0
    """Times the request had been preempted before this slot."""
    _released: bool = False
    _preempted: bool = field(default=False, repr=False)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        service = None if self._preempted else trio.current_time() - self.granted_at_s
        self.admission.release_now(self.waiter_id, self.model, service)

    @property
    def preempted(self) -> bool:
        return self._preempted

    def requeue(self) -> Requeue:
        """What the next ``acquire`` of a preempted request passes on (``requeue=``)."""
        return Requeue(arrived_s=self.arrived_s, preempted=self.preemptions + 1)

    @contextmanager
    def preemptible(self) -> Iterator[None]:
        """Run the block as this slot's preemptible window: until it ends, a waiting
        interactive request may take the slot (``actors/preemption.py``). Preempted, the
        block is cancelled and ``Preempted`` raised: release the slot and ``acquire`` again
        with ``requeue=slot.requeue()``. End the block at the request's first output."""
        scope = trio.CancelScope()
        self.admission.open_window(self, scope)
        try:
            with scope:
                yield
        finally:
            self.admission.close_window(self.waiter_id)
        if scope.cancelled_caught and self._preempted:
            raise Preempted(self.model)
        self._preempted = False  # told too late: the block had already finished


class AdmissionActor(Actor[AdmissionMessage]):
    def __init__(
        self, *, max_queue: int = 256, queue_timeout_s: float = 120.0, classes: AdmissionConfig | None = None
    ) -> None:
        super().__init__("admission", capacity=math.inf)
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.classes = classes or AdmissionConfig()
        self._ids = itertools.count(1)
        self._queues: dict[str, ModelQueue] = {}
        self._envelopes: dict[int, Envelope[AdmissionMessage]] = {}
        self._granted: dict[int, _Held] = {}
        self._draining = False
        self._counts = {"granted": 0, "rejected": 0, "expired": 0, "withdrawn": 0, "preempted": 0}
        self._by_class = [_ClassCounts() for _ in CLASS_NAMES]
        self._slots: dict[int, Slot] = {}
        """The slots inside their preemptible window, by waiter id."""

    def __repr__(self) -> str:
        queued = sum(len(q.waiters) for q in self._queues.values())
        running = sum(q.running for q in self._queues.values())
        return f"<AdmissionActor queued={queued} running={running} draining={self._draining}>"

    def next_id(self) -> int:
        return next(self._ids)

    def waiting(self, model: str) -> int:
        """Requests waiting for a slot of ``model`` now."""
        queue = self._queues.get(model)
        return len(queue.waiters) if queue else 0

    def position(self, model: str, waiter_id: int) -> int | None:
        queue = self._queues.get(model)
        return position(queue, waiter_id) if queue else None

    def statistics(self) -> AdmissionStatistics:
        queued = [0] * len(CLASS_NAMES)
        running = [0] * len(CLASS_NAMES)
        for q in self._queues.values():
            for w in q.waiters:
                queued[int(w.tier)] += 1
        for held in self._granted.values():
            running[int(held.tier)] += 1
        return AdmissionStatistics(
            **self.actor_fields(),
            draining=self._draining,
            queues=[
                QueueStatistics(
                    model=q.model,
                    capacity=q.capacity,
                    running=q.running,
                    queued=len(q.waiters),
                    service_s=q.service_s,
                )
                for q in self._queues.values()
            ],
            classes=[
                ClassStatistics(
                    name=name,
                    queued=queued[t],
                    running=running[t],
                    granted=c.granted,
                    waited_s=c.waited_s,
                    rejected=c.rejected,
                    expired=c.expired,
                    preempted=c.preempted,
                )
                for t, (name, c) in enumerate(zip(CLASS_NAMES, self._by_class, strict=True))
            ],
            **self._counts,
        )

    async def on_stop(self) -> None:
        for env in self._envelopes.values():
            env.fail(ActorStopped("admission stopped before a slot was free"))
        self._envelopes.clear()

    def _timeouts(self) -> dict[Tier, float]:
        return {
            Tier(t): c.queue_timeout_s
            for t, c in enumerate(self.classes.classes())
            if c.queue_timeout_s is not None
        }

    def next_deadline(self) -> float:
        """The earliest queued deadline, timeout or promotion: the loop wakes then to act on it."""
        soonest = math.inf
        timeouts = self._timeouts()
        promote = self.classes.promote_after_s
        for q in self._queues.values():
            for w in q.waiters:
                if not w.preempted:
                    # Just past the timeout: the scheduler expires waits strictly longer than it.
                    limit = min(self.queue_timeout_s, timeouts.get(w.tier, math.inf))
                    soonest = min(soonest, w.arrived_s + limit + 1e-3)
                if w.deadline_s is not None:
                    soonest = min(soonest, w.deadline_s)
                if promote is not None and w.tier > Tier.HIGH:
                    waited = q.clock_s - w.arrived_s
                    soonest = min(soonest, w.arrived_s + (math.floor(waited / promote) + 1) * promote + 1e-3)
        return soonest

    def settle(self) -> None:
        """After a batch of messages (or a deadline): grant, expire and preempt whatever is due."""
        self._assign_all()

    def dispatch(self, env: Envelope[AdmissionMessage]) -> None:
        match env.message:
            case Admit() as m:
                self._admit(env, m)
            case Withdraw(waiter_id=wid, model=model):
                if (held := self._granted.pop(wid, None)) is not None:  # the grant raced the cancel
                    self._queues[model] = release(self._queues[model], held.tier)
                elif model in self._queues and self._envelopes.pop(wid, None) is not None:
                    self._queues[model] = withdraw(self._queues[model], wid)
                    self._counts["withdrawn"] += 1
            case Draining():
                self._draining = True
                for wid, waiting in list(self._envelopes.items()):
                    waiting.fail(
                        AdmissionRejected("SHUTTING_DOWN", "the daemon is shutting down: retry later")
                    )
                    del self._envelopes[wid]
                for model, queue in self._queues.items():
                    self._queues[model] = msgspec.structs.replace(queue, waiters=())
                env.answer(None)
            case Retune(max_queue=max_queue, queue_timeout_s=timeout_s, classes=classes):
                self.max_queue, self.queue_timeout_s = max_queue, timeout_s
                if classes is not None:
                    self.classes = classes
                    for model, queue in self._queues.items():
                        self._queues[model] = self._shaped(queue, queue.capacity)
                env.answer(None)
            case _:
                assert_never(env.message)

    def _shaped(self, queue: ModelQueue, capacity: int) -> ModelQueue:
        """``queue`` with ``capacity`` and the class settings (reservations, promotion)."""
        return msgspec.structs.replace(
            queue,
            capacity=capacity,
            reserved=reservations(self.classes, capacity),
            promote_after_s=self.classes.promote_after_s,
        )

    def _queue(self, model: str, capacity: int) -> ModelQueue:
        queue = self._queues.get(model)
        if queue is None:
            queue = self._shaped(ModelQueue(model=model, capacity=capacity, running=0), capacity)
        elif queue.capacity != capacity:
            queue = self._shaped(queue, capacity)
        return queue

    def _admit(self, env: Envelope[AdmissionMessage], m: Admit) -> None:
        """Queue ``m`` (granted in ``settle``) or refuse it."""
        if self._draining:
            self._counts["rejected"] += 1
            env.fail(AdmissionRejected("SHUTTING_DOWN", "the daemon is shutting down: retry on the next one"))
            return
        now = trio.current_time()
        queue = self._queue(m.model, m.capacity)
        depth = self.classes.classes()[m.tier].max_queue
        queue, rejection = admit(queue, m.waiter(now), max_queue=self.max_queue, now_s=now, class_depth=depth)
        self._queues[m.model] = queue
        if rejection is not None:
            self._counts["rejected"] += 1
            self._by_class[m.tier].rejected += 1
            env.fail(
                AdmissionRejected(rejection.code, rejection.message, retry_after_s=rejection.retry_after_s)
            )
            return
        self._envelopes[m.waiter_id] = env

    def grant_now(self, m: Admit) -> float | None:
        """Grant ``m`` on the spot when its model has a free slot, nobody waits and no
        message is queued ahead of it (nobody is overtaken); None: ``ask`` instead."""
        if not self._running or self._draining or self.mailbox.backlog():
            return None
        queue = self._queues.get(m.model)
        if queue is None or queue.capacity != m.capacity:
            return None
        now = trio.current_time()
        granted = grant_at_once(queue, m.waiter(now), now_s=now)
        if granted is None:
            return None
        self._queues[m.model] = granted
        self._held(m.waiter_id, m.model, Tier(m.tier), now, promoted=False, waited_s=0.0)
        return now

    def _held(self, wid: int, model: str, tier: Tier, now: float, *, promoted: bool, waited_s: float) -> None:
        self._granted[wid] = _Held(model=model, tier=tier, granted_s=now, promoted=promoted)
        self._counts["granted"] += 1
        counts = self._by_class[tier]
        counts.granted += 1
        counts.waited_s += max(0.0, waited_s)

    def release_now(self, waiter_id: int, model: str, service_s: float | None) -> None:
        """A granted request is done: free its slot and grant the next waiters."""
        held = self._granted.pop(waiter_id, None)
        if held is None:
            return
        queue = release(self._queues[model], held.tier)
        if service_s is not None:
            queue = msgspec.structs.replace(queue, service_s=update_service(queue.service_s, service_s))
        self._queues[model] = queue
        if self._running:
            self._assign_all()

    def open_window(self, slot: Slot, scope: trio.CancelScope) -> None:
        """``slot`` may be preempted until ``close_window`` (``Slot.preemptible``)."""
        held = self._granted.get(slot.waiter_id)
        if held is None:
            return
        held.window = scope
        self._slots[slot.waiter_id] = slot
        if self._running and self.classes.preemption:
            self._preempt(slot.model)

    def close_window(self, waiter_id: int) -> None:
        self._slots.pop(waiter_id, None)
        if (held := self._granted.get(waiter_id)) is not None:
            held.window = None

    def _preempt(self, model: str) -> None:
        queue = self._queues.get(model)
        if queue is None or not queue.waiters:
            return
        running = [
            Running(
                id=wid,
                tier=h.tier,
                granted_s=h.granted_s,
                preemptible=h.window is not None and not h.promoted,
                preempting=h.preempting,
            )
            for wid, h in self._granted.items()
            if h.model == model
        ]
        for wid in choose_victims(queue, running):
            held = self._granted[wid]
            slot = self._slots.get(wid)
            if slot is None or held.window is None:
                continue
            held.preempting = True
            slot._preempted = True
            held.window.cancel()
            self._counts["preempted"] += 1
            self._by_class[held.tier].preempted += 1

    def _assign_all(self) -> None:
        now = trio.current_time()
        timeouts = self._timeouts()
        for model, queue in list(self._queues.items()):
            if not queue.waiters:
                continue
            waited = {w.id: now - w.arrived_s for w in queue.waiters}
            tiers = {w.id: w.tier for w in queue.waiters}
            queue, effects = assign(
                queue, now_s=now, queue_timeout_s=self.queue_timeout_s, class_timeouts=timeouts
            )
            self._queues[model] = queue
            for effect in effects:
                env = self._envelopes.pop(effect.waiter_id, None)
                match effect:
                    case Grant(waiter_id=wid, promoted=promoted):
                        tier = tiers[wid]
                        self._held(wid, model, tier, now, promoted=promoted, waited_s=waited[wid])
                        if env is None or env.reply is None or env.reply.done:
                            del self._granted[wid]
                            queue = release(self._queues[model], tier)
                            self._queues[model] = queue
                        else:
                            env.answer(now)
                    case Expire(waiter_id=wid, reason=reason):
                        self._counts["expired"] += 1
                        self._by_class[tiers[wid]].expired += 1
                        if env is not None:
                            env.fail(_expired(model, reason, queue, tiers[wid], waited[wid]))
            if self.classes.preemption:
                self._preempt(model)


def reservations(classes: AdmissionConfig, capacity: int) -> tuple[int, ...]:
    """Slots reserved per tier for a model of ``capacity`` slots: each class's share rounded
    down, the less urgent classes' cut first so that at least one slot stays shared."""
    reserved = [int(c.reserved * capacity) for c in classes.classes()]
    for t in reversed(range(len(reserved))):
        excess = sum(reserved) - max(0, capacity - 1)
        if excess <= 0:
            break
        reserved[t] -= min(reserved[t], excess)
    return tuple(reserved)


def _expired(model: str, reason: str, queue: ModelQueue, tier: Tier, waited_s: float) -> AdmissionRejected:
    retry = max(1.0, queue.service_s or 1.0)
    if reason == "deadline":
        return AdmissionRejected(
            "DEADLINE_EXCEEDED",
            f"the request's deadline passed while it waited for a slot on '{model}'",
            retry_after_s=retry,
        )
    if reason == "class_timeout":
        return AdmissionRejected(
            "QUEUE_TIMEOUT",
            f"the request waited {waited_s:.1f} s in the {class_name(tier)} queue of '{model}', longer"
            f" than the class's queue_timeout_s — retry later, or raise [admission.{class_name(tier)}]"
            " queue_timeout_s",
            retry_after_s=retry,
        )
    return AdmissionRejected(
        "ALL_SLOTS_BUSY",
        f"every slot of '{model}' stayed busy for the whole wait — retry later or raise queue_timeout_s",
        retry_after_s=retry,
    )


async def acquire(
    admission: AdmissionActor,
    *,
    model: str,
    capacity: int,
    tier: Tier = Tier.NORMAL,
    client: str = "",
    deadline_s: float | None = None,
    waiter_id: int | None = None,
    requeue: Requeue | None = None,
) -> Slot:
    """Wait for a slot. Cancellation withdraws the request (or gives back a grant
    that was already on its way), so a disconnect never leaks a slot. ``requeue``: the
    request was preempted (``Slot.requeue``): it queues at the head of its class."""
    waiter_id = waiter_id if waiter_id is not None else admission.next_id()
    arrived = trio.current_time()
    message = Admit(
        waiter_id=waiter_id,
        model=model,
        capacity=capacity,
        tier=int(tier),
        client=client,
        deadline_s=deadline_s,
        arrived_s=requeue.arrived_s if requeue is not None else None,
        preempted=requeue.preempted if requeue is not None else 0,
    )
    granted_at = admission.grant_now(message)
    ahead = 0
    if granted_at is None:
        ahead = admission.waiting(model)
        try:
            granted_at = await admission.ask(message)
        except BaseException:
            try:
                admission.tell_nowait(Withdraw(waiter_id=waiter_id, model=model))
            except (ActorStopped, trio.WouldBlock):
                pass
            raise
    return Slot(
        admission=admission,
        waiter_id=waiter_id,
        model=model,
        granted_at_s=granted_at,
        queued_s=granted_at - arrived,
        ahead=ahead,
        tier=tier,
        arrived_s=message.arrived_s if message.arrived_s is not None else arrived,
        preemptions=message.preempted,
    )
