import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from actors.actor import Actor
from actors.errors import ActorStopped, SupervisorEscalation
from actors.supervisor import ChildSpec, Restart, Supervisor

Start = Callable[..., Awaitable[None]]


def crasher(starts: list[float], *, after_s: float = 0.0, error: bool = True) -> Start:
    """A child that starts, lives ``after_s``, then crashes (or returns cleanly)."""

    async def start(*, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        task_status.started(len(starts))
        await trio.sleep(after_s)
        if error:
            raise ValueError(f"boom {len(starts)}")

    return start


async def forever(*, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started("up")
    await trio.sleep_forever()


class Runner:
    """Runs a supervisor in a task and keeps what ``run()`` raised, unwrapped."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.raised: BaseException | None = None
        self.ended = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[Supervisor]) -> None:
        try:
            await self.sup.run(task_status=task_status)
        except SupervisorEscalation as exc:
            self.raised = exc
        finally:
            self.ended.set()


async def test_permanent_child_restarted_with_doubling_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(60):
        starts: list[float] = []
        sup = Supervisor("s", max_restarts=10, window_s=100, backoff_max_s=0.5)
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            t0 = trio.current_time()
            assert await sup.start_child(ChildSpec("c", crasher(starts))) == 1
            await trio.sleep(1.75)  # starts at 0, 0.1, 0.3, 0.7, 1.2, 1.7
            gaps = [round(b - a, 6) for a, b in itertools.pairwise(starts)]
            assert starts[0] == t0
            assert gaps == [0.1, 0.2, 0.4, 0.5, 0.5]  # doubling, then capped
            stats = sup.statistics().children[0]
            assert stats.restarts == len(starts)  # the last crash is already counted
            assert stats.last_error == f"ValueError: boom {len(starts)}"
            nursery.cancel_scope.cancel()


async def test_child_accessor_follows_restarts(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(60):
        starts: list[float] = []
        sup = Supervisor("s", max_restarts=10)
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await sup.start_child(ChildSpec("c", crasher(starts, after_s=1)))
            assert sup.child("c") == 1
            await trio.sleep(1.05)  # crashed, in backoff
            assert sup.statistics().children[0].state == "restarting"
            with pytest.raises(ActorStopped):
                sup.child("c")
            await trio.sleep(0.1)
            assert sup.child("c") == 2
            assert sup.children() == ["c"]
            with pytest.raises(KeyError):
                sup.child("nope")
            nursery.cancel_scope.cancel()


async def test_transient_restarted_on_error_not_on_clean_exit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(60):
        failing: list[float] = []
        clean: list[float] = []
        sup = Supervisor("s", max_restarts=10)
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await sup.start_child(ChildSpec("bad", crasher(failing, after_s=1), Restart.TRANSIENT))
            await sup.start_child(ChildSpec("ok", crasher(clean, after_s=1, error=False), Restart.TRANSIENT))
            await trio.sleep(10)
            assert len(clean) == 1
            assert len(failing) > 3
            by_name = {c.name: c for c in sup.statistics().children}
            assert by_name["ok"].state == "stopped"
            assert by_name["ok"].restarts == 0
            assert by_name["ok"].last_error is None
            assert by_name["bad"].restart == "transient"
            assert sup.children() == ["bad"]
            nursery.cancel_scope.cancel()


async def test_temporary_never_restarted(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(60):
        failing: list[float] = []
        clean: list[float] = []
        sup = Supervisor("s")
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await sup.start_child(ChildSpec("bad", crasher(failing), Restart.TEMPORARY))
            await sup.start_child(ChildSpec("ok", crasher(clean, error=False), Restart.TEMPORARY))
            await trio.sleep(10)
            assert len(failing) == len(clean) == 1
            by_name = {c.name: c for c in sup.statistics().children}
            assert by_name["bad"].state == "failed"
            assert by_name["bad"].last_error == "ValueError: boom 1"
            assert by_name["ok"].state == "stopped"
            assert sup.children() == []
            # an ended child's name may be used again
            assert await sup.start_child(ChildSpec("ok", forever)) == "up"
            nursery.cancel_scope.cancel()


async def test_permanent_restarted_after_clean_exit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(60):
        starts: list[float] = []
        sup = Supervisor("s", max_restarts=10, window_s=1)
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await sup.start_child(ChildSpec("c", crasher(starts, after_s=2, error=False)))
            await trio.sleep(7)
            assert len(starts) == 4  # 0, 2.1, 4.2, 6.3: outside the window, so 0.1 s each
            nursery.cancel_scope.cancel()


async def test_escalates_after_max_restarts_in_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(60):
        starts: list[float] = []
        sup = Supervisor("s", max_restarts=3, window_s=5)
        runner = Runner(sup)
        stopped: list[str] = []

        async def sibling(*, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                stopped.append("sibling")

        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await sup.start_child(ChildSpec("sib", sibling))
            t0 = trio.current_time()
            await sup.start_child(ChildSpec("c", crasher(starts)))
            await runner.ended.wait()
            assert trio.current_time() - t0 == pytest.approx(0.7)
        assert len(starts) == 4  # the first run and 3 restarts
        assert isinstance(runner.raised, SupervisorEscalation)
        assert isinstance(runner.raised.__cause__, ValueError)
        assert str(runner.raised.__cause__) == "boom 4"
        assert stopped == ["sibling"]
        stats = sup.statistics()
        assert stats.escalated
        assert {c.name: c.state for c in stats.children} == {"sib": "stopped", "c": "failed"}
        assert "escalated" in repr(sup)
        with pytest.raises(ActorStopped):
            await sup.start_child(ChildSpec("late", forever))


async def test_restarts_spread_beyond_window_do_not_escalate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        starts: list[float] = []
        sup = Supervisor("s", max_restarts=2, window_s=5)
        runner = Runner(sup)
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await sup.start_child(ChildSpec("c", crasher(starts, after_s=6)))
            await trio.sleep(100)
            assert not runner.ended.is_set()
            assert len(starts) > 10
            gaps = {round(b - a, 6) for a, b in itertools.pairwise(starts)}
            assert gaps == {6.1}  # the backoff never grows either
            nursery.cancel_scope.cancel()
        assert runner.raised is None
        assert not sup.statistics().escalated


async def test_start_failure_on_restart_counts(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(60):
        attempts: list[float] = []
        sup = Supervisor("s", max_restarts=3, window_s=5)
        runner = Runner(sup)

        async def flaky(*, task_status: trio.TaskStatus[str]) -> None:
            attempts.append(trio.current_time())
            if len(attempts) > 1:
                raise OSError("cannot bind")  # fails before started
            task_status.started("first")
            raise ValueError("crash")

        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            assert await sup.start_child(ChildSpec("c", flaky)) == "first"
            await runner.ended.wait()
        assert len(attempts) == 4
        assert isinstance(runner.raised, SupervisorEscalation)
        assert isinstance(runner.raised.__cause__, OSError)
        assert sup.statistics().children[0].last_error == "OSError: cannot bind"


async def test_start_ending_without_started_counts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(60):
        sup = Supervisor("s", max_restarts=1)
        runner = Runner(sup)
        calls = 0

        async def quitter(*, task_status: trio.TaskStatus[None]) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                task_status.started()

        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await sup.start_child(ChildSpec("c", quitter))
            await runner.ended.wait()
        assert calls == 2  # a clean exit, restarted; then no ``started``: escalates
        assert isinstance(runner.raised, SupervisorEscalation)
        assert isinstance(runner.raised.__cause__, RuntimeError)


async def test_first_start_failure_raised_to_caller() -> None:
    with trio.fail_after(5):

        async def broken(*, task_status: trio.TaskStatus[None]) -> None:
            raise OSError("no binary")

        sup = Supervisor("s")
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            with pytest.raises(OSError, match="no binary"):
                await sup.start_child(ChildSpec("c", broken))
            assert sup.statistics().children == []
            assert await sup.start_child(ChildSpec("c", forever)) == "up"
            nursery.cancel_scope.cancel()


async def test_duplicate_name_and_not_running() -> None:
    with trio.fail_after(5):
        sup = Supervisor("s")
        with pytest.raises(ActorStopped):
            await sup.start_child(ChildSpec("c", forever))
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await sup.start_child(ChildSpec("c", forever))
            with pytest.raises(ValueError, match="already has"):
                await sup.start_child(ChildSpec("c", forever))
            nursery.cancel_scope.cancel()
        with pytest.raises(ActorStopped):
            await sup.start_child(ChildSpec("d", forever))


async def test_teardown_stops_children_in_reverse_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(60):
        order: list[str] = []

        def child(name: str, cleanup_s: float) -> Start:
            async def start(*, task_status: trio.TaskStatus[str]) -> None:
                task_status.started(name)
                try:
                    await trio.sleep_forever()
                finally:
                    with trio.CancelScope(shield=True):
                        await trio.sleep(cleanup_s)  # slow cleanup still runs in order
                    order.append(name)

            return start

        sup = Supervisor("s")
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            for name in ["a", "b", "c"]:
                await sup.start_child(ChildSpec(name, child(name, 1.0)))
            assert sup.children() == ["a", "b", "c"]
            nursery.cancel_scope.cancel()
        assert order == ["c", "b", "a"]
        assert {c.state for c in sup.statistics().children} == {"stopped"}


async def test_shutdown_grace_is_bounded(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(60):
        stopped_at: dict[str, float] = {}

        def child(name: str, cleanup_s: float) -> Start:
            async def start(*, task_status: trio.TaskStatus[str]) -> None:
                task_status.started(name)
                try:
                    await trio.sleep_forever()
                finally:
                    with trio.CancelScope(shield=True):
                        await trio.sleep(cleanup_s)
                    stopped_at[name] = trio.current_time()

            return start

        sup = Supervisor("s")
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await sup.start_child(ChildSpec("a", child("a", 0.5)))
            await sup.start_child(ChildSpec("slow", child("slow", 10), shutdown_s=2))
            t0 = trio.current_time()
            nursery.cancel_scope.cancel()
        # "a" is not kept waiting past the slow child's grace
        assert stopped_at["a"] - t0 == pytest.approx(2.5)
        assert stopped_at["slow"] - t0 == pytest.approx(10)


async def test_stop_child(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(60):
        sup = Supervisor("s")
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await sup.start_child(ChildSpec("a", forever))
            await sup.start_child(ChildSpec("b", forever))
            await sup.stop_child("a")
            await trio.sleep(10)
            assert sup.children() == ["b"]
            a = sup.statistics().children[0]
            assert (a.name, a.state, a.restarts) == ("a", "stopped", 0)
            with pytest.raises(ActorStopped):
                sup.child("a")
            await sup.stop_child("a")  # already stopped: no-op
            with pytest.raises(KeyError):
                await sup.stop_child("nope")
            nursery.cancel_scope.cancel()


async def test_stop_child_cuts_backoff_short(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(60):
        starts: list[float] = []
        sup = Supervisor("s", backoff_initial_s=30, backoff_max_s=30)
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await sup.start_child(ChildSpec("c", crasher(starts)))
            await trio.testing.wait_all_tasks_blocked()
            t0 = trio.current_time()
            await sup.stop_child("c")
            assert trio.current_time() == t0
            await trio.sleep(50)
            assert len(starts) == 1
            nursery.cancel_scope.cancel()


class Echo(Actor[str]):
    async def handle(self, message: str) -> Any:
        if message == "crash":
            raise RuntimeError("bug")
        return message


async def test_supervises_an_actor_and_reports(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(60):
        echo = Echo("echo")
        sup = Supervisor("engines")
        assert repr(sup) == "<Supervisor engines stopped running=0/0 restarts=0>"
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            assert await sup.start_child(ChildSpec("echo", echo.run)) is echo
            assert sup.child("echo") is echo
            with pytest.raises(RuntimeError):
                await echo.ask("crash")
            await trio.sleep(1)
            assert await echo.ask("hi") == "hi"  # restarted, same address
            stats = sup.statistics()
            assert stats.name == "engines"
            assert not stats.escalated
            (c,) = stats.children
            assert (c.name, c.restart, c.state, c.restarts) == ("echo", "permanent", "running", 1)
            assert c.last_error == "RuntimeError: bug"
            assert repr(sup) == "<Supervisor engines running running=1/1 restarts=1>"
            nursery.cancel_scope.cancel()
        assert not echo.statistics().running


async def test_child_may_start_inside_its_own_nursery(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(60):
        starts: list[float] = []

        async def with_helpers(*, task_status: trio.TaskStatus[str]) -> None:
            starts.append(trio.current_time())
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep_forever)
                task_status.started("helped")
                await trio.sleep(1)
                raise ValueError("helper died")

        sup = Supervisor("s", max_restarts=10)
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            assert await sup.start_child(ChildSpec("c", with_helpers)) == "helped"
            await trio.sleep(2.5)
            assert len(starts) == 3
            assert sup.child("c") == "helped"
            nursery.cancel_scope.cancel()
        assert sup.children() == []
