"""EngineActor's states without a child process: the launch is faked, the clock is trio's."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from actors.config import EngineConfig
from actors.engine import (
    EngineActor,
    EngineHandle,
    EngineState,
    EnsureReady,
    Reconfigure,
    WaitSpawned,
    _Launched,
)
from actors.engines.llamacpp import LaunchSpec
from actors.errors import EngineCircuitOpen, EngineCrashed
from actors.process import ChildProcess
from actors.upstream import UpstreamPool


def _engine(tmp_path: Path, **config: float) -> EngineActor:
    spec = LaunchSpec(model="m", path=str(tmp_path / "m.gguf"), ctx_per_slot=512, slots=2)
    return EngineActor(spec, EngineConfig(**config), run_dir=tmp_path)  # type: ignore[arg-type]


async def test_the_breaker_trips_and_resets_on_the_trio_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    async def cannot_spawn(*args: object, **kwargs: object) -> ChildProcess:
        raise OSError("no such engine binary")

    monkeypatch.setattr(ChildProcess, "spawn", cannot_spawn)
    engine = _engine(tmp_path, breaker_crashes=2, breaker_window_s=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        for _ in range(2):
            with pytest.raises(EngineCrashed, match="no such engine binary"):
                await engine.ask(EnsureReady())
            await trio.sleep(10)
        with pytest.raises(EngineCircuitOpen) as tripped:
            await engine.ask(EnsureReady())
        assert tripped.value.retry_after_s == pytest.approx(40)  # until the first crash leaves the window
        assert engine.statistics().crashes == 2 and engine.state is EngineState.FAILED
        await trio.sleep(41)
        with pytest.raises(EngineCrashed):  # the window passed: it tries again
            await engine.ask(EnsureReady())
        assert engine.restarts == 2
        nursery.cancel_scope.cancel()


async def test_wait_spawned_answers_at_once_without_a_start_and_when_the_start_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawning = trio.Event()
    may_fail = trio.Event()

    async def spawn_fails_late(*args: object, **kwargs: object) -> ChildProcess:
        spawning.set()
        await may_fail.wait()
        raise OSError("no such engine binary")

    monkeypatch.setattr(ChildProcess, "spawn", spawn_fails_late)
    engine = _engine(tmp_path)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            assert await engine.ask(WaitSpawned()) is None  # stopped: nothing to wait for
            await engine.tell(EnsureReady())
            answered = trio.Event()

            async def wait_spawned() -> None:
                await engine.ask(WaitSpawned())
                answered.set()

            nursery.start_soon(wait_spawned)
            await spawning.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert engine.state is EngineState.STARTING and not answered.is_set()
            may_fail.set()
            await answered.wait()  # the start is over: the waiter is answered, not left hanging
            assert engine.state is EngineState.FAILED
            nursery.cancel_scope.cancel()


def _handle(generation: int) -> EngineHandle:
    return EngineHandle(
        model="m",
        base_url="http://127.0.0.1:9",
        generation=generation,
        pid=0,
        client=httpx.AsyncClient(),
        upstream=UpstreamPool("127.0.0.1", 9, headers={}, max_idle=1, idle_expiry_s=1.0),
    )


async def test_the_fast_paths_have_no_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ready_handle, lease and its release rest on 'no checkpoint between check and change'."""

    async def launch(self: EngineActor, generation: int) -> None:
        await self.tell(_Launched(generation=generation, handle=_handle(generation)))

    monkeypatch.setattr(EngineActor, "_launch", launch)
    engine = _engine(tmp_path)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            handle = await engine.ask(EnsureReady())
            with trio.testing.assert_no_checkpoints():
                assert engine.ready_handle() is handle
                lease = engine.lease()
                assert engine.in_flight == 1
                lease.release()
                lease.release()  # once only
                assert engine.in_flight == 0
            lease = engine.lease()
            await engine.ask(Reconfigure(ctx_per_slot=1024))  # waits for the lease
            assert engine.ready_handle() is None and engine.state is EngineState.READY
            with trio.testing.assert_no_checkpoints():
                lease.release()  # the last one: tells the actor to restart, without waiting
            await trio.testing.wait_all_tasks_blocked()
            assert engine.state is EngineState.STOPPED and engine.spec.ctx_per_slot == 1024
            assert (await engine.ask(EnsureReady())).generation == 2
            nursery.cancel_scope.cancel()


async def test_speculation_and_adapters_change_after_the_running_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The governor's park and resume, and `blazar lora add`, restart the child once it is idle."""
    from actors.engines.spec import LoraLoad, SpecLoad

    async def launch(self: EngineActor, generation: int) -> None:
        await self.tell(_Launched(generation=generation, handle=_handle(generation)))

    monkeypatch.setattr(EngineActor, "_launch", launch)
    ngram = SpecLoad(ngram="ngram-simple", max=16)
    spec = LaunchSpec(model="m", path=str(tmp_path / "m.gguf"), ctx_per_slot=512, slots=2, speculation=ngram)
    engine = EngineActor(spec, EngineConfig(), run_dir=tmp_path)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            await engine.ask(EnsureReady())
            lease = engine.lease()
            await engine.ask(Reconfigure(speculation="off"))
            assert engine.spec.speculation == ngram  # a request still runs on it
            lease.release()
            await trio.testing.wait_all_tasks_blocked()
            assert engine.state is EngineState.STOPPED and engine.spec.speculation is None
            await engine.ask(EnsureReady())
            await engine.ask(Reconfigure(speculation=ngram))  # resumed: idle, so at once
            assert engine.spec.speculation == ngram and engine.state is EngineState.STOPPED
            adapters = [LoraLoad(name="a", path="/a.gguf", scale=0.5)]
            await engine.ask(Reconfigure(loras=adapters))
            assert engine.spec.loras == adapters and engine.spec.speculation == ngram
            assert (await engine.ask(EnsureReady())).generation == 3
            nursery.cancel_scope.cancel()
