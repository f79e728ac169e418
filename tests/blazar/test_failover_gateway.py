"""Failover chains through the real gateway in-process, with the instant upstream as both
targets' engines: a ``kill -9`` of the first target's engine sends the chain to the second
(on the relayed and the translated paths), the first is benched and probed back; pins; a
chain with nothing left answers 503 ``FAILOVER_EXHAUSTED`` in each dialect's shape."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import msgspec
import pytest
import trio

from actors.config import FailoverChain
from actors.engine import EngineState
from actors.runtime import Runtime
from blazar.auth.keys import ADMIN
from blazar.config import Config
from blazar.web.asgi.auth import ANY, family_of
from registry.store import Store
from tests.instant import MODEL, instant_config, serve_gateway
from tests.support import make_home

SECOND = "second-copy"
HI = [{"role": "user", "content": "Say hello."}]
ANTHROPIC = {"anthropic-version": "2023-06-01"}


@pytest.fixture
def failover_home(tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = make_home(tmp_path / "home", model_path)
    store = Store(home / "models")
    store.write_manifest(msgspec.structs.replace(store.get(MODEL), name=SECOND))  # same blob
    monkeypatch.setenv("BLAZAR_HOME", str(home))
    monkeypatch.setenv("BENCH_PYTHON", sys.executable)
    return home


def _config() -> Config:
    base = instant_config("--reply", "hello there")
    chains = msgspec.toml.decode(
        f"""
[[failover]]
name = "smart"
targets = ["{MODEL}", "{SECOND}", "remote:peer/{MODEL}"]
bench_s = 3
bench_max_s = 6

[[failover]]
name = "broken"
targets = ["ghost", "remote:peer/ghost"]
""".encode(),
        type=Config,
    ).failover
    return msgspec.structs.replace(base, failover=chains)


def _chat(model: str = "smart", **extra: object) -> dict[str, object]:
    return {"model": model, "messages": HI, "max_tokens": 8, **extra}


async def _failed(runtime: Runtime, model: str) -> None:
    engine = runtime.engine_named(model)
    assert engine is not None
    with trio.fail_after(20):
        while engine.state is not EngineState.FAILED:  # noqa: ASYNC110 - the actor's own state
            await trio.sleep(0.02)


def _targets(doc: dict[str, object], chain: str) -> dict[str, dict[str, object]]:
    (found,) = [c for c in doc["chains"] if c["name"] == chain]  # type: ignore[attr-defined]
    return {t["target"]: t for t in found["targets"]}


async def test_a_killed_engine_fails_over_is_benched_and_probed_back(failover_home: Path) -> None:
    async with serve_gateway(_config()) as gw:
        client, runtime = gw.client, gw.runtime
        r = await client.post("/v1/chat/completions", json=_chat())
        assert r.status_code == 200, r.text
        assert r.headers["x-blazar-target"] == MODEL and "x-blazar-failover" not in r.headers
        r = await client.post("/v1/completions", json={"model": "smart", "prompt": "Hi", "max_tokens": 4})
        assert r.status_code == 200 and r.headers["x-blazar-target"] == MODEL

        pid = runtime.engine_named(MODEL).statistics().pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await _failed(runtime, MODEL)

        r = await client.post("/v1/chat/completions", json=_chat())  # relayed
        assert r.status_code == 200, r.text
        assert r.headers["x-blazar-target"] == SECOND
        assert r.headers["x-blazar-failover"].startswith(f"{MODEL}=ENGINE_CRASHED")
        story = (await client.get(f"/api/why/{r.headers['x-blazar-trace-id']}")).json()
        assert story["failover"][0].startswith(f"{MODEL} passed over, ENGINE_CRASHED: ")
        assert story["failover"][-1] == f"{SECOND} served it"
        assert any(line.startswith("It was asked of a failover chain") for line in story["lines"])
        doc = (await client.get("/api/failover")).json()
        targets = _targets(doc, "smart")
        first = targets[MODEL]
        assert first["state"] == "benched" and first["last_code"] == "ENGINE_CRASHED"
        assert first["failures"] == 1 and first["failed"] == 1 and "exited" in first["last_error"]
        assert targets[SECOND]["state"] == "healthy" and targets[SECOND]["served"] == 1
        remote = targets[f"remote:peer/{MODEL}"]
        assert remote["state"] == "unavailable" and "federation" in remote["reason"]

        # Benched, it is passed over without another charge, on a translated route too.
        r = await client.post("/v1/messages", json={**_chat(), "stream": True}, headers=ANTHROPIC, timeout=30)
        assert r.status_code == 200 and r.headers["x-blazar-target"] == SECOND
        assert "event: message_stop" in r.text
        assert r.headers["x-blazar-failover"] == f"{MODEL}=skipped"
        assert runtime.failover.state("smart", MODEL).failed == 1

        metrics = (await client.get("/metrics")).text
        assert f'blazar_failovers_total{{chain="smart",target="{MODEL}"}} 1.0' in metrics
        assert f'blazar_failover_benched{{chain="smart",target="{MODEL}"}} 1.0' in metrics

        # Once the bench is over the next request probes it: its engine starts again and serves.
        until = runtime.failover.state("smart", MODEL).benched_until
        assert until is not None
        await trio.sleep_until(until)
        r = await client.post("/api/chat", json={**_chat(), "stream": False}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.headers["x-blazar-target"] == MODEL and r.json()["done"] is True
        first = _targets((await client.get("/api/failover")).json(), "smart")[MODEL]
        assert (first["state"], first["failures"], first["served"]) == ("healthy", 0, 3)


async def test_pins_and_a_chain_with_nothing_left(failover_home: Path) -> None:
    async with serve_gateway(_config()) as gw:
        client = gw.client
        listed = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
        assert {MODEL, SECOND, "smart", "broken"} <= set(listed) and len(listed) == len(set(listed))
        r = await client.get("/v1/models/smart")
        assert r.status_code == 200 and r.json()["id"] == "smart"
        r = await client.post("/api/failover/smart/pin", json={"target": SECOND})
        assert r.status_code == 200 and r.json()["pinned"] == SECOND
        r = await client.post("/v1/chat/completions", json=_chat())
        assert r.status_code == 200 and r.headers["x-blazar-target"] == SECOND
        doc = (await client.get("/api/failover")).json()
        assert _targets(doc, "smart")[SECOND]["pinned"] is True
        assert next(c for c in doc["chains"] if c["name"] == "smart")["pinned"] == SECOND
        # Pinned, a crashed engine is started again rather than passed over: there is no other.
        pid = gw.runtime.engine_named(SECOND).statistics().pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await _failed(gw.runtime, SECOND)
        r = await client.post("/v1/chat/completions", json=_chat())
        assert r.status_code == 200 and r.headers["x-blazar-target"] == SECOND
        assert "x-blazar-failover" not in r.headers
        r = await client.post("/api/failover/smart/unpin")
        assert r.status_code == 200 and r.json()["was"] == SECOND
        r = await client.post("/v1/chat/completions", json=_chat())
        assert r.headers["x-blazar-target"] == MODEL

        for body, status, code in (
            ({"target": "nowhere"}, 400, "BAD_REQUEST"),
            ({"target": f"remote:peer/{MODEL}"}, 400, "BAD_REQUEST"),
            ({}, 400, "BAD_REQUEST"),
        ):
            r = await client.post("/api/failover/smart/pin", json=body)
            assert (r.status_code, r.json()["error"]["blazar_code"]) == (status, code), r.text
        r = await client.post("/api/failover/nope/unpin")
        assert r.status_code == 404 and r.json()["error"]["blazar_code"] == "FAILOVER_CHAIN_NOT_FOUND"

        # Nothing left to try: 503 in the caller's dialect, naming each target's reason.
        r = await client.post("/v1/chat/completions", json=_chat("broken"))
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["blazar_code"] == "FAILOVER_EXHAUSTED"
        assert "ghost: MODEL_NOT_FOUND" in err["message"] and "remote:peer/ghost: skipped" in err["message"]
        r = await client.post("/v1/messages", json=_chat("broken"), headers=ANTHROPIC)
        assert r.status_code == 503 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "overloaded_error"
        r = await client.post("/api/generate", json={"model": "broken", "prompt": "hi"})
        assert r.status_code == 503 and r.json()["blazar_code"] == "FAILOVER_EXHAUSTED"
        assert "ghost" in r.json()["error"]

        # A chain's targets name their lanes: the engine header does not apply.
        r = await client.post("/v1/chat/completions", json=_chat(), headers={"x-blazar-engine": "mistralrs"})
        assert r.status_code == 400 and "x-blazar-engine" in r.json()["error"]["message"]


async def test_an_open_breaker_and_a_slow_start_move_on_too(failover_home: Path) -> None:
    config = _config()
    engine = msgspec.structs.replace(config.engine, breaker_crashes=1, breaker_window_s=600.0)
    hasty = FailoverChain(name="hasty", targets=[SECOND], timeout_s=0.001)
    config = msgspec.structs.replace(config, engine=engine, failover=[*config.failover, hasty])
    async with serve_gateway(config) as gw:
        client, runtime = gw.client, gw.runtime
        # A target whose engine cannot start within timeout_s is passed over.
        r = await client.post("/v1/chat/completions", json=_chat("hasty"))
        assert r.status_code == 503, r.text
        assert "GATEWAY_TIMEOUT" in r.json()["error"]["message"]
        assert runtime.failover.state("hasty", SECOND).last_code == "GATEWAY_TIMEOUT"

        r = await client.post("/v1/chat/completions", json=_chat())
        assert r.headers["x-blazar-target"] == MODEL
        pid = runtime.engine_named(MODEL).statistics().pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await _failed(runtime, MODEL)
        r = await client.post("/api/chat", json={**_chat(), "stream": False})
        assert r.status_code == 200 and r.headers["x-blazar-target"] == SECOND

        # One crash opens this breaker: the probe after the bench finds it open and moves on.
        until = runtime.failover.state("smart", MODEL).benched_until
        assert until is not None
        await trio.sleep_until(until)
        r = await client.post("/v1/chat/completions", json={**_chat(), "stream": True})
        assert r.status_code == 200 and r.headers["x-blazar-target"] == SECOND
        assert r.headers["x-blazar-failover"] == f"{MODEL}=ENGINE_CIRCUIT_OPEN"
        assert r.text.rstrip().endswith("data: [DONE]")
        state = runtime.failover.state("smart", MODEL)
        assert (state.failures, state.last_code) == (2, "ENGINE_CIRCUIT_OPEN")


def test_pinning_needs_an_admin_key_and_listing_any_key() -> None:
    assert family_of("/api/failover/smart/pin") == ADMIN
    assert family_of("/api/failover/smart/unpin") == ADMIN
    assert family_of("/api/failover") == ANY
