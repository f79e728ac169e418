"""Request classes: reservations, per-class queues and timeouts, promotion by waiting time and
preemption — the pure decisions (``actors/scheduling.py``, ``actors/preemption.py``) and the
admission actor that carries them out."""

from __future__ import annotations

import msgspec
import pytest
import trio
import trio.testing

from actors.admission import AdmissionActor, Slot, acquire, reservations
from actors.config import AdmissionConfig, ClassConfig
from actors.errors import AdmissionRejected, Preempted
from actors.preemption import Running, choose_victims
from actors.scheduling import (
    Grant,
    ModelQueue,
    Tier,
    Waiter,
    admit,
    assign,
    effective_tier,
    may_take_slot,
    order,
    parse_class,
    release,
)


def w(i: int, tier: Tier = Tier.NORMAL, *, arrived: float = 0.0, preempted: int = 0) -> Waiter:
    return Waiter(id=i, model="m", tier=tier, client=f"c{i}", arrived_s=arrived, preempted=preempted)


def q(**kw: object) -> ModelQueue:
    base = ModelQueue(model="m", capacity=2, running=0)
    return msgspec.structs.replace(base, **kw)


# ------------------------------------------------------------------------- pure policy


def test_class_names_map_onto_tiers() -> None:
    assert [parse_class(n) for n in ("interactive", "Default", "batch", "BACKGROUND")] == list(Tier)
    assert parse_class("urgent") is None


def test_reservations_round_down_and_always_leave_a_shared_slot() -> None:
    classes = AdmissionConfig(
        interactive=ClassConfig(reserved=0.5), batch=ClassConfig(reserved=0.5), promote_after_s=None
    )
    assert reservations(classes, 4) == (2, 0, 1, 0)  # 2 + 2 would leave none shared: batch is cut
    assert reservations(classes, 1) == (0, 0, 0, 0)
    assert reservations(AdmissionConfig(), 8) == (0, 0, 0, 0)


def test_a_reserved_slot_is_held_for_its_class() -> None:
    queue = q(capacity=2, reserved=(1, 0, 0, 0), waiters=(w(1, Tier.LOW), w(2, Tier.LOW)))
    queue, effects = assign(queue, now_s=0.0, queue_timeout_s=60)
    assert effects == [Grant(waiter_id=1, model="m")]  # the second slot is interactive's
    assert not may_take_slot(queue, Tier.LOW) and may_take_slot(queue, Tier.HIGH)
    queue, effects = assign(
        msgspec.structs.replace(queue, waiters=(*queue.waiters, w(3, Tier.HIGH))),
        now_s=0.0,
        queue_timeout_s=60,
    )
    assert effects == [Grant(waiter_id=3, model="m")]
    assert queue.running_by_tier == (1, 0, 1, 0)
    # With interactive running its reservation, nothing is held: a freed slot goes to batch.
    queue = release(queue, Tier.LOW)
    assert may_take_slot(queue, Tier.LOW)


def test_a_class_queue_has_its_own_depth_with_retry_after_from_the_queue() -> None:
    queue = q(capacity=1, running=1, service_s=4.0, waiters=(w(1, Tier.LOW), w(2, Tier.LOW)))
    same, rej = admit(queue, w(3, Tier.LOW), max_queue=100, now_s=0.0, class_depth=2)
    assert same is queue and rej is not None and rej.code == "QUEUE_FULL"
    assert "batch queue" in rej.message and rej.retry_after_s == 8.0  # 2 ahead, 1 slot, 4 s each
    # Another class is not held back by the batch queue being full.
    _, rej = admit(queue, w(4, Tier.HIGH), max_queue=100, now_s=0.0, class_depth=2)
    assert rej is None
    # A preempted request always gets back in: it had been admitted once.
    _, rej = admit(queue, w(5, Tier.LOW, preempted=1), max_queue=100, now_s=0.0, class_depth=2)
    assert rej is None


def test_a_class_timeout_expires_only_its_class_and_never_a_preempted_request() -> None:
    queue = q(capacity=1, running=1, waiters=(w(1, Tier.LOW), w(2, Tier.HIGH), w(3, Tier.LOW, preempted=1)))
    _, effects = assign(queue, now_s=11.0, queue_timeout_s=60, class_timeouts={Tier.LOW: 10.0})
    assert [(e.waiter_id, getattr(e, "reason", None)) for e in effects] == [(1, "class_timeout")]


def test_promotion_by_waiting_time_lifts_batch_to_interactive() -> None:
    old = w(1, Tier.LOW, arrived=0.0)
    queue = q(promote_after_s=10.0, waiters=(old, w(2, Tier.HIGH, arrived=25.0)))
    for now, tier in ((5.0, Tier.LOW), (10.0, Tier.NORMAL), (20.0, Tier.HIGH), (99.0, Tier.HIGH)):
        assert effective_tier(msgspec.structs.replace(queue, clock_s=now), old) == tier
    # At 25 s the batch request (waiting since 0) is ordered before the interactive one (arrived at 25).
    queue, effects = assign(msgspec.structs.replace(queue, running=1), now_s=25.0, queue_timeout_s=60)
    assert effects == [Grant(waiter_id=1, model="m", promoted=True)]


def test_no_starvation_under_a_steady_stream_of_interactive_requests() -> None:
    """One slot, an interactive request arriving every second, each running 1 s: the batch
    request waiting since 0 is granted within 2 * promote_after_s (+ one service time)."""
    queue = q(capacity=1, promote_after_s=5.0, waiters=(w(0, Tier.LOW),))
    granted_at = None
    for t in range(1, 60):
        queue = msgspec.structs.replace(queue, waiters=(*queue.waiters, w(t, Tier.HIGH, arrived=float(t))))
        queue, effects = assign(queue, now_s=float(t), queue_timeout_s=1e9)
        if any(e.waiter_id == 0 for e in effects):
            granted_at = t
            break
        queue = release(queue, Tier.HIGH)
    assert granted_at is not None and granted_at <= 2 * 5 + 1


def test_a_preempted_request_waits_at_the_head_of_its_class() -> None:
    queue = q(
        waiters=(
            w(1, Tier.LOW, arrived=5.0),
            w(2, Tier.HIGH, arrived=6.0),
            w(3, Tier.LOW, arrived=1.0, preempted=1),
        )
    )
    assert [x.id for x in order(queue)] == [2, 3, 1]


def test_preemption_takes_the_newest_least_urgent_slot_without_output() -> None:
    queue = q(capacity=2, running=2, running_by_tier=(0, 0, 1, 1), waiters=(w(9, Tier.HIGH),))
    running = [
        Running(id=1, tier=Tier.LOW, granted_s=3.0, preemptible=True),
        Running(id=2, tier=Tier.BACKGROUND, granted_s=1.0, preemptible=True),
    ]
    assert choose_victims(queue, running) == [2]  # background before batch
    # One victim per waiting interactive request, counting those already told.
    told = [msgspec.structs.replace(running[1], preempting=True), running[0]]
    assert choose_victims(queue, told) == []
    # Not the default class, not a request with output, not a promoted grant (preemptible=False).
    assert choose_victims(queue, [Running(id=1, tier=Tier.NORMAL, granted_s=0, preemptible=True)]) == []
    assert choose_victims(queue, [Running(id=1, tier=Tier.LOW, granted_s=0, preemptible=False)]) == []
    # No interactive waiter, or a slot it may take already: nothing.
    assert choose_victims(q(running=2, waiters=(w(9, Tier.NORMAL),)), running) == []
    assert choose_victims(q(running=1, waiters=(w(9, Tier.HIGH),)), running) == []


def test_preemption_never_frees_a_slot_the_victims_reservation_holds() -> None:
    queue = q(
        capacity=2, running=2, reserved=(0, 0, 1, 0), running_by_tier=(1, 0, 1, 0), waiters=(w(9, Tier.HIGH),)
    )
    assert choose_victims(queue, [Running(id=1, tier=Tier.LOW, granted_s=0, preemptible=True)]) == []


# ------------------------------------------------------------------------- the actor


async def _start(nursery: trio.Nursery, **kw: object) -> AdmissionActor:
    actor = AdmissionActor(**kw)  # type: ignore[arg-type]
    await nursery.start(actor.run)
    return actor


async def test_an_interactive_request_preempts_batch_work_that_is_requeued_and_completes_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two slots held by batch work inside its preemptible window; three interactive requests
    come one after another. Each batch request is preempted, queues again at the head of its
    class and finally completes exactly once."""
    completed: list[str] = []
    preemptions: dict[str, int] = {"a": 0, "b": 0}
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery)

        async def batch(name: str) -> None:
            requeue = None
            while True:
                slot = await acquire(adm, model="m", capacity=2, tier=Tier.LOW, client=name, requeue=requeue)
                try:
                    with slot.preemptible():
                        await trio.sleep(10)  # waiting for the engine's first output
                    completed.append(name)
                    return
                except Preempted:
                    preemptions[name] += 1
                    requeue = slot.requeue()
                finally:
                    slot.release()

        async def interactive(log: list[float]) -> None:
            slot = await acquire(adm, model="m", capacity=2, tier=Tier.HIGH, client="i")
            log.append(trio.current_time())
            await trio.sleep(1)
            slot.release()

        nursery.start_soon(batch, "a")
        nursery.start_soon(batch, "b")
        await trio.sleep(1)
        t0 = trio.current_time()
        waits: list[float] = []
        for _ in range(3):
            nursery.start_soon(interactive, waits)
            await trio.sleep(2)
        await trio.sleep(60)
        assert sorted(completed) == ["a", "b"]  # each exactly once
        assert sum(preemptions.values()) == 3
        assert all(at - t0 < 0.1 + 2 * i for i, at in enumerate(waits))  # granted at once each time
        stats = adm.statistics()
        batch_stats = next(c for c in stats.classes if c.name == "batch")
        assert stats.preempted == 3 and batch_stats.preempted == 3
        assert batch_stats.granted == 5 and stats.queues[0].running == 0
        nursery.cancel_scope.cancel()


async def test_outside_its_window_batch_work_keeps_its_slot(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery)
        held = await acquire(adm, model="m", capacity=1, tier=Tier.LOW)  # output already flowing
        got: list[Slot] = []

        async def interactive() -> None:
            got.append(await acquire(adm, model="m", capacity=1, tier=Tier.HIGH))

        nursery.start_soon(interactive)
        await trio.sleep(5)
        assert got == [] and adm.statistics().preempted == 0
        held.release()
        await trio.sleep(0.1)
        assert len(got) == 1
        got[0].release()
        nursery.cancel_scope.cancel()


async def test_class_timeout_and_class_queue_depth_in_the_actor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    classes = AdmissionConfig(batch=ClassConfig(max_queue=1, queue_timeout_s=5.0))
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery, classes=classes)
        held = await acquire(adm, model="m", capacity=1, tier=Tier.HIGH)
        errors: list[AdmissionRejected] = []

        async def batch() -> None:
            try:
                await acquire(adm, model="m", capacity=1, tier=Tier.LOW)
            except AdmissionRejected as exc:
                errors.append(exc)

        nursery.start_soon(batch)
        await trio.sleep(0.1)
        nursery.start_soon(batch)
        await trio.sleep(0.1)
        assert [e.code for e in errors] == ["QUEUE_FULL"]
        await trio.sleep(10)
        assert [e.code for e in errors] == ["QUEUE_FULL", "QUEUE_TIMEOUT"]
        assert (errors[1].retry_after_s or 0) >= 1
        stats = next(c for c in adm.statistics().classes if c.name == "batch")
        assert stats.rejected == 1 and stats.expired == 1
        held.release()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("promote", [None, 30.0])
def test_the_default_config_changes_nothing_for_one_class(promote: float | None) -> None:
    queue = q(capacity=1, promote_after_s=promote, waiters=(w(1), w(2)))
    _, effects = assign(queue, now_s=1.0, queue_timeout_s=60)
    assert effects == [Grant(waiter_id=1, model="m")]
