from typing import Any

import pytest
import trio
import trio.testing

from actors.actor import Actor
from actors.errors import ActorStopped, BlazarRuntimeError
from actors.mailbox import Envelope


class ModelNotFound(BlazarRuntimeError):
    pass


class Calc(Actor[tuple[str, int]]):
    def __init__(self) -> None:
        super().__init__("calc", capacity=8)
        self.total = 0
        self.events: list[str] = []

    async def on_start(self) -> None:
        self.events.append("start")

    async def on_stop(self) -> None:
        self.events.append("stop")

    async def handle(self, message: tuple[str, int]) -> Any:
        op, value = message
        if op == "add":
            self.total += value
            return self.total
        if op == "block":
            await trio.sleep_forever()
        if op == "missing":
            raise ModelNotFound(f"no model {value}")
        raise ZeroDivisionError("bug")


async def test_not_running_before_start() -> None:
    calc = Calc()
    with pytest.raises(ActorStopped):
        await calc.ask(("add", 1))
    assert "stopped" in repr(calc)


async def test_handles_messages_in_order() -> None:
    with trio.fail_after(1):
        calc = Calc()
        async with trio.open_nursery() as nursery:
            assert await nursery.start(calc.run) is calc
            await calc.tell(("add", 1))
            calc.tell_nowait(("add", 2))
            assert await calc.ask(("add", 3)) == 6
            stats = calc.statistics()
            assert stats.running and stats.handled == 3 and stats.queued == 0
            assert repr(calc) == "<Calc calc running handled=3>"
            nursery.cancel_scope.cancel()
        assert calc.events == ["start", "stop"]
        assert not calc.statistics().running


async def test_runtime_error_goes_to_asker_and_actor_keeps_running() -> None:
    with trio.fail_after(1):
        calc = Calc()
        async with trio.open_nursery() as nursery:
            await nursery.start(calc.run)
            with pytest.raises(ModelNotFound):
                await calc.ask(("missing", 7))
            assert await calc.ask(("add", 5)) == 5
            nursery.cancel_scope.cancel()


async def test_plain_exception_crashes_actor_and_reaches_asker() -> None:
    with trio.fail_after(1):
        calc = Calc()
        asker_got: list[BaseException] = []

        async def ask_bug() -> None:
            try:
                await calc.ask(("div", 0))
            except ZeroDivisionError as exc:
                asker_got.append(exc)

        async with trio.open_nursery() as outer:
            with pytest.RaisesGroup(ZeroDivisionError):
                async with trio.open_nursery() as nursery:
                    await nursery.start(calc.run)
                    outer.start_soon(ask_bug)
        assert len(asker_got) == 1
        assert calc.events == ["start", "stop"]
        with pytest.raises(ActorStopped):
            await calc.ask(("add", 1))


async def test_pending_asks_fail_when_actor_stops() -> None:
    with trio.fail_after(1):
        calc = Calc()
        failures: list[BaseException] = []

        async def ask_one(op: str) -> None:
            try:
                await calc.ask((op, 1))
            except ActorStopped as exc:
                failures.append(exc)

        async with trio.open_nursery() as outer:
            async with trio.open_nursery() as nursery:
                await nursery.start(calc.run)
                outer.start_soon(ask_one, "block")  # in hand when the actor stops
                await trio.testing.wait_all_tasks_blocked()
                outer.start_soon(ask_one, "add")  # still queued
                await trio.testing.wait_all_tasks_blocked()
                assert calc.statistics().queued == 1
                nursery.cancel_scope.cancel()
        assert len(failures) == 2


class Batcher(Actor[int]):
    """Sums what arrives; ``settle`` closes each batch, a deadline ends an idle spell."""

    def __init__(self, idle_s: float) -> None:
        super().__init__("batcher")
        self.idle_s = idle_s
        self.current: list[int] = []
        self.batches: list[list[int]] = []
        self.timeouts: list[float] = []
        self.last_s = 0.0

    def dispatch(self, env: Envelope[int]) -> None:
        self.current.append(env.message)
        self.last_s = trio.current_time()
        env.answer(sum(self.current))

    def next_deadline(self) -> float:
        return self.last_s + self.idle_s

    def on_deadline(self) -> None:
        self.timeouts.append(trio.current_time())
        self.last_s = trio.current_time()

    def settle(self) -> None:
        if self.current:
            self.batches.append(self.current)
            self.current = []


async def test_a_burst_is_one_batch_and_settles_once(autojump_clock: trio.testing.MockClock) -> None:
    batcher = Batcher(idle_s=100)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        for i in range(5):  # no checkpoint in between: all five are queued at once
            batcher.tell_nowait(i)
        assert await batcher.ask(5) == 15  # handled in the same batch, after the five
        assert batcher.batches == [[0, 1, 2, 3, 4, 5]]
        assert await batcher.ask(7) == 7
        assert batcher.batches == [[0, 1, 2, 3, 4, 5], [7]]
        assert batcher.statistics().handled == 7
        nursery.cancel_scope.cancel()


async def test_the_deadline_wakes_the_loop_without_a_message(autojump_clock: trio.testing.MockClock) -> None:
    batcher = Batcher(idle_s=10)
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        await nursery.start(batcher.run)
        await trio.sleep(25)
        assert [t - t0 for t in batcher.timeouts] == [10, 20]
        await trio.sleep(4)
        await batcher.ask(1)  # a message re-arms the deadline from now
        await trio.sleep(9)
        assert [t - t0 for t in batcher.timeouts] == [10, 20]
        await trio.sleep(2)
        assert [t - t0 for t in batcher.timeouts] == [10, 20, 39]
        nursery.cancel_scope.cancel()


async def test_a_bug_ends_run_with_the_bare_exception() -> None:
    """Not wrapped in the group of the actor's own nursery: a supervisor records the bug itself."""
    with trio.fail_after(1):
        calc = Calc()

        async def poke() -> None:
            await trio.testing.wait_all_tasks_blocked()
            calc.tell_nowait(("div", 0))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poke)
            with pytest.raises(ZeroDivisionError):
                await calc.run()
