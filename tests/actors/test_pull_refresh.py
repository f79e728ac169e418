"""A pull of a model that is already installed and running changes nothing when its files did
not change: the engine keeps running (and its warm cache) instead of being stopped under the
requests of other clients. The engines are the instant upstream; the pulls come from an
Ollama store on this machine (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors import RuntimeConfig, open_runtime
from actors.config import EngineConfig
from actors.engine import EngineState
from actors.jobs import read_job
from actors.runtime import Runtime
from tests.instant import SHIM
from tests.support import fake_ollama_store, offline_stores

NAME = "smollm2:135m"


@pytest.fixture
def ollama_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_path: Path) -> None:
    root = offline_stores(monkeypatch, tmp_path / "others")
    fake_ollama_store(root / "ollama", "smollm2", "135m", model_path)


async def _pull(rt: Runtime) -> None:
    job = await rt.pull("ollama:" + NAME)
    with trio.fail_after(60):
        async for _ in rt.jobs.follow(job.id, poll_s=0.05):
            pass
    done = read_job(rt.jobs.path, job.id)
    assert done is not None and done.state == "completed", done


async def test_pulling_a_running_model_again_leaves_its_engine_running(
    ollama_store: None, tmp_path: Path
) -> None:
    engine_config = EngineConfig(llama_server=str(SHIM), start_timeout_s=20.0)
    config = RuntimeConfig.in_home(str(tmp_path / "home"), engine=engine_config, keep_alive_s=-1)
    async with open_runtime(config) as rt:
        await _pull(rt)
        async with rt.claim(NAME) as claim:
            engine, pid = claim.engine, claim.handle.pid
            streaming = await claim.handle.client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            )
            assert streaming.status_code == 200
            await _pull(rt)  # while a request holds the engine, as Codex's --oss run does
            assert engine.state is EngineState.READY and engine.statistics().pid == pid
        assert rt.engine_named(NAME) is engine and engine.state is EngineState.READY
