"""n-gram speculation on the real engine, configured per model: the engine starts with it and
answers, and the drafted and accepted tokens reach /metrics and `blazar why`. A draft model
cannot be run here (one GGUF model only, and a model never drafts for itself): its refusal is
what `blazar explain` shows."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from registry.store import Store
from tests.support import MODEL, make_home, start_daemon

pytestmark = pytest.mark.slow

PARAGRAPH = (
    "The river bends past seven quiet mills where grey herons wait for the evening tide. "
    "Each mill keeps a wheel of oak, a stone of granite and a miller who counts the sacks twice."
)
PROMPT = f"Copy this text exactly, word for word, twice:\n\n{PARAGRAPH}"
CONFIG = f"""default_ctx = 1024
slots = 1

[models."{MODEL}"]
spec = {{ngram = "ngram-simple", max = 16}}

[models."self-draft"]
spec = {{draft = "{MODEL}"}}
"""


def _ask(url: str, model: str = MODEL) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 96,
        "temperature": 0,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)


def test_ngram_speculation_runs_and_is_counted(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config=CONFIG)
    Store(home / "models").import_file(model_path, "self-draft", source="test")
    d = start_daemon(home)
    try:
        first = _ask(d.url)
        assert first.status_code == 200, first.text
        timings = first.json()["timings"]
        assert next(e for e in d.engines() if e["model"] == MODEL)["state"] == "ready"
        explained = httpx.get(f"{d.url}/api/explain/{MODEL}", timeout=30).json()
        spec = next(s for s in explained["settings"] if s["name"] == "spec")
        assert spec["value"] == "ngram-simple, max 16" and spec["source"] == "override"

        drafted = timings.get("draft_n") or 0
        assert drafted > 0  # the answer copies its prompt: the lookup finds what to draft
        metrics = httpx.get(f"{d.url}/metrics", timeout=30).text
        assert f'blazar_spec_draft_tokens_total{{model="{MODEL}"}} {float(drafted)}' in metrics
        assert f'blazar_spec_governor{{model="{MODEL}",state="on"}} 1.0' in metrics
        story = json.loads(d.cli("why", first.headers["x-blazar-trace-id"], "--json").stdout)
        assert story["drafted"] == drafted and story["accepted"] == timings.get("draft_n_accepted", 0)
        assert any(line.startswith("Speculative decoding drafted") for line in story["lines"])
        assert "llamacpp:spec_decode_num_draft_tokens_total" in metrics  # the engine's own series

        # The same file under another name is the model itself: refused, the engine runs plain.
        plain = _ask(d.url, "self-draft")
        assert plain.status_code == 200 and "draft_n" not in plain.json()["timings"]
        refused = httpx.get(f"{d.url}/api/explain/self-draft", timeout=30).json()
        row = next(s for s in refused["settings"] if s["name"] == "spec")
        assert row["value"] == "off" and "a model never drafts for itself" in row["note"]
    finally:
        d.stop()
