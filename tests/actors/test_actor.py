from typing import Any

import pytest
import trio
import trio.testing

from actors.actor import Actor
from actors.errors import ActorStopped, BlazarRuntimeError


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
