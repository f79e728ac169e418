"""AdmissionActor: grants, queueing, withdrawal, timeouts, draining — no slot ever leaks."""

from __future__ import annotations

import random

import pytest
import trio
import trio.lowlevel
import trio.testing

from actors.admission import AdmissionActor, Admit, Draining, Slot, acquire
from actors.errors import AdmissionRejected
from actors.scheduling import Tier


async def _start(nursery: trio.Nursery, **kw: float) -> AdmissionActor:
    actor = AdmissionActor(**kw)  # type: ignore[arg-type]
    await nursery.start(actor.run)
    return actor


def _running(actor: AdmissionActor, model: str = "m") -> int:
    return next((q.running for q in actor.statistics().queues if q.model == model), 0)


async def test_grants_up_to_capacity_then_queues(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery)
        slots = [await acquire(adm, model="m", capacity=2) for _ in range(2)]
        got: list[Slot] = []

        async def third() -> None:
            got.append(await acquire(adm, model="m", capacity=2))

        nursery.start_soon(third)
        await trio.sleep(1)
        assert got == [] and _running(adm) == 2
        assert adm.statistics().queues[0].queued == 1
        slots[0].release()
        slots[0].release()  # idempotent
        await trio.sleep(1)
        assert len(got) == 1 and _running(adm) == 2
        for s in (slots[1], got[0]):
            s.release()
        await trio.sleep(0.1)
        assert _running(adm) == 0
        nursery.cancel_scope.cancel()


async def test_a_cancelled_waiter_is_withdrawn_and_never_granted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery)
        held = await acquire(adm, model="m", capacity=1)
        with trio.move_on_after(5):
            await acquire(adm, model="m", capacity=1)
            pytest.fail("should still be queued")
        await trio.sleep(0.1)
        stats = adm.statistics()
        assert stats.withdrawn == 1 and stats.queues[0].queued == 0
        held.release()
        await trio.sleep(0.1)
        assert _running(adm) == 0 and adm.statistics().granted == 1
        nursery.cancel_scope.cancel()


async def test_queue_full_and_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery, max_queue=1, queue_timeout_s=30)
        held = await acquire(adm, model="m", capacity=1)
        errors: list[AdmissionRejected] = []

        async def wait() -> None:
            try:
                await acquire(adm, model="m", capacity=1)
            except AdmissionRejected as exc:
                errors.append(exc)

        nursery.start_soon(wait)
        await trio.sleep(1)
        with pytest.raises(AdmissionRejected) as full:
            await acquire(adm, model="m", capacity=1)
        assert full.value.code == "QUEUE_FULL" and (full.value.retry_after_s or 0) >= 1
        await trio.sleep(40)
        assert [e.code for e in errors] == ["ALL_SLOTS_BUSY"]
        held.release()
        nursery.cancel_scope.cancel()


async def test_high_priority_goes_first(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery)
        held = await acquire(adm, model="m", capacity=1)
        order: list[str] = []

        async def ask(name: str, tier: Tier) -> None:
            slot = await acquire(adm, model="m", capacity=1, tier=tier, client=name)
            order.append(name)
            await trio.sleep(1)
            slot.release()

        for name, tier in (("low", Tier.LOW), ("normal", Tier.NORMAL), ("high", Tier.HIGH)):
            nursery.start_soon(ask, name, tier)
            await trio.sleep(0.1)
        held.release()
        await trio.sleep(10)
        assert order == ["high", "normal", "low"]
        nursery.cancel_scope.cancel()


async def test_draining_refuses_queued_and_new(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery)
        held = await acquire(adm, model="m", capacity=1)
        codes: list[str] = []

        async def wait() -> None:
            try:
                await acquire(adm, model="m", capacity=1)
            except AdmissionRejected as exc:
                codes.append(exc.code)

        nursery.start_soon(wait)
        await trio.sleep(1)
        await adm.ask(Draining())
        await trio.sleep(0.1)
        with pytest.raises(AdmissionRejected) as new:
            await acquire(adm, model="m", capacity=1)
        assert codes == ["SHUTTING_DOWN"] and new.value.code == "SHUTTING_DOWN"
        held.release()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", range(5))
async def test_random_cancels_never_leak_a_slot(seed: int, autojump_clock: trio.testing.MockClock) -> None:
    rng = random.Random(seed)
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery)

        async def client(i: int) -> None:
            with trio.move_on_after(rng.uniform(0, 3)):
                slot = await acquire(
                    adm, model="m", capacity=3, tier=Tier(rng.randrange(3)), client=str(i % 4)
                )
                try:
                    await trio.sleep(rng.uniform(0, 2))
                finally:
                    slot.release()

        async with trio.open_nursery() as clients:
            for i in range(60):
                clients.start_soon(client, i)
                await trio.sleep(rng.uniform(0, 0.2))
        await trio.sleep(1)
        stats = adm.statistics()
        assert stats.queues[0].running == 0 and stats.queues[0].queued == 0
        nursery.cancel_scope.cancel()


async def test_the_uncontended_case_skips_the_mailbox_and_a_release_grants_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A free slot with nobody waiting is granted on the spot (the actor handles no
    message for it); a release hands the slot to the next waiter in the same step."""
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery)
        first = await acquire(adm, model="m", capacity=2)  # creates the queue: a message
        sent = adm.mailbox.statistics().sent
        second = await acquire(adm, model="m", capacity=2)
        assert adm.mailbox.statistics().sent == sent and _running(adm) == 2
        assert second.queued_s == 0
        got: list[Slot] = []

        async def third() -> None:
            got.append(await acquire(adm, model="m", capacity=2))

        nursery.start_soon(third)
        await trio.sleep(1)
        assert got == []
        first.release()
        assert adm.statistics().queues[0].queued == 0 and _running(adm) == 2  # granted in the release
        await trio.testing.wait_all_tasks_blocked()
        assert len(got) == 1 and got[0].queued_s == pytest.approx(1.0)
        for s in (second, got[0]):
            s.release()
        assert _running(adm) == 0 and adm.statistics().granted == 3
        nursery.cancel_scope.cancel()


async def test_a_backlog_in_the_mailbox_is_never_overtaken(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery)
        (await acquire(adm, model="m", capacity=5)).release()
        adm.tell_nowait(Admit(waiter_id=adm.next_id(), model="m", capacity=5, tier=1, client="c"))
        assert (
            adm.grant_now(Admit(waiter_id=adm.next_id(), model="m", capacity=5, tier=1, client="c")) is None
        )
        nursery.cancel_scope.cancel()


async def test_the_fast_paths_have_no_checkpoint(autojump_clock: trio.testing.MockClock) -> None:
    """grant_now, an uncontended acquire and a release (which grants the next waiter) each
    check and change the queue in one step: an await added to them fails here."""
    async with trio.open_nursery() as nursery:
        adm = await _start(nursery)
        (await acquire(adm, model="m", capacity=2)).release()  # the queue exists from now on
        with trio.testing.assert_no_checkpoints():
            message = Admit(waiter_id=adm.next_id(), model="m", capacity=2, tier=1, client="c")
            assert adm.grant_now(message) is not None
            slot = await acquire(adm, model="m", capacity=2)
        got: list[Slot] = []

        async def third() -> None:
            got.append(await acquire(adm, model="m", capacity=2))

        nursery.start_soon(third)
        await trio.testing.wait_all_tasks_blocked()
        with trio.testing.assert_no_checkpoints():
            slot.release()  # hands the slot to the waiter in the same step
            assert adm.statistics().queues[0].queued == 0 and _running(adm) == 2
            adm.release_now(message.waiter_id, "m", None)
            assert _running(adm) == 1
        await trio.testing.wait_all_tasks_blocked()
        assert len(got) == 1
        got[0].release()
        nursery.cancel_scope.cancel()
