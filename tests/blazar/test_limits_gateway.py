"""Context and output limits through the real gateway, on a stand-in engine that records
what it is asked (tests/fake_llama_server.py): the clamp of a context above the training
length, context extension, num_ctx that varies per request, and the default output cap."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

from actors.config import EngineConfig, ModelOverride
from blazar.config import Config
from tests import fake_llama_server as fake
from tests.instant import MODEL, serve_gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}


class Rig(msgspec.Struct, kw_only=True):
    client: httpx.AsyncClient
    log: Path

    def starts(self) -> list[list[str]]:
        return fake.records(self.log, "start")

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in fake.records(self.log, "body")]


@asynccontextmanager
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> AsyncIterator[Rig]:
    """The gateway of ``tests.instant`` (use with the ``instant_home`` fixture), its engine the
    recording stand-in."""
    binary, log, env = fake.install(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = Config(slots=1, engine=EngineConfig(llama_server=str(binary), stop_grace_s=0.5), **settings)
    async with serve_gateway(config) as gw:
        with trio.fail_after(60):
            yield Rig(client=gw.client, log=log)


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# -- a context above the training length ----------------------------------------------------


async def test_a_context_above_the_training_length_is_clamped_and_reported(
    tmp_path: Path, instant_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = {MODEL: ModelOverride(ctx=32768)}
    async with gateway(tmp_path, monkeypatch, models=models) as rig:
        plan = (await rig.client.get(f"/api/plan/{MODEL}")).json()
        assert (plan["ctx_per_slot"], plan["ctx_asked"], plan["ctx_train"]) == (8192, 32768, 8192)
        assert plan["context_note"] == (
            "clamped from 32768 to 8192 (training length); set rope_scaling to extend"
        )
        one = plan["estimate"]["kv"]
        r = await rig.client.post("/api/chat", json={**CHAT, "stream": False})
        assert r.status_code == 200 and r.headers["x-blazar-context"] == "8192"
        (argv,) = rig.starts()
        assert _flag(argv, "-c") == "8192" and "--rope-scaling" not in argv
        ps = (await rig.client.get("/api/ps")).json()["models"]
        assert [m["context_length"] for m in ps] == [8192]
        (engine,) = (await rig.client.get("/admin/engines")).json()["engines"]
        assert engine["ctx_served"] == 8192 and engine["ctx_per_slot"] == 8192
        plan = (await rig.client.get(f"/api/plan/{MODEL}")).json()
        assert plan["ctx_served"] == 8192 and plan["estimate"]["kv"] == one


async def test_strict_mode_refuses_a_context_it_would_clamp(
    tmp_path: Path, instant_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = {MODEL: ModelOverride(ctx=32768)}
    async with gateway(tmp_path, monkeypatch, models=models, strict=True) as rig:
        r = await rig.client.post("/api/chat", json={**CHAT, "stream": False})
        assert r.status_code == 400 and r.json()["blazar_code"] == "CONTEXT_TOO_LARGE"
        assert "ctx 32768 exceeds the 8192-token context" in r.json()["error"]
        assert rig.starts() == []


async def test_strict_mode_refuses_a_num_ctx_above_the_training_length(
    tmp_path: Path, instant_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(tmp_path, monkeypatch, strict=True) as rig:
        body = {**CHAT, "stream": False, "options": {"num_ctx": 9000}}
        r = await rig.client.post("/api/chat", json=body)
        assert r.status_code == 400 and r.json()["blazar_code"] == "CONTEXT_TOO_LARGE"
        assert "num_ctx 9000" in r.json()["error"] and "rope_scaling" in r.json()["error"]


async def test_an_extension_configured_explicitly_reaches_the_engine(
    tmp_path: Path, instant_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = {MODEL: ModelOverride(ctx=16384, rope_scaling="yarn")}
    async with gateway(tmp_path, monkeypatch, models=models) as rig:
        plan = (await rig.client.get(f"/api/plan/{MODEL}")).json()
        assert plan["ctx_per_slot"] == 16384 and plan["ctx_asked"] is None
        assert (plan["rope_scaling"], plan["rope_scale"]) == ("yarn", 2.0)
        assert "extended with yarn x2" in plan["context_note"]
        r = await rig.client.post("/api/chat", json={**CHAT, "stream": False})
        assert r.headers["x-blazar-context"] == "16384"
        (argv,) = rig.starts()
        assert _flag(argv, "-c") == "16384"
        assert (_flag(argv, "--rope-scaling"), _flag(argv, "--rope-scale")) == ("yarn", "2")
        ps = (await rig.client.get("/api/ps")).json()["models"]
        assert [m["context_length"] for m in ps] == [16384]


# -- num_ctx that varies per request --------------------------------------------------------


async def test_a_varying_num_ctx_above_the_training_length_starts_the_engine_once(
    tmp_path: Path, instant_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(tmp_path, monkeypatch) as rig:
        for num_ctx in (9000, 9500, 12000):
            body = {**CHAT, "stream": False, "options": {"num_ctx": num_ctx}}
            r = await rig.client.post("/api/chat", json=body)
            assert r.status_code == 200
            assert r.headers["x-blazar-context"] == "8192"
            assert r.headers["x-blazar-context-asked"] == str(num_ctx)
        (argv,) = rig.starts()
        assert _flag(argv, "-c") == "8192"
        (engine,) = (await rig.client.get("/admin/engines")).json()["engines"]
        assert engine["starts"] == 1 and engine["generation"] == 1


async def test_a_num_ctx_the_engine_already_serves_never_restarts_it(
    tmp_path: Path, instant_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(tmp_path, monkeypatch) as rig:
        for num_ctx in (2048, 4096, 6000, 3000):
            body = {**CHAT, "stream": False, "options": {"num_ctx": num_ctx}}
            r = await rig.client.post("/api/chat", json=body)
            assert r.status_code == 200
        # 2048 and 4096 fit the default 4096; 6000 needs more; 3000 fits what then runs.
        assert [_flag(a, "-c") for a in rig.starts()] == ["4096", "6000"]
        assert r.headers["x-blazar-context"] == "6000" and r.headers["x-blazar-context-asked"] == "3000"


# -- the default output cap -----------------------------------------------------------------


async def test_the_output_cap_reaches_the_engine_on_every_dialect(
    tmp_path: Path, instant_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(tmp_path, monkeypatch, max_output_tokens=7) as rig:
        for path, body in (
            ("/v1/chat/completions", CHAT),
            ("/v1/chat/completions", {**CHAT, "stream": True}),
            ("/v1/completions", {"model": MODEL, "prompt": "Hi"}),
            ("/api/chat", {**CHAT, "stream": False}),
            ("/api/chat", {**CHAT, "stream": True, "options": {"num_predict": -1}}),
            ("/api/generate", {"model": MODEL, "prompt": "Hi", "stream": False}),
        ):
            r = await rig.client.post(path, json=body)
            assert r.status_code == 200, (path, r.text)
            assert r.headers["x-blazar-output-cap"] == "7", path
            assert rig.bodies()[-1]["max_tokens"] == 7, path
        # A limit of the request's own wins, and then nothing is reported.
        for path, body, sent in (
            ("/v1/chat/completions", {**CHAT, "max_tokens": 3}, ("max_tokens", 3)),
            ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 4}, ("max_completion_tokens", 4)),
            ("/api/chat", {**CHAT, "stream": False, "options": {"num_predict": 5}}, ("max_tokens", 5)),
            ("/v1/messages", {**CHAT, "max_tokens": 6}, ("max_tokens", 6)),
        ):
            r = await rig.client.post(path, json=body)
            assert r.status_code == 200, (path, r.text)
            assert "x-blazar-output-cap" not in r.headers, path
            assert rig.bodies()[-1][sent[0]] == sent[1], path


async def test_a_model_may_lift_the_global_output_cap(
    tmp_path: Path, instant_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = {MODEL: ModelOverride(max_output_tokens=0)}
    async with gateway(tmp_path, monkeypatch, max_output_tokens=7, models=models) as rig:
        r = await rig.client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200 and "x-blazar-output-cap" not in r.headers
        assert "max_tokens" not in rig.bodies()[-1]
