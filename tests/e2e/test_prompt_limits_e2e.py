"""Oversized prompts with the real engine: refused before the engine sees them; gone clients free it."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from blazar.dialects.neutral import ChatRequest, Message
from blazar.dialects.prompt_size import chat_size
from tests.support import MODEL, DaemonProc

pytestmark = pytest.mark.slow

WORDS = ["alpha", "beta", "gamma", "delta"]
# 100,000 one-word messages: about 2.3 MB of JSON, far more than a 4,096-token slot.
HUGE = [{"role": "user" if i % 2 == 0 else "assistant", "content": WORDS[i % 4]} for i in range(100_000)]
LETTERS = [{"role": "user" if i % 2 == 0 else "assistant", "content": "a"} for i in range(100_000)]


def _busy_slots(daemon: DaemonProc) -> int:
    slots = httpx.get(f"{daemon.url}/admin/engines/{MODEL}/slots", timeout=10).json()
    return sum(1 for s in slots if s.get("is_processing"))


def _warm(daemon: DaemonProc) -> None:
    r = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        timeout=120,
    )
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("path", "extra"),
    [("/v1/chat/completions", {}), ("/api/chat", {"stream": False}), ("/v1/messages", {"max_tokens": 8})],
)
def test_a_hundred_thousand_messages_are_refused_at_once(
    daemon: DaemonProc, path: str, extra: dict[str, object]
) -> None:
    _warm(daemon)
    body = json.dumps({"model": MODEL, "messages": HUGE, **extra}).encode()
    assert len(body) > 2_000_000
    t0 = time.monotonic()
    r = httpx.post(
        f"{daemon.url}{path}", content=body, headers={"content-type": "application/json"}, timeout=60
    )
    took_s = time.monotonic() - t0
    assert r.status_code == 400, r.text[:300]
    assert "PROMPT_TOO_LONG" in r.text and "at least" in r.text and "4096" in r.text
    wording = (
        "maximum context length is 4096 tokens" if path.startswith("/v1/chat") else "tokens > 4096 maximum"
    )
    assert wording in r.text
    assert took_s < 10.0
    assert _busy_slots(daemon) == 0  # the engine never saw it
    # The model goes on answering at once.
    t0 = time.monotonic()
    _warm(daemon)
    assert time.monotonic() - t0 < 10.0


def test_many_one_letter_turns_are_refused_by_the_templates_cost(daemon: DaemonProc) -> None:
    # 100 KB of text could be as few as 1,235 tokens: the per-turn markers decide.
    t0 = time.monotonic()
    r = httpx.post(
        f"{daemon.url}/v1/chat/completions", json={"model": MODEL, "messages": LETTERS}, timeout=60
    )
    assert r.status_code == 400 and "PROMPT_TOO_LONG" in r.text and "at least" in r.text
    assert time.monotonic() - t0 < 10.0


def test_the_floor_is_below_the_engines_own_count(daemon: DaemonProc) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Tell me about the sea, the sky and the long road home. " * 20},
        {"role": "assistant", "content": "The sea is wide; the sky is high."},
        {"role": "user", "content": "Ünïcödé, 漢字 and emoji 🎉 too."},
    ]
    r = httpx.post(
        f"{daemon.url}/v1/messages/count_tokens",
        json={"model": MODEL, "messages": [m for m in messages if m["role"] != "system"]},
        timeout=60,
    )
    exact = r.json()["input_tokens"]
    req = ChatRequest(
        model=MODEL,
        messages=[Message(role=m["role"], content=m["content"]) for m in messages[1:]],  # type: ignore[arg-type]
    )
    # 81 bytes is the longest SmolLM2 token; 5 tokens per turn is what its template adds at least.
    assert chat_size(req).token_floor(token_bytes_max=81, message_tokens=4) <= exact


def _long_prompt(tag: str) -> list[dict[str, str]]:
    # About 600 tokens, a text of its own (nothing cached), and an answer that loops.
    return [{"role": "user", "content": f"{tag}. Count on: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, " * 20}]


def _send_raw(url: str, path: str, payload: dict[str, object]) -> socket.socket:
    """A request on a bare socket, so that closing it is exactly a client going away."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(payload).encode()
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"stream": True, "max_tokens": 1500, "ignore_eos": True}),
        ("/api/chat", {"stream": False, "options": {"num_predict": 1500, "temperature": 0}}),
    ],
)
def test_a_client_gone_mid_prompt_frees_the_engine_slot(
    daemon: DaemonProc, path: str, body: dict[str, object]
) -> None:
    _warm(daemon)
    idle_by = time.monotonic() + 300
    while _busy_slots(daemon):  # nothing left over from another test skews the timing
        assert time.monotonic() < idle_by, "the engine never became idle"
        time.sleep(0.2)
    # How long this machine takes to read such a prompt (a busy one is slow).
    t0 = time.monotonic()
    r = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": MODEL, "messages": _long_prompt(f"probe {path}"), "max_tokens": 1},
        timeout=300,
    )
    assert r.status_code == 200
    read_s = time.monotonic() - t0
    sock = _send_raw(daemon.url, path, {"model": MODEL, "messages": _long_prompt(path), **body})
    deadline = time.monotonic() + 30
    while _busy_slots(daemon) == 0:
        assert time.monotonic() < deadline, "the request never reached the engine"
        time.sleep(0.02)
    sock.close()  # the client goes away while the engine reads the prompt
    gone = time.monotonic()
    bound_s = 2 * read_s + 5
    while _busy_slots(daemon) and time.monotonic() - gone < bound_s:
        time.sleep(0.05)
    # Reading the prompt, then stopping at its first token: not the 1,500 tokens after it.
    assert _busy_slots(daemon) == 0, f"the engine still works for a client gone {bound_s:.0f} s ago"
    assert daemon.engines()[0]["in_flight"] == 0
