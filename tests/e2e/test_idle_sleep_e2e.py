"""The idle ladder's first rung on the real engine: a model idle for ``idle_sleep_s`` sleeps
(llama.cpp releases the model's memory; its process waits on its port), ``/api/ps`` says so,
and the next request wakes it, on the same engine."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support import MODEL, make_home, start_daemon

pytestmark = pytest.mark.slow


def _ps(url: str) -> dict[str, object]:
    [model] = httpx.get(f"{url}/api/ps", timeout=30).json()["models"]
    return dict(model)


def _rss_kib(pid: int) -> int:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0])


def test_an_idle_model_sleeps_and_the_next_request_wakes_it(tmp_path: Path, model_path: Path) -> None:
    config = 'keep_alive_s = -1\n[models."smollm2-135m"]\nidle_sleep_s = 1\n'
    d = start_daemon(make_home(tmp_path / "home", model_path, config=config))
    try:
        body = {"model": MODEL, "prompt": "Say hi.", "stream": False, "options": {"num_predict": 4}}
        assert httpx.post(f"{d.url}/api/generate", json=body, timeout=120).status_code == 200
        pid = d.engines()[0]["pid"]
        assert isinstance(pid, int)
        awake_rss = _rss_kib(pid)
        deadline = time.monotonic() + 30
        while _ps(d.url).get("blazar_sleeping") is not True and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _ps(d.url)["blazar_sleeping"] is True
        assert _rss_kib(pid) < awake_rss  # its buffers are freed while it sleeps
        answer = httpx.post(f"{d.url}/api/generate", json=body, timeout=120)
        assert answer.status_code == 200 and answer.json()["response"]
        assert d.engines()[0]["pid"] == pid  # woken, not restarted
        explained = httpx.get(f"{d.url}/api/explain/{MODEL}", timeout=30).json()
        row = next(s for s in explained["settings"] if s["name"] == "idle_sleep_s")
        assert (row["value"], row["source"]) == (1, "override")
    finally:
        d.stop()
