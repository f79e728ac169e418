"""Engine degrades on a real daemon: an engine that could not lock its weights in RAM, and one
whose context llama.cpp capped, are named in ``X-Blazar-Warnings`` on every answer they serve
(OpenAI's relay and Ollama's translated route alike), in ``/api/why``'s ``engine_degrades``
panel with the engine's own log line, in ``blazar why`` and in ``/api/ps``; a model served as
asked gets none of them."""

from __future__ import annotations

import ctypes
import json
import resource
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from actors.engines.degrades import DEGRADES
from registry.store import Store
from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

LOCKED = "locked-135m"
CAPPED = "capped-135m"
# The test model was trained on 8192 tokens: asked for more in one slot, llama.cpp caps it.
CONFIG = f"""default_ctx = 512
[models."{LOCKED}"]
extra_args = ["--mlock"]
[models."{CAPPED}"]
slots = 1
extra_args = ["-c", "9000"]
"""
_PR_CAPBSET_DROP = 24
_CAP_IPC_LOCK = 14


def _no_mlock() -> None:
    """In the daemon's process, before it starts: no locked memory for it and its engines. The
    limit alone binds only without CAP_IPC_LOCK, so a root daemon drops that from its bounding
    set (its children then never get it back); elsewhere it has none to drop."""
    ctypes.CDLL(None).prctl(_PR_CAPBSET_DROP, _CAP_IPC_LOCK, 0, 0, 0)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    home = make_home(tmp_path_factory.mktemp("degrades") / "home", model_path, config=CONFIG)
    for name in (LOCKED, CAPPED):
        Store(home / "models").import_file(model_path, name, source="test")
    d = start_daemon(home, preexec_fn=_no_mlock)
    try:
        yield d
    finally:
        d.stop()


def _warnings(r: httpx.Response) -> set[str]:
    assert r.status_code == 200, r.text
    return set(filter(None, r.headers.get("x-blazar-warnings", "").split(",")))


def _chat(d: DaemonProc, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
    return httpx.post(f"{d.url}/v1/chat/completions", json=body, timeout=120)


def _ollama(d: DaemonProc, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi"}], "stream": False}
    return httpx.post(f"{d.url}/api/chat", json={**body, "options": {"num_predict": 4}}, timeout=120)


def _panel(d: DaemonProc, trace: str) -> dict[str, dict[str, str]]:
    story = httpx.get(f"{d.url}/api/why/{trace}", timeout=30).json()
    return {p["name"]: p for p in story["engine_degrades"]}


def _ps(d: DaemonProc, model: str) -> dict[str, object]:
    models = httpx.get(f"{d.url}/api/ps", timeout=30).json()["models"]
    return next(m for m in models if m["name"].split(":")[0] == model)


def test_a_failed_mlock_is_named(daemon: DaemonProc) -> None:
    first = _chat(daemon, LOCKED)
    assert "mlock_failed" in _warnings(first)
    assert "mlock_failed" in _warnings(_chat(daemon, LOCKED))  # every answer, not the first alone
    assert "mlock_failed" in _warnings(_ollama(daemon, LOCKED))
    panel = _panel(daemon, first.headers["x-blazar-trace-id"])
    assert set(panel) == {"mlock_failed"}
    assert panel["mlock_failed"]["meaning"] == DEGRADES["mlock_failed"]
    assert panel["mlock_failed"]["line"].startswith("warning: failed to mlock ")  # llama.cpp's own words
    told = daemon.cli("why", first.headers["x-blazar-trace-id"]).stdout
    assert "Its engine runs degraded, mlock_failed" in told and "failed to mlock" in told
    assert _ps(daemon, LOCKED)["blazar_degrades"] == ["mlock_failed"]


def test_a_capped_context_is_named(daemon: DaemonProc) -> None:
    r = _chat(daemon, CAPPED)
    assert "ctx_reduced" in _warnings(r)
    assert r.headers["x-blazar-context"] == "8192"  # what the engine serves, not the 9216 it was given
    assert "ctx_reduced" in _warnings(_ollama(daemon, CAPPED))
    panel = _panel(daemon, r.headers["x-blazar-trace-id"])
    assert set(panel) == {"ctx_reduced"}
    line = panel["ctx_reduced"]["line"]
    assert "exceeds the training context of the model (8192) - capping" in line
    as_json = json.loads(daemon.cli("why", r.headers["x-blazar-trace-id"], "--json").stdout)
    assert [p["name"] for p in as_json["engine_degrades"]] == ["ctx_reduced"]


def test_a_model_served_as_asked_has_no_engine_warning(daemon: DaemonProc) -> None:
    r = _chat(daemon, MODEL)
    assert _warnings(r) == set()
    assert _warnings(_ollama(daemon, MODEL)) == set()
    assert _panel(daemon, r.headers["x-blazar-trace-id"]) == {}
    assert "blazar_degrades" not in _ps(daemon, MODEL)
    # Whatever an engine's log named, no local path reaches a client.
    for model in (LOCKED, CAPPED):
        trace = _chat(daemon, model).headers["x-blazar-trace-id"]
        assert str(daemon.home) not in json.dumps(_panel(daemon, trace))
