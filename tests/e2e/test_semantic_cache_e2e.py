"""The semantic cache on the real daemon and engine: SmolLM2 answers the chat and, pooled by
llama.cpp (mean pooling), embeds the prompts it compares. A repeated prompt is answered from
the cache; a paraphrase hits or misses as its reported similarity says; another key, a
stream, tools, structured output, sampling asked to vary and ``X-Blazar-Cache: off`` do not
use it; malformed headers are refused naming the header; a short TTL expires; the counters
move in ``/metrics``, ``/api/ps`` and ``/api/why``; an embedding that fails lets the request
run as ever."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support import MODEL, DaemonProc, add_key, make_home, start_daemon

pytestmark = pytest.mark.slow

THRESHOLD = 0.95
CONFIG = f"""
slots = 2
default_ctx = 1024

[semantic_cache]
enabled = true
model = "{MODEL}"
threshold = {THRESHOLD}
ttl_s = 120
"""


class Daemon:
    def __init__(self, proc: DaemonProc, keys: dict[str, str]) -> None:
        self.proc, self.url, self.keys = proc, proc.url, keys

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    def chat(
        self, who: str, content: str, headers: dict[str, str] | None = None, **extra: Any
    ) -> httpx.Response:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 16,
            "temperature": 0,
            **extra,
        }
        r = httpx.post(
            f"{self.url}/v1/chat/completions",
            json=body,
            headers={**self.auth(who), **(headers or {})},
            timeout=120,
        )
        return r

    def hits(self) -> float:
        text = httpx.get(f"{self.url}/metrics", headers=self.auth("ops"), timeout=30).text
        found = re.search(
            rf'^blazar_semantic_cache_requests_total{{model="{MODEL}",outcome="hit"}} (\S+)$', text, re.M
        )
        return float(found.group(1)) if found else 0.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Daemon]:
    home = make_home(tmp_path_factory.mktemp("semcache") / "home", model_path, config=CONFIG)
    keys = {name: add_key(home, name) for name in ("alice", "bob")}
    keys["ops"] = add_key(home, "ops", "admin")
    proc = start_daemon(home)
    try:
        yield Daemon(proc, keys)
    finally:
        proc.stop()


def test_a_repeated_prompt_is_answered_from_the_cache(daemon: Daemon) -> None:
    client = openai.OpenAI(
        base_url=f"{daemon.url}/v1", api_key=daemon.keys["alice"], max_retries=0, timeout=120
    )
    ask: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name three colours of the rainbow."}],
        "max_tokens": 16,
        "temperature": 0,
    }
    first = client.chat.completions.with_raw_response.create(**ask)
    assert first.headers["x-blazar-cache"] == "miss"
    hits = daemon.hits()
    second = client.chat.completions.with_raw_response.create(**ask)
    assert second.headers["x-blazar-cache"] == "hit"
    assert float(second.headers["x-blazar-cache-similarity"]) > 0.999
    assert 0 <= float(second.headers["x-blazar-cache-age"]) < 60
    one, two = first.parse(), second.parse()
    assert two.choices[0].message.content == one.choices[0].message.content and one.choices[0].message.content
    assert two.id == one.id  # the kept answer, as it was made
    assert daemon.hits() == hits + 1
    # the hit's story says so, and /api/ps counts it beside the model
    trace = second.headers["x-blazar-trace-id"]
    story = httpx.get(f"{daemon.url}/api/why/{trace}", headers=daemon.auth("ops"), timeout=30).json()
    assert story["cache"].startswith("hit (similarity")
    assert any("semantic cache answered" in line for line in story["lines"])
    ps = httpx.get(f"{daemon.url}/api/ps", headers=daemon.auth("ops"), timeout=30).json()
    row = next(m for m in ps["models"] if m["name"].startswith(MODEL))
    assert row["blazar_semantic_cache"]["hits"] >= 1 and row["blazar_semantic_cache"]["entries"] >= 1


def test_a_paraphrase_hits_as_its_similarity_says_and_another_prompt_misses(daemon: Daemon) -> None:
    first = daemon.chat("alice", "What is the capital of France?")
    assert first.status_code == 200 and first.headers["x-blazar-cache"] == "miss", first.text
    para = daemon.chat("alice", "What's the capital city of France?")
    similarity = float(para.headers["x-blazar-cache-similarity"])
    assert similarity < 0.9999  # not the same text: the embedding's own judgement
    if similarity >= THRESHOLD:
        assert para.headers["x-blazar-cache"] == "hit"
        assert para.json()["choices"] == first.json()["choices"]
    else:
        assert para.headers["x-blazar-cache"] == "miss"
        assert para.headers["x-blazar-cache-reason"] == "below_threshold"
    other = daemon.chat("alice", "Write a short poem about the sea and the wind at night.")
    assert other.headers["x-blazar-cache"] == "miss"
    assert float(other.headers["x-blazar-cache-similarity"]) < THRESHOLD
    # a request may ask for a stricter match than the configured one
    strict = daemon.chat("alice", "What's the capital city of France?", {"X-Blazar-Cache-Threshold": "1"})
    assert strict.headers["x-blazar-cache"] in ("miss", "hit")
    if strict.headers["x-blazar-cache"] == "hit":  # the paraphrase's own answer was kept above
        assert float(strict.headers["x-blazar-cache-similarity"]) >= 0.9999


def test_another_key_never_gets_a_kept_answer(daemon: Daemon) -> None:
    prompt = "Say hello to the little robot in the garden."
    assert daemon.chat("alice", prompt).headers["x-blazar-cache"] == "miss"
    assert daemon.chat("alice", prompt).headers["x-blazar-cache"] == "hit"
    bob = daemon.chat("bob", prompt)
    assert bob.headers["x-blazar-cache"] == "miss"
    assert bob.headers["x-blazar-cache-reason"] == "empty"  # nothing of alice's is even compared


def test_what_bypasses_the_cache(daemon: Daemon) -> None:
    prompt = "Tell me one fact about the moon."
    assert daemon.chat("alice", prompt).status_code == 200
    assert daemon.chat("alice", prompt).headers["x-blazar-cache"] == "hit"
    tool = {
        "type": "function",
        "function": {"name": "moon_fact", "parameters": {"type": "object", "properties": {}}},
    }
    cases: list[tuple[str, dict[str, str], dict[str, Any]]] = [
        ("off", {"X-Blazar-Cache": "off"}, {}),
        ("tools", {}, {"tools": [tool]}),
        ("structured", {}, {"response_format": {"type": "json_object"}}),
        ("sampling", {}, {"temperature": 0.9}),
    ]
    for reason, headers, extra in cases:
        r = daemon.chat("alice", prompt, headers, **extra)
        assert r.status_code == 200, (reason, r.text)
        assert r.headers["x-blazar-cache"] == "bypass", reason
        assert r.headers["x-blazar-cache-reason"] == reason
    # a seed makes sampling repeatable: then the cache may answer it (its own context)
    seeded = daemon.chat("alice", prompt, temperature=0.9, seed=3)
    assert seeded.headers["x-blazar-cache"] == "miss"
    assert daemon.chat("alice", prompt, temperature=0.9, seed=3).headers["x-blazar-cache"] == "hit"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 16,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{daemon.url}/v1/chat/completions", json=body, headers=daemon.auth("alice"), timeout=120
    ) as streamed:
        assert streamed.status_code == 200
        assert streamed.headers["x-blazar-cache"] == "bypass"
        assert streamed.headers["x-blazar-cache-reason"] == "stream"
        assert b"[DONE]" in b"".join(streamed.iter_bytes())


def test_malformed_cache_headers_are_refused_naming_the_header(daemon: Daemon) -> None:
    for name, value in (
        ("X-Blazar-Cache", "maybe"),
        ("X-Blazar-Cache-TTL", "-3"),
        ("X-Blazar-Cache-TTL", "soon"),
        ("X-Blazar-Cache-Threshold", "1.5"),
        ("X-Blazar-Cache-Threshold", "nan"),
    ):
        r = daemon.chat("alice", "Hello there.", {name: value})
        assert r.status_code == 400, (name, value, r.text)
        error = r.json()["error"]
        assert error["blazar_code"] == "BAD_REQUEST" and name in error["message"], error


def test_an_answer_expires_after_its_ttl(daemon: Daemon) -> None:
    prompt = "Count from one to five."
    short = {"X-Blazar-Cache-TTL": "1.5"}
    assert daemon.chat("alice", prompt, short).headers["x-blazar-cache"] == "miss"
    again = daemon.chat("alice", prompt, short)
    assert again.headers["x-blazar-cache"] == "hit" and float(again.headers["x-blazar-cache-age"]) < 1.5
    time.sleep(1.6)
    late = daemon.chat("alice", prompt)
    assert late.headers["x-blazar-cache"] == "miss"  # the nearest left is another prompt, if any
    assert float(late.headers.get("x-blazar-cache-similarity", "0")) < THRESHOLD


def test_ollama_chat_is_cached_too(daemon: Daemon) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What do bees make?"}],
        "stream": False,
        "options": {"temperature": 0, "num_predict": 16},
    }
    first = httpx.post(f"{daemon.url}/api/chat", json=body, headers=daemon.auth("alice"), timeout=120)
    assert first.status_code == 200 and first.headers["x-blazar-cache"] == "miss", first.text
    second = httpx.post(f"{daemon.url}/api/chat", json=body, headers=daemon.auth("alice"), timeout=120)
    assert second.headers["x-blazar-cache"] == "hit"
    assert second.json()["message"] == first.json()["message"]
    formatted = {**body, "format": "json"}
    r = httpx.post(f"{daemon.url}/api/chat", json=formatted, headers=daemon.auth("alice"), timeout=120)
    assert r.headers["x-blazar-cache"] == "bypass" and r.headers["x-blazar-cache-reason"] == "structured"


def test_opted_in_per_request_and_a_failed_embedding_lets_the_request_run(
    tmp_path: Path, model_path: Path
) -> None:
    config = CONFIG.replace("enabled = true", "enabled = false").replace(MODEL + '"', 'no-such-embedder"')
    proc = start_daemon(make_home(tmp_path / "home", model_path, config=config))
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        plain = httpx.post(f"{proc.url}/v1/chat/completions", json=body, timeout=120)
        assert plain.status_code == 200 and "x-blazar-cache" not in plain.headers  # not asked: untouched
        r = httpx.post(
            f"{proc.url}/v1/chat/completions", json=body, headers={"X-Blazar-Cache": "on"}, timeout=120
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        assert r.headers["x-blazar-cache"] == "bypass"
        assert r.headers["x-blazar-cache-reason"] == "embedding_failed; code=MODEL_NOT_FOUND"
        metrics = httpx.get(f"{proc.url}/metrics", timeout=30).text
        assert 'blazar_semantic_cache_bypasses_total{reason="embedding_failed"} 1.0' in metrics
    finally:
        proc.stop()
