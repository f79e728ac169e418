"""The semantic cache's rules and store, without a daemon: its request headers, what bypasses
it, what two prompts must share to be compared, and the store's TTL, bounds and nearest match.
The daemon with a real engine: tests/e2e/test_semantic_cache_e2e.py."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from actors.ledger import RequestRecord
from blazar.config import ConfigError, SemanticCacheConfig, parse_config
from blazar.dialects.neutral import ChatRequest, Message, ResponseFormat, ToolSpec
from blazar.errors import BlazarError
from blazar.serve.semantic_cache import Asked, answer_tools, bypass_reason, context_of, read_headers
from blazar.serve.stores.semantic import Bucket, SemanticCache, normalized
from blazar.telemetry.why import Extras, tell


def _req(**fields: object) -> ChatRequest:
    messages = [Message(role="user", content="What is the capital of France?")]
    return msgspec.structs.replace(ChatRequest(model="m", messages=messages), **fields)


def test_headers_are_read_and_a_malformed_one_is_refused_by_name() -> None:
    assert read_headers({}) == Asked()
    got = read_headers({"x-blazar-cache": "ON", "x-blazar-cache-ttl": "2.5", "x-blazar-cache-threshold": "0"})
    assert got == Asked(on=True, ttl_s=2.5, threshold=0.0)
    assert read_headers({"x-blazar-cache": "off"}).on is False
    for name, value in (
        ("x-blazar-cache", "perhaps"),
        ("x-blazar-cache-ttl", "0"),
        ("x-blazar-cache-ttl", "inf"),
        ("x-blazar-cache-threshold", "-0.1"),
        ("x-blazar-cache-threshold", "1.01"),
        ("x-blazar-cache-threshold", "high"),
    ):
        with pytest.raises(BlazarError) as caught:
            read_headers({name: value})
        assert caught.value.code == "BAD_REQUEST"
        assert caught.value.param is not None and caught.value.param.lower() == name


def test_what_bypasses_the_cache_and_why() -> None:
    tool = ToolSpec(name="f", parameters={"type": "object"})
    assert bypass_reason(_req(), {}, {}) is None
    assert bypass_reason(_req(stream=True), {}, {}) == "stream"
    assert bypass_reason(_req(tools=[tool]), {}, {}) == "tools"
    assert bypass_reason(_req(response_format=ResponseFormat(kind="json_object")), {}, {}) == "structured"
    assert bypass_reason(_req(response_format=ResponseFormat(kind="text")), {}, {}) is None
    assert bypass_reason(_req(), {"format": "json"}, {}) == "structured"  # Ollama's
    assert bypass_reason(_req(), {"mcp": "all"}, {}) == "mcp"
    assert bypass_reason(_req(), {"mcp": "none"}, {}) is None
    assert bypass_reason(_req(), {"n": 2}, {}) == "candidates"
    assert bypass_reason(_req(), {}, {"x-blazar-best-of": "3"}) == "candidates"
    assert bypass_reason(_req(temperature=0.7), {}, {}) == "sampling"
    assert bypass_reason(_req(temperature=0.7, seed=1), {}, {}) is None
    assert bypass_reason(_req(temperature=0.0), {}, {}) is None
    assert bypass_reason(_req(), {"store": True}, {}) == "store"
    image = [Message(role="user", content="what is this?", images=["aGk="])]
    assert bypass_reason(_req(messages=image), {}, {}) == "prompt"
    assert bypass_reason(_req(messages=[Message(role="assistant", content="hi")]), {}, {}) == "prompt"


def test_the_context_is_everything_but_the_last_message() -> None:
    def doc(last: str, **extra: object) -> dict[str, object]:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": last}]
        return {"model": "m", "messages": messages, "max_tokens": 8, **extra}

    assert context_of(doc("a")) == context_of(doc("b")) == context_of(doc("b", stream=False, user="x"))
    assert context_of(doc("a")) != context_of(doc("a", max_tokens=9))
    other_system = doc("a")
    other_system["messages"] = [{"role": "system", "content": "Be long."}, {"role": "user", "content": "a"}]
    assert context_of(other_system) != context_of(doc("a"))


def test_an_answer_that_calls_a_tool_is_seen_in_both_dialects() -> None:
    call = [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    openai = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": call}}]}
    assert answer_tools(msgspec.json.encode(openai))
    ollama = {"message": {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}}
    assert answer_tools(msgspec.json.encode(ollama))
    assert not answer_tools(b'{"choices": [{"message": {"role": "assistant", "content": "hi"}}]}')
    assert not answer_tools(b"not json")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _cache(max_entries: int = 8) -> tuple[SemanticCache, _Clock]:
    clock = _Clock()
    return SemanticCache(SemanticCacheConfig(model="e", max_entries=max_entries), clock), clock


BUCKET = Bucket(owner="alice", model="m", lane="", context="c")


def _put(
    cache: SemanticCache, vector: list[float], body: bytes, *, bucket: Bucket = BUCKET, ttl_s: float = 10
) -> None:
    cache.put(bucket, normalized(vector), body, content_type="application/json", headers={}, ttl_s=ttl_s)


def test_the_nearest_live_entry_of_the_bucket_is_found() -> None:
    cache, clock = _cache()
    _put(cache, [1.0, 0.0], b"east")
    _put(cache, [0.0, 1.0], b"north")
    found = cache.nearest(BUCKET, normalized([0.9, 0.1]), max_age_s=10)
    assert found is not None and found.entry.body == b"east" and 0.99 < found.similarity < 1.0
    # another key, model, lane or context compares nothing
    for other in (
        Bucket(owner="bob", model="m", lane="", context="c"),
        Bucket(owner="alice", model="m2", lane="", context="c"),
        Bucket(owner="alice", model="m", lane="mistralrs", context="c"),
        Bucket(owner="alice", model="m", lane="", context="d"),
    ):
        assert cache.nearest(other, normalized([1.0, 0.0]), max_age_s=10) is None
    clock.now += 5
    found = cache.nearest(BUCKET, normalized([1.0, 0.0]), max_age_s=10)
    assert found is not None and found.age_s == 5
    assert cache.nearest(BUCKET, normalized([1.0, 0.0]), max_age_s=4) is None  # a request's shorter TTL
    clock.now += 5  # the entries' own TTL: gone
    assert cache.nearest(BUCKET, normalized([1.0, 0.0]), max_age_s=100) is None and len(cache) == 0


def test_the_store_is_bounded_and_a_same_prompt_replaces_its_entry() -> None:
    cache, clock = _cache(max_entries=3)
    _put(cache, [1.0, 0.0, 0.0], b"one")
    _put(cache, [1.0, 0.0, 0.0], b"one again")  # raced misses of one prompt: one entry
    assert len(cache) == 1
    for i, v in enumerate(([0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 1.0])):
        clock.now += 1
        _put(cache, v, f"other {i}".encode())
    assert len(cache) == 3
    found = cache.nearest(BUCKET, normalized([1.0, 0.0, 0.0]), max_age_s=100)
    assert found is None or found.entry.body != b"one again"  # the oldest went first
    cache.note("m", "hit")
    cache.note("m", "miss")
    cache.note("m", "bypass", "stream")
    cache.note("m", "bypass", "stream")
    stats = cache.stats("m")
    assert (stats.hits, stats.misses, stats.bypasses, stats.entries) == (1, 1, 2, 3)
    assert cache.counts["m"].bypasses == {"stream": 2}


def test_a_vector_of_another_length_matches_nothing() -> None:
    cache, _ = _cache()
    _put(cache, [1.0, 0.0], b"two")
    found = cache.nearest(BUCKET, normalized([1.0, 0.0, 0.0]), max_age_s=10)
    assert found is not None and found.similarity == -1.0


def test_the_config_section_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    assert parse_config(b"", path).semantic_cache == SemanticCacheConfig()
    ok = parse_config(b'[semantic_cache]\nenabled = true\nmodel = "e"\nthreshold = 0.9\nttl_s = 5\n', path)
    assert ok.semantic_cache.enabled and ok.semantic_cache.threshold == 0.9
    for bad in (
        b"[semantic_cache]\nenabled = true\n",
        b"[semantic_cache]\nthreshold = 1.5\n",
        b"[semantic_cache]\nttl_s = 0\n",
        b"[semantic_cache]\nmax_entries = 0\n",
        b"[semantic_cache]\nsize = 3\n",
    ):
        with pytest.raises(ConfigError):
            parse_config(bad, path)


def test_why_tells_what_the_cache_did() -> None:
    record = RequestRecord(
        trace_id="t1",
        started_at=0.0,
        method="POST",
        path="/v1/chat/completions",
        dialect="openai",
        model="m",
        key="alice",
        status=200,
        duration_ms=3.0,
        ttft_ms=None,
        blazar_code=None,
        bytes_out=10,
        client="alice",
    )
    story = tell(record, Extras(cache="hit (similarity 0.9990, 2.0 s old)"))
    assert story.cache == "hit (similarity 0.9990, 2.0 s old)"
    assert any("semantic cache answered it" in line for line in story.lines)
    assert tell(record).cache is None
