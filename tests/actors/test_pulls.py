"""A pull is a job of the embedded runtime itself: ``rt.pull`` with no gateway, from the Ollama
store on this machine (no network), its progress and its end read as any job's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from actors import RuntimeConfig, open_runtime
from actors.jobs import JobEvent, read_job
from actors.runtime import Runtime
from tests.support import fake_ollama_store, offline_stores


@pytest.fixture
def others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Other tools' stores under the test's folder, and no registry to reach."""
    return offline_stores(monkeypatch, tmp_path / "others")


async def _events(rt: Runtime, job_id: str) -> list[JobEvent]:
    with trio.fail_after(60):  # catches hangs only
        return [event async for event in rt.jobs.follow(job_id, poll_s=0.05)]


async def test_a_pull_runs_as_a_job_of_the_embedded_runtime(
    others: Path, tmp_path: Path, model_path: Path
) -> None:
    theirs = fake_ollama_store(others / "ollama", "smollm2", "135m", model_path)
    async with open_runtime(RuntimeConfig.in_home(str(tmp_path / "home"))) as rt:
        assert "pull" in rt.jobs.statistics().kinds  # registered by open_runtime, not by a gateway
        job = await rt.pull("ollama:smollm2:135m")
        assert job.kind == "pull" and job.model == "ollama:smollm2:135m"
        events = await _events(rt, job.id)
        done = read_job(rt.jobs.path, job.id)
        record = rt.store.get("smollm2:135m")
    assert done is not None and done.state == "completed" and done.result == b"smollm2:135m"
    statuses = [e.data["status"] for e in events if e.kind == "progress"]
    assert statuses[0] == "resolving" and statuses[-1] == "success", statuses
    assert os.stat(record.path).st_ino == os.stat(theirs).st_ino  # hardlinked, nothing downloaded


async def test_a_pull_that_fails_ends_failed_with_its_code(others: Path, tmp_path: Path) -> None:
    async with open_runtime(RuntimeConfig.in_home(str(tmp_path / "home"))) as rt:
        job = await rt.pull("Not A Name!")
        events = await _events(rt, job.id)
        done = read_job(rt.jobs.path, job.id)
    (error,) = [e for e in events if e.kind == "error"]
    assert error.data["code"] == "BAD_REQUEST" and "invalid model name" in error.data["message"]
    assert done is not None and done.state == "failed" and done.error == error.data["message"]
