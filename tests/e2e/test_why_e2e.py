"""`blazar why` on a real daemon: a load that evicted another model, a failure, and the
ledger's answer once the daemon is gone."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from registry.store import Store
from tests.support import MODEL, make_home, start_daemon

pytestmark = pytest.mark.slow

OTHER = "other-135m"


def _ask(url: str, model: str, content: str = "Say hi", max_tokens: int = 8) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def test_why_tells_a_load_an_eviction_and_a_failure(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config="max_loaded_models = 1\ndefault_ctx = 512\n")
    Store(home / "models").import_file(model_path, OTHER, source="test")
    d = start_daemon(home)
    try:
        assert _ask(d.url, MODEL).status_code == 200
        second = _ask(d.url, OTHER)
        assert second.status_code == 200
        trace = second.headers["x-blazar-trace-id"]

        story = httpx.get(f"{d.url}/api/why/{trace}", timeout=30).json()
        assert story["trace_id"] == trace and story["model"] == OTHER and story["outcome"] == "ok"
        assert story["loaded"] is True and story["evicted"] == [MODEL]
        assert story["engine"] and story["prompt_tokens"] > 0 and story["completion_tokens"] > 0
        assert story["prefill_ms"] is not None and story["decode_ms"] is not None
        text = d.cli("why", trace).stdout
        assert f"after evicting {MODEL} to make room" in text and "It generated" in text

        too_long = _ask(d.url, OTHER, content="word " * 2000)
        assert too_long.status_code == 400
        failed = json.loads(d.cli("why", "--json").stdout)  # no id: the last failure
        assert failed["trace_id"] == too_long.headers["x-blazar-trace-id"]
        assert failed["outcome"] == "failed" and failed["code"] == "PROMPT_TOO_LONG"
        assert failed["cause"] and failed["error"]

        missing = httpx.get(f"{d.url}/api/why/blz-nope-1", timeout=30)
        assert missing.status_code == 404 and missing.json()["error"]["blazar_code"] == "NOT_FOUND"
    finally:
        d.stop()
    offline = json.loads(d.cli("why", trace, "--json").stdout)  # no daemon: the ledger answers
    assert offline["trace_id"] == trace and offline["loaded"] is True and offline["completion_tokens"] > 0
