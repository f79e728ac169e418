"""Model lifecycle: the pure eviction planner and idle timer, and the LifecycleActor
on fake engines (no child process) under trio's autojump clock."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from actors.config import RuntimeConfig
from actors.errors import ActorStopped, InsufficientMemory, MaxLoadedModels, ModelBusy, ModelTooLarge
from actors.eviction import Resident, Timer, arm, choose_evictions, tick
from actors.lifecycle import LifecycleActor, ModelLifecycle
from actors.runtime_open import open_runtime

# -- choose_evictions -------------------------------------------------------------

_names = st.sampled_from([f"m{i}" for i in range(8)])


@st.composite
def _residents(draw: st.DrawFn) -> list[Resident]:
    names = draw(st.lists(_names, unique=True, max_size=8))
    return [
        Resident(
            model=n,
            last_used_s=draw(st.integers(min_value=0, max_value=20)),
            in_flight=draw(st.integers(min_value=0, max_value=2)),
            queued=draw(st.integers(min_value=0, max_value=2)),
            memory_bytes=draw(st.integers(min_value=1, max_value=10)),
        )
        for n in names
    ]


def _lru_key(r: Resident) -> tuple[float, str]:
    return (r.last_used_s, r.model)


@given(_residents(), _names, st.integers(min_value=0, max_value=6))
def test_eviction_plan_by_count(residents: list[Resident], incoming: str, max_loaded: int) -> None:
    plan = choose_evictions(residents, incoming=incoming, max_loaded=max_loaded)
    by_name = {r.model: r for r in residents}
    others = [r for r in residents if r.model != incoming]
    idle = sorted((r for r in others if not r.busy), key=_lru_key)
    busy = [r for r in others if r.busy]
    assert incoming not in plan.evict
    assert all(m in by_name and not by_name[m].busy for m in plan.evict)
    assert len(set(plan.evict)) == len(plan.evict)
    assert set(plan.busy) == {r.model for r in busy}
    if max_loaded <= 0:
        assert plan.ok and plan.evict == ()
        return
    if len(busy) + 1 > max_loaded:  # even evicting every idle model would not be enough
        assert not plan.ok and plan.evict == ()
        assert plan.refused and "max_loaded_models" in plan.refused and incoming in plan.refused
        return
    assert plan.ok
    needed = max(0, len(others) + 1 - max_loaded)
    assert len(plan.evict) == needed  # only as many as needed …
    assert list(plan.evict) == [r.model for r in idle[:needed]]  # … least recently used first
    assert len(others) - len(plan.evict) + 1 <= max_loaded


@given(_residents(), _names, st.integers(min_value=0, max_value=30), st.integers(min_value=0, max_value=5))
def test_eviction_plan_with_a_fit_hook(
    residents: list[Resident], incoming: str, budget: int, max_loaded: int
) -> None:
    need = 4

    def fits(kept: list[Resident]) -> bool:
        return sum(r.memory_bytes or 0 for r in kept) + need <= budget

    plan = choose_evictions(residents, incoming=incoming, max_loaded=max_loaded, fits=fits)
    others = [r for r in residents if r.model != incoming]
    idle = sorted((r for r in others if not r.busy), key=_lru_key)
    assert incoming not in plan.evict
    assert all(not r.busy for r in others if r.model in plan.evict)
    if plan.ok:
        kept = [r for r in others if r.model not in plan.evict]
        assert fits(kept) and (max_loaded <= 0 or len(kept) + 1 <= max_loaded)
        assert list(plan.evict) == [r.model for r in idle[: len(plan.evict)]]
        if plan.evict:  # minimal: one eviction fewer would not do
            fewer = set(plan.evict[:-1])
            kept_more = [r for r in others if r.model not in fewer]
            assert not (fits(kept_more) and (max_loaded <= 0 or len(kept_more) + 1 <= max_loaded))
    else:
        assert plan.evict == ()
        kept = [r for r in others if r.busy]  # what is left after every idle model goes
        assert not (fits(kept) and (max_loaded <= 0 or len(kept) + 1 <= max_loaded))


def test_eviction_refusal_names_the_busy_models() -> None:
    plan = choose_evictions(
        [Resident(model="a", last_used_s=1, in_flight=1), Resident(model="b", last_used_s=2, queued=3)],
        incoming="c",
        max_loaded=2,
    )
    assert not plan.ok and plan.busy == ("a", "b")
    assert plan.refused is not None and "(a, b)" in plan.refused and "max_loaded_models = 2" in plan.refused
    ok = choose_evictions(
        [Resident(model="c", last_used_s=0), Resident(model="a", last_used_s=1)], incoming="c", max_loaded=1
    )
    assert ok.ok and ok.evict == ("a",)  # the incoming model never goes, even when it is the oldest


# -- tick -------------------------------------------------------------------------


@given(
    st.integers(min_value=-20, max_value=200).map(lambda n: n / 4),
    st.integers(min_value=0, max_value=400).map(lambda n: n / 4),
    st.booleans(),
    st.booleans(),
)
def test_tick(keep: float, now: float, busy: bool, waiting: bool) -> None:
    timer = arm(10.0, keep)
    timer = Timer(last_used_s=10.0, keep_alive_s=keep, deadline_s=timer.deadline_s, waiting=waiting)
    new, unload = tick(timer, now_s=10.0 + now, busy=busy, recheck_s=0.25)
    if keep < 0 or 10.0 + now < 10.0 + keep:
        assert (new, unload) == (timer, False)  # forever, or not due yet
    elif busy:
        assert not unload and new is not None and new.waiting and new.deadline_s == 10.0 + now + 0.25
    elif waiting:  # idle again without a touch: a full keep-alive from now
        assert unload == (keep == 0)
        if keep > 0:
            assert new is not None and new.deadline_s == 10.0 + now + keep and not new.waiting
    else:
        assert (new, unload) == (None, True)


# -- the actor on fake engines -------------------------------------------------------


class World:
    """Engines and admission as the actor sees them, by hand."""

    def __init__(self, stop_s: float = 0.5) -> None:
        self.loaded: dict[str, int] = {}
        self.pending: dict[str, int] = {}
        self.stopped: list[tuple[float, str]] = []
        self.stop_s = stop_s

    async def stop(self, model: str) -> bool:
        was = model in self.loaded
        await trio.sleep(self.stop_s)
        self.loaded.pop(model, None)
        self.stopped.append((trio.current_time(), model))
        return was

    sizes: dict[str, int] = {}
    budget: int | None = None

    def hooks(self) -> ModelLifecycle:
        return ModelLifecycle(
            loaded=lambda: self.loaded,
            pending=lambda: self.pending,
            stop=self.stop,
            footprint=self.sizes.get,
            memory_budget=lambda held: self.budget,
            advice=lambda model, budget: f"try --ctx 1024 for {model}",
        )

    def names(self) -> list[str]:
        return [m for _, m in self.stopped]


async def _start(nursery: trio.Nursery, world: World, **kw: object) -> LifecycleActor:
    actor = LifecycleActor(world.hooks(), **kw)  # type: ignore[arg-type]
    await nursery.start(actor.run)
    return actor


async def test_default_keep_alive_unloads_after_300_s(autojump_clock: trio.testing.MockClock) -> None:
    world = World()
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world)
        world.loaded["a"] = 0
        t0 = trio.current_time()
        life.touch_nowait("a", None)
        await trio.sleep(299)
        assert world.stopped == []
        expires = life.expires_at("a")
        assert expires is not None and abs(expires - (time.time() + 1)) < 0.5
        await trio.sleep(2)
        assert world.names() == ["a"]
        assert world.stopped[0][0] - t0 == pytest.approx(300 + world.stop_s, abs=0.01)
        assert life.expires_at("a") is None  # no longer tracked
        assert life.statistics().idle_unloads == 1
        nursery.cancel_scope.cancel()


async def test_keep_alive_zero_and_forever(autojump_clock: trio.testing.MockClock) -> None:
    world = World(stop_s=0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world)
        world.loaded.update(a=0, b=0)
        t0 = trio.current_time()
        life.touch_nowait("a", 0)
        life.touch_nowait("b", -1)
        await trio.sleep(0.01)
        assert world.stopped == [(t0, "a")]  # 0: unloaded right after the request
        await trio.sleep(80_000)
        assert world.names() == ["a"] and "b" in world.loaded  # negative: forever
        assert life.expires_at("b") is None
        nursery.cancel_scope.cancel()


async def test_a_new_request_re_arms_the_timer(autojump_clock: trio.testing.MockClock) -> None:
    world = World(stop_s=0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world, keep_alive_s=300.0)
        world.loaded["a"] = 0
        t0 = trio.current_time()
        life.touch_nowait("a", None)
        await trio.sleep(200)
        life.touch_nowait("a", None)  # a second request ended at t0 + 200
        await trio.sleep(101)
        assert world.stopped == []
        await trio.sleep(200)
        assert world.stopped == [(t0 + 500, "a")]
        nursery.cancel_scope.cancel()


async def test_a_busy_model_is_not_unloaded_until_its_work_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    world = World(stop_s=0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world, keep_alive_s=10.0)
        world.loaded["a"] = 0
        life.touch_nowait("a", None)
        await trio.sleep(5)
        world.loaded["a"] = 1  # a request started (nobody tells the actor)
        await trio.sleep(20)
        assert world.stopped == []
        expires = life.expires_at("a")
        assert expires is not None and expires >= time.time() + 9  # a full keep-alive from now at least
        t_end = trio.current_time()
        world.loaded["a"] = 0  # it ended without a touch: idle from now on
        await trio.sleep(9)
        assert world.stopped == []
        await trio.sleep(2)
        assert world.names() == ["a"] and world.stopped[0][0] - t_end == pytest.approx(10, abs=0.3)
        nursery.cancel_scope.cancel()


async def test_keep_alive_zero_waits_for_admission_to_let_go(autojump_clock: trio.testing.MockClock) -> None:
    world = World(stop_s=0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world, recheck_s=0.25)
        world.loaded["a"] = 0
        world.pending["a"] = 1  # admission has not processed the slot's release yet
        life.touch_nowait("a", 0)
        await trio.sleep(0.1)
        assert world.stopped == []
        del world.pending["a"]
        await trio.sleep(0.3)
        assert world.names() == ["a"]
        nursery.cancel_scope.cancel()


async def test_per_model_keep_alive_from_config(autojump_clock: trio.testing.MockClock) -> None:
    world = World(stop_s=0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world, model_keep_alive={"pinned": -1.0, "quick": 5.0})
        world.loaded.update(pinned=0, quick=0, other=0)
        for m in ("pinned", "quick", "other"):
            life.touch_nowait(m, None)
        await trio.sleep(6)
        assert world.names() == ["quick"]
        await trio.sleep(300)
        assert world.names() == ["quick", "other"]
        life.touch_nowait("pinned", 1)  # a request's own keep-alive wins over the model's
        await trio.sleep(2)
        assert world.names() == ["quick", "other", "pinned"]
        nursery.cancel_scope.cancel()


async def test_max_loaded_one_evicts_the_idle_model_before_a_load(
    autojump_clock: trio.testing.MockClock,
) -> None:
    world = World(stop_s=1.0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world, max_loaded_models=1)
        assert await life.before_load("a") == ()  # nothing loaded: nothing to evict
        world.loaded["a"] = 0
        life.touch_nowait("a", None)
        t0 = trio.current_time()
        assert await life.before_load("b") == ("a",)  # the answer names what was evicted
        assert world.names() == ["a"]
        assert trio.current_time() - t0 == pytest.approx(1.0)  # returns once the engine has stopped
        world.loaded["b"] = 1
        assert await life.before_load("b") == ()  # already resident: nothing to evict
        assert world.names() == ["a"]
        assert life.statistics().evictions == 1 and life.statistics().evicting == []
        nursery.cancel_scope.cancel()


async def test_eviction_takes_the_least_recently_used_idle_model(
    autojump_clock: trio.testing.MockClock,
) -> None:
    world = World(stop_s=0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world, max_loaded_models=3)
        world.loaded.update(a=0, b=1, c=0)
        life.touch_nowait("c", None)
        await trio.sleep(1)
        life.touch_nowait("a", None)
        life.touch_nowait("b", None)
        await trio.sleep(1)
        await life.before_load("d")
        assert world.names() == ["c"]  # the oldest idle one; b is busy
        world.loaded["d"] = 1
        await life.before_load("e")
        assert world.names() == ["c", "a"]
        nursery.cancel_scope.cancel()


async def test_a_load_waits_while_every_model_is_busy(autojump_clock: trio.testing.MockClock) -> None:
    world = World(stop_s=0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world, max_loaded_models=1, load_wait_s=60.0)
        world.loaded["a"] = 1
        t0 = trio.current_time()

        async def finish_a() -> None:
            await trio.sleep(5)
            world.loaded["a"] = 0
            life.touch_nowait("a", None)

        nursery.start_soon(finish_a)
        await life.before_load("b")
        assert world.names() == ["a"] and trio.current_time() - t0 == pytest.approx(5, abs=0.01)
        nursery.cancel_scope.cancel()


async def test_a_load_is_refused_when_the_busy_models_stay_busy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    world = World(stop_s=0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world, max_loaded_models=2, load_wait_s=10.0)
        world.loaded.update(a=2)
        world.pending["b"] = 1
        world.loaded["b"] = 0
        t0 = trio.current_time()
        with pytest.raises(MaxLoadedModels) as info:
            await life.before_load("c")
        assert trio.current_time() - t0 == pytest.approx(10, abs=0.3)
        exc = info.value
        assert exc.code == "MAX_LOADED_MODELS" and exc.retry_after_s is not None
        assert "(a, b)" in exc.message and "max_loaded_models" in exc.message
        assert world.stopped == [] and life.statistics().refused == 1
        nursery.cancel_scope.cancel()


async def test_concurrent_loads_never_exceed_the_limit(autojump_clock: trio.testing.MockClock) -> None:
    world = World(stop_s=0.5)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world, max_loaded_models=1, load_wait_s=60.0)
        world.loaded["a"] = 0
        life.touch_nowait("a", None)
        order: list[str] = []

        async def request(model: str, run_s: float) -> None:
            await life.before_load(model)
            order.append(model)
            assert world.loaded == {}  # max 1: whatever was loaded has been evicted first
            world.loaded[model] = 1  # the engine starts and serves the request
            await trio.sleep(run_s)
            world.loaded[model] = 0
            life.touch_nowait(model, None)

        async with trio.open_nursery() as clients:
            clients.start_soon(request, "b", 3.0)
            clients.start_soon(request, "c", 3.0)
        assert sorted(order) == ["b", "c"]
        assert world.names() == ["a", order[0]]  # the second load waited for the first to finish
        nursery.cancel_scope.cancel()


async def test_unload_and_evict_idle(autojump_clock: trio.testing.MockClock) -> None:
    world = World(stop_s=0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world)
        world.loaded.update(a=0, b=2, c=0)
        life.touch_nowait("a", None)
        with pytest.raises(ModelBusy) as info:
            await life.unload("b", only_idle=True)
        assert info.value.code == "MODEL_BUSY" and "'b'" in info.value.message
        assert await life.evict_idle() == ["a", "c"]
        assert sorted(world.loaded) == ["b"] and life.expires_at("a") is None
        assert await life.unload("b") is True  # not only idle: stopped anyway
        assert await life.unload("zzz") is False
        await trio.sleep(1000)
        assert world.names() == ["a", "c", "b", "zzz"]  # the stale timer of 'a' unloads nothing more
        nursery.cancel_scope.cancel()


async def test_statistics_and_repr(autojump_clock: trio.testing.MockClock) -> None:
    world = World(stop_s=0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world, max_loaded_models=2, keep_alive_s=60.0)
        world.loaded.update(a=1, b=0)
        world.pending["a"] = 2
        life.touch_nowait("b", None)
        await trio.sleep(1)
        stats = life.statistics()
        assert stats.running and stats.max_loaded_models == 2 and stats.keep_alive_s == 60.0
        by = {m.model: m for m in stats.models}
        assert by["a"].in_flight == 1 and by["a"].queued == 2 and by["a"].last_used_at is None
        assert by["b"].expires_at is not None and by["b"].last_used_at is not None
        assert by["b"].expires_at - by["b"].last_used_at == pytest.approx(60, abs=0.5)
        text = repr(life)
        assert "\n" not in text and "LifecycleActor running" in text and "max_loaded=2" in text
        nursery.cancel_scope.cancel()
    assert "stopped" in repr(life) and not life.statistics().running


# -- in the runtime ------------------------------------------------------------------


async def test_open_runtime_starts_lifecycle_and_survives_a_bad_preload(tmp_path: Path) -> None:
    config = RuntimeConfig(
        home=str(tmp_path),
        run_dir=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "cache"),
        keep_alive_s=42.0,
        max_loaded_models=3,
        preload=["not-installed"],
    )
    with trio.fail_after(10):
        async with open_runtime(config) as rt:
            await trio.sleep(0.05)  # the preload fails in the background, logged
            stats = rt.statistics().lifecycle
            assert stats.running and stats.keep_alive_s == 42.0 and stats.max_loaded_models == 3
            assert rt.lifecycle.expires_at("not-installed") is None
            assert await rt.lifecycle.evict_idle() == []
            assert "lifecycle" in rt.root.children()


async def test_open_runtime_returns_once_the_preloaded_engine_has_spawned(instant_home: Path) -> None:
    """The preload's engine process runs as soon as the runtime is open, before any request:
    what the caller does next (the daemon: importing its gateway) overlaps its start."""
    from blazar.config import resolve_paths
    from tests.instant import MODEL, instant_config

    config = instant_config(preload=[MODEL]).runtime(resolve_paths())
    with trio.fail_after(30):
        async with open_runtime(config) as rt:
            engine = rt.engine_if_loaded(MODEL)
            assert engine is not None
            stats = engine.statistics()
            assert stats.state in ("starting", "ready") and stats.pid is not None
            assert all(q.running + q.queued == 0 for q in rt.admission.statistics().queues)  # no request


async def test_a_preload_whose_engine_cannot_spawn_is_tried_once(
    instant_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from actors.process import ChildProcess
    from blazar.config import resolve_paths
    from tests.instant import MODEL, instant_config

    async def cannot_spawn(*args: object, **kwargs: object) -> ChildProcess:
        raise OSError("no such engine binary")

    monkeypatch.setattr(ChildProcess, "spawn", cannot_spawn)
    config = instant_config(preload=[MODEL]).runtime(resolve_paths())
    with trio.fail_after(30):
        async with open_runtime(config) as rt:
            await trio.testing.wait_all_tasks_blocked()
            engine = rt.engine_if_loaded(MODEL)
            assert engine is not None
            assert (engine.statistics().state, engine.statistics().starts) == ("failed", 1)
    assert f"could not preload '{MODEL}': no such engine binary" in caplog.text


# -- the gateway's side (POST /api/evict, `blazar unload`) ---------------------------


async def test_evict_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from blazar.config import Config, resolve_paths
    from blazar.web.app import create_app

    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    config = Config()
    with trio.fail_after(10):
        async with open_runtime(config.runtime(resolve_paths())) as rt:
            app = create_app(rt, config)
            client = app.test_client()
            for body in ({}, {"model": None}):
                r = await client.post("/api/evict", json=body)
                assert r.status_code == 200 and await r.get_json() == {"evicted": []}
            r = await client.post("/api/evict", data=b"")
            assert r.status_code == 200 and await r.get_json() == {"evicted": []}
            r = await client.post("/api/evict", json={"model": "nope"})
            assert r.status_code == 404 and (await r.get_json())["error"]["blazar_code"] == "MODEL_NOT_FOUND"
            r = await client.post("/api/evict", json={"model": 3})
            assert r.status_code == 400 and (await r.get_json())["error"]["blazar_code"] == "BAD_REQUEST"
            r = await client.post("/api/evict", data=b"{", headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and (await r.get_json())["error"]["blazar_code"] == "INVALID_JSON"


def test_cli_unload_without_a_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from blazar.cli import main

    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["unload", "smollm2-135m"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no daemon is running" in err


async def test_memory_budget_evicts_idle_models_until_the_new_one_fits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    world = World(stop_s=0)
    world.sizes = {"a": 300, "b": 300, "c": 500}
    world.budget = 1000
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world)
        world.loaded.update(a=0, b=0)
        life.touch_nowait("a", None)
        await trio.sleep(1)
        life.touch_nowait("b", None)
        await life.before_load("c", need_bytes=500)  # 300 + 300 + 500 > 1000: the older one goes
        assert world.names() == ["a"]
        world.loaded["c"] = 0
        await life.before_load("a", need_bytes=300)  # 300 + 500 + 300 > 1000: 'b' is now the oldest
        assert world.names() == ["a", "b"]
        assert life.statistics().evictions == 2
        nursery.cancel_scope.cancel()


async def test_memory_refusals_carry_the_numbers(autojump_clock: trio.testing.MockClock) -> None:
    world = World(stop_s=0)
    world.sizes = {"a": 600 << 20}
    world.budget = 1 << 30
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world)
        with pytest.raises(ModelTooLarge) as too_large:
            await life.before_load("huge", need_bytes=2 << 30)
        assert too_large.value.code == "MODEL_TOO_LARGE"
        assert "2.00 GiB" in too_large.value.message and "1.00 GiB" in too_large.value.message
        assert "try --ctx 1024 for huge" in too_large.value.message

        world.loaded["a"] = 1  # busy: it cannot make room
        with pytest.raises(InsufficientMemory) as short:
            await life.before_load("b", need_bytes=500 << 20)
        assert short.value.code == "INSUFFICIENT_MEMORY" and short.value.retry_after_s
        assert "'a' (600 MiB)" in short.value.message and "500 MiB" in short.value.message
        assert world.stopped == []  # nothing was evicted for a load that cannot happen

        world.loaded["a"] = 0  # idle now: evicted to make room
        await life.before_load("b", need_bytes=500 << 20)
        assert world.names() == ["a"]
        assert life.statistics().refused == 2
        nursery.cancel_scope.cancel()


async def test_unknown_footprints_skip_the_memory_check(autojump_clock: trio.testing.MockClock) -> None:
    world = World(stop_s=0)
    world.budget = 100
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world)
        world.loaded["a"] = 0
        await life.before_load("b")  # no estimate for 'b': loaded unchecked
        assert world.stopped == []
        nursery.cancel_scope.cancel()


async def test_reads_change_nothing(autojump_clock: trio.testing.MockClock) -> None:
    """residents(), preview() and statistics() run on other tasks: they read, never prune."""
    world = World(stop_s=0)
    async with trio.open_nursery() as nursery:
        life = await _start(nursery, world, max_loaded_models=2, reserve_s=10.0)
        await life.before_load("a")  # reserved until its engine shows up
        world.loaded["a"] = 1
        await trio.sleep(20)  # long past reserve_s, but nothing woke the actor
        before = (dict(life._reserved), dict(life._timers), dict(life._last_used))
        assert [r.model for r in life.residents()] == ["a"]
        assert life.preview("b", None).evict == []
        assert life.statistics().reserved == []
        assert (dict(life._reserved), dict(life._timers), dict(life._last_used)) == before
        nursery.cancel_scope.cancel()


async def test_asks_in_hand_fail_when_the_actor_stops(autojump_clock: trio.testing.MockClock) -> None:
    world = World(stop_s=100)
    failures: list[str] = []

    async def ask(call: Callable[[], Awaitable[object]]) -> None:
        try:
            await call()
        except ActorStopped:
            failures.append("stopped")

    async with trio.open_nursery() as askers:
        async with trio.open_nursery() as nursery:
            life = await _start(nursery, world, max_loaded_models=1)
            world.loaded.update(a=0, b=1)
            askers.start_soon(ask, lambda: life.unload("a"))  # its stop takes 100 s
            askers.start_soon(ask, lambda: life.before_load("c"))  # waits: 'b' is busy
            await trio.sleep(1)
            assert life.statistics().waiting_loads == 1 and life.statistics().evicting == ["a"]
            nursery.cancel_scope.cancel()
    assert failures == ["stopped", "stopped"]


async def test_an_eviction_outlasting_the_load_wait_does_not_spin_the_loop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Counting(LifecycleActor):
        wakes = 0

        def settle(self) -> None:
            self.wakes += 1
            assert self.wakes < 1000, "the loop is spinning"
            super().settle()

    world = World(stop_s=30)
    async with trio.open_nursery() as nursery:
        life = Counting(world.hooks(), max_loaded_models=1, load_wait_s=1.0)
        await nursery.start(life.run)
        world.loaded["a"] = 0
        await life.before_load("b")  # evicting 'a' takes 30 s, far past the 1 s wait
        assert world.names() == ["a"] and life.wakes < 20
        nursery.cancel_scope.cancel()
