"""An engine's own lines never reach a client: a crash answers with the code, the model's
name and what to do, while the child's stderr (the model file's path among it) stays in the
daemon's log and the engine's statistics (admin scope)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from actors.config import EngineConfig
from blazar.config import Config
from tests.instant import MODEL, serve_gateway


@pytest.fixture
def crashing_engine(tmp_path: Path) -> Path:
    """A "llama-server" that says where its model is, as llama.cpp does, and dies."""
    script = tmp_path / "llama-server"
    script.write_text('#!/bin/sh\necho "llama_model_load: loading model from $*" >&2\nexit 1\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


async def test_a_crash_at_start_names_no_path(
    instant_home: Path, crashing_engine: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = EngineConfig(llama_server=str(crashing_engine), start_timeout_s=10.0)
    config = Config(slots=1, default_ctx=512, keep_alive_s=-1, engine=engine)
    async with serve_gateway(config) as gw:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        resp = await gw.client.post("/v1/chat/completions", json=chat)
        model_path = (await gw.runtime.engine_for(MODEL)).spec.path
        admin = await gw.client.get("/admin/engines")
    assert resp.status_code >= 500
    error = resp.json()["error"]
    assert error["blazar_code"] == "ENGINE_CRASHED"
    assert MODEL in error["message"] and "blazar logs" in error["message"]
    assert model_path not in resp.text and "llama_model_load" not in resp.text
    # The operator still sees it all: the daemon's log, and the engine's stderr tail (admin).
    assert any(model_path in r.getMessage() for r in caplog.records)
    assert model_path in admin.text
