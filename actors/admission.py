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
from dataclasses import dataclass
from typing import assert_never

import msgspec
import trio

from actors.actor import Actor, ActorStatistics
from actors.errors import ActorStopped, AdmissionRejected
from actors.mailbox import Envelope
from actors.scheduling import (
    Expire,
    Grant,
    ModelQueue,
    Tier,
    Waiter,
    admit,
    assign,
    grant_at_once,
    position,
    release,
    update_service,
    withdraw,
)

__all__ = [
    "AdmissionActor",
    "AdmissionStatistics",
    "Draining",
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

    def waiter(self, arrived_s: float) -> Waiter:
        """The queue entry this request becomes."""
        return Waiter(
            id=self.waiter_id,
            model=self.model,
            tier=Tier(self.tier),
            client=self.client,
            arrived_s=arrived_s,
            deadline_s=self.deadline_s,
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


AdmissionMessage = Admit | Withdraw | Draining | Retune


class QueueStatistics(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    capacity: int
    running: int
    queued: int
    service_s: float | None


class AdmissionStatistics(ActorStatistics, frozen=True, kw_only=True):
    draining: bool
    granted: int
    rejected: int
    expired: int
    withdrawn: int
    queues: list[QueueStatistics]


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
    _released: bool = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.admission.release_now(self.waiter_id, self.model, trio.current_time() - self.granted_at_s)


class AdmissionActor(Actor[AdmissionMessage]):
    def __init__(self, *, max_queue: int = 256, queue_timeout_s: float = 120.0) -> None:
        super().__init__("admission", capacity=math.inf)
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self._ids = itertools.count(1)
        self._queues: dict[str, ModelQueue] = {}
        self._envelopes: dict[int, Envelope[AdmissionMessage]] = {}
        self._granted: set[int] = set()
        self._draining = False
        self._counts = {"granted": 0, "rejected": 0, "expired": 0, "withdrawn": 0}

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
            **self._counts,
        )

    async def on_stop(self) -> None:
        for env in self._envelopes.values():
            env.fail(ActorStopped("admission stopped before a slot was free"))
        self._envelopes.clear()

    def next_deadline(self) -> float:
        """The earliest queued deadline or timeout: the loop wakes then to expire it."""
        soonest = math.inf
        for q in self._queues.values():
            for w in q.waiters:
                # Just past the timeout: the scheduler expires waits strictly longer than it.
                soonest = min(soonest, w.arrived_s + self.queue_timeout_s + 1e-3)
                if w.deadline_s is not None:
                    soonest = min(soonest, w.deadline_s)
        return soonest

    def settle(self) -> None:
        """After a batch of messages (or a deadline): grant, and expire, whatever is due."""
        self._assign_all()

    def dispatch(self, env: Envelope[AdmissionMessage]) -> None:
        match env.message:
            case Admit() as m:
                self._admit(env, m)
            case Withdraw(waiter_id=wid, model=model):
                if wid in self._granted:  # the grant raced with the asker's cancellation
                    self._granted.discard(wid)
                    self._queues[model] = release(self._queues[model])
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
            case Retune(max_queue=max_queue, queue_timeout_s=timeout_s):
                self.max_queue, self.queue_timeout_s = max_queue, timeout_s
                env.answer(None)
            case _:
                assert_never(env.message)

    def _admit(self, env: Envelope[AdmissionMessage], m: Admit) -> None:
        """Queue ``m`` (granted in ``settle``) or refuse it."""
        if self._draining:
            self._counts["rejected"] += 1
            env.fail(AdmissionRejected("SHUTTING_DOWN", "the daemon is shutting down: retry on the next one"))
            return
        now = trio.current_time()
        queue = self._queues.get(m.model) or ModelQueue(
            model=m.model, capacity=m.capacity, running=0, waiters=(), service_s=None
        )
        if queue.capacity != m.capacity:
            queue = msgspec.structs.replace(queue, capacity=m.capacity)
        queue, rejection = admit(queue, m.waiter(now), max_queue=self.max_queue, now_s=now)
        self._queues[m.model] = queue
        if rejection is not None:
            self._counts["rejected"] += 1
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
        self._granted.add(m.waiter_id)
        self._counts["granted"] += 1
        return now

    def release_now(self, waiter_id: int, model: str, service_s: float | None) -> None:
        """A granted request is done: free its slot and grant the next waiters."""
        if waiter_id not in self._granted:
            return
        self._granted.discard(waiter_id)
        queue = release(self._queues[model])
        if service_s is not None:
            queue = msgspec.structs.replace(queue, service_s=update_service(queue.service_s, service_s))
        self._queues[model] = queue
        if self._running:
            self._assign_all()

    def _assign_all(self) -> None:
        now = trio.current_time()
        for model, queue in list(self._queues.items()):
            if not queue.waiters:
                continue
            queue, effects = assign(queue, now_s=now, queue_timeout_s=self.queue_timeout_s)
            self._queues[model] = queue
            for effect in effects:
                env = self._envelopes.pop(effect.waiter_id, None)
                match effect:
                    case Grant(waiter_id=wid):
                        self._granted.add(wid)
                        self._counts["granted"] += 1
                        if env is None or env.reply is None or env.reply.done:
                            self._granted.discard(wid)
                            queue = release(self._queues[model])
                            self._queues[model] = queue
                        else:
                            env.answer(now)
                    case Expire(waiter_id=wid, reason=reason):
                        self._counts["expired"] += 1
                        if env is not None:
                            env.fail(_expired(model, reason, queue))


def _expired(model: str, reason: str, queue: ModelQueue) -> AdmissionRejected:
    retry = max(1.0, queue.service_s or 1.0)
    if reason == "deadline":
        return AdmissionRejected(
            "DEADLINE_EXCEEDED",
            f"the request's deadline passed while it waited for a slot on '{model}'",
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
) -> Slot:
    """Wait for a slot. Cancellation withdraws the request (or gives back a grant
    that was already on its way), so a disconnect never leaks a slot."""
    waiter_id = waiter_id if waiter_id is not None else admission.next_id()
    arrived = trio.current_time()
    message = Admit(
        waiter_id=waiter_id,
        model=model,
        capacity=capacity,
        tier=int(tier),
        client=client,
        deadline_s=deadline_s,
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
    )
