"""A running daemon takes a changed config.toml (``POST /admin/config/reload``) and loads a
model with a run's own settings (``POST /admin/models/NAME/load``): the real gateway with
the instant upstream as its engine, and the actors' new limits under trio's clock."""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio
import trio.testing

from actors.admission import AdmissionActor
from actors.admission import Retune as AdmissionRetune
from actors.config import ModelOverride, RuntimeConfig, Tunables
from actors.config_keys import changed_keys, key_class
from actors.lifecycle import LifecycleActor, ModelLifecycle, Retune
from blazar.config import load_config, resolve_paths
from tests.instant import MODEL, SHIM, serve_gateway


def test_key_classes() -> None:
    assert [key_class(k) for k in ("strict", "max_queue", "keep_alive_s", "models.x.keep_alive_s")] == [
        "live"
    ] * 4
    assert [key_class(k) for k in ("slots", "default_ctx", "models.a.b/c.ctx", "max_output_tokens")] == [
        "engines"
    ] * 4
    assert [key_class(k) for k in ("engine.threads", "mcp", "preload", "remotes", "jobs_max_running")] == [
        "restart"
    ] * 5


def test_changed_keys_names_each_model_key() -> None:
    old = RuntimeConfig.in_home("/h", slots=4)
    new = msgspec.structs.replace(
        old,
        slots=2,
        models={"m": ModelOverride(ctx=1024)},
        engine=msgspec.structs.replace(old.engine, threads=2),
    )
    assert changed_keys(old, new, Tunables.__struct_fields__) == ["engine.threads", "models.m.ctx", "slots"]
    assert changed_keys(new, new, Tunables.__struct_fields__) == []


async def test_lifecycle_retune_moves_idle_timers_armed_with_the_default(
    autojump_clock: trio.testing.MockClock,
) -> None:
    loaded = {"a": 0, "b": 0}
    stopped: list[tuple[float, str]] = []

    async def stop(model: str) -> None:
        loaded.pop(model, None)
        stopped.append((trio.current_time(), model))

    life = LifecycleActor(ModelLifecycle(loaded=lambda: loaded, pending=dict, stop=stop), keep_alive_s=300.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(life.run)
        t0 = trio.current_time()
        life.touch_nowait("a", None)  # the default keep-alive
        life.touch_nowait("b", 20.0)  # a request's own: left alone
        await trio.sleep(5)
        await life.mailbox.ask(Retune(keep_alive_s=10.0, max_loaded_models=1, load_wait_s=3.0))
        stats = life.statistics()
        assert (stats.keep_alive_s, stats.max_loaded_models, life.load_wait_s) == (10.0, 1, 3.0)
        await trio.sleep(30)
        assert [(round(t - t0), m) for t, m in stopped] == [(10, "a"), (20, "b")]
        nursery.cancel_scope.cancel()


async def test_admission_retune() -> None:
    admission = AdmissionActor(max_queue=256, queue_timeout_s=120.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(admission.run)
        await admission.ask(AdmissionRetune(max_queue=3, queue_timeout_s=9.0))
        assert (admission.max_queue, admission.queue_timeout_s) == (3, 9.0)
        nursery.cancel_scope.cancel()


def _config_text(**top: object) -> str:
    lines = [f"{k} = {v}" for k, v in {"slots": 4, "default_ctx": 512, "keep_alive_s": -1, **top}.items()]
    return "\n".join([*lines, "", "[engine]", f'llama_server = "{SHIM}"', "start_timeout_s = 20.0", ""])


async def _chat(client: object) -> None:
    r = await client.post(  # type: ignore[attr-defined]
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 200, r.text


async def test_reload_applies_live_keys_and_restarts_changed_engines(instant_home: Path) -> None:
    path = instant_home / "config.toml"
    path.write_text(_config_text())
    config = load_config(resolve_paths())
    with trio.fail_after(60):
        async with serve_gateway(config) as gw:
            await _chat(gw.client)
            engine = gw.runtime.engine_if_loaded(MODEL)
            assert engine is not None and engine.statistics().slots == 4

            # Nothing changed: nothing to do.
            r = await gw.client.post("/admin/config/reload")
            assert r.json() == {"applied": [], "engines": [], "engine_keys": [], "restart": []}

            path.write_text(_config_text(slots=2, keep_alive_s=42, max_queue=9, jobs_max_running=5))
            r = await gw.client.post("/admin/config/reload")
            assert r.status_code == 200, r.text
            assert r.json() == {
                "applied": ["keep_alive_s", "max_queue"],
                "engines": [MODEL],
                "engine_keys": ["slots"],
                "restart": ["jobs_max_running"],
            }
            rt = gw.runtime
            assert (rt.config.keep_alive_s, rt.config.max_queue, rt.admission.max_queue) == (42.0, 9, 9)
            assert rt.lifecycle.statistics().keep_alive_s == 42.0
            assert rt.config.jobs_max_running == 2  # kept until a restart
            await _chat(gw.client)  # the engine starts again, now with 2 slots
            stats = engine.statistics()
            assert (stats.slots, stats.starts, stats.state) == (2, 2, "ready")

            path.write_text(_config_text(slots="'two'"))
            r = await gw.client.post("/admin/config/reload")
            assert r.status_code == 422 and r.json()["error"]["blazar_code"] == "CONFIG_INVALID"
            assert "keeps running with its current settings" in r.json()["error"]["message"]
            assert rt.config.slots == 2


async def test_load_route_gives_the_ready_card(instant_home: Path) -> None:
    (instant_home / "config.toml").write_text(_config_text())
    config = load_config(resolve_paths())
    with trio.fail_after(60):
        async with serve_gateway(config) as gw:
            r = await gw.client.post(f"/admin/models/{MODEL}/load", json={"ctx": 1024, "slots": 3})
            assert r.status_code == 200, r.text
            card = r.json()
            assert (card["model"], card["slots"], card["ctx_per_slot"], card["ctx_asked"]) == (
                MODEL,
                3,
                1024,
                None,
            )
            assert card["evicted"] == [] and card["pid"] and card["load_s"] >= 0 and card["vision"] is False
            assert card["memory_bytes"] and card["memory_bytes"] > 0

            # Above what the model serves (8192, its training length): clamped and said.
            r = await gw.client.post(f"/admin/models/{MODEL}/load", json={"ctx": 100000, "keep_alive_s": -1})
            card = r.json()
            assert (card["ctx_asked"], card["slots"]) == (100000, 3)
            engine = gw.runtime.engine_if_loaded(MODEL)
            # Started with 8192 per slot; the instant upstream reports 1024 whatever it was given.
            assert engine is not None and engine.spec.ctx_per_slot == 8192
            assert gw.runtime.lifecycle.expires_at(MODEL) is None  # kept loaded

            r = await gw.client.post(f"/admin/models/{MODEL}/load", json={"vision": True})
            assert r.status_code == 400 and r.json()["error"]["blazar_code"] == "VISION_PROJECTOR_MISSING"
            r = await gw.client.post(f"/admin/models/{MODEL}/load", json={"slots": 0})
            assert r.status_code == 400 and r.json()["error"]["blazar_code"] == "BAD_REQUEST"
            r = await gw.client.post("/admin/models/nope/load", json={})
            assert r.status_code == 404 and r.json()["error"]["blazar_code"] == "MODEL_NOT_FOUND"
