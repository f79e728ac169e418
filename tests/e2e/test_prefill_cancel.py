"""A request that ends while the engine still reads its prompt frees the slot mid-prompt.

Checked on the engine itself, not timed: its own metrics show that it stopped reading
the prompt part-way (``prompt_tokens_total`` grew by less than the prompt) and
generated nothing, and its ``/slots`` show the slot idle. Before the gateway asked
for progress events, the engine read every such prompt to the end and then
generated a first token for nobody.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

STEP = 64
"""A small prompt batch, so the engine is always well inside a long prompt when the
request ends (the CPU default is 256)."""

CONFIG = f"""
slots = 1
default_ctx = 8192

[models."{MODEL}"]
prompt_batch = {STEP}
"""

CHAT = "/v1/chat/completions"
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"stream": True, "max_tokens": 64},
    "/api/chat": {"stream": True, "options": {"num_predict": 64}},
    "/v1/messages": {"stream": True, "max_tokens": 64},
}


@pytest.fixture(scope="module")
def prefill_daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    d = start_daemon(make_home(tmp_path_factory.mktemp("prefill") / "home", model_path, config=CONFIG))
    try:
        r = httpx.post(
            f"{d.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
            timeout=120,
        )
        assert r.status_code == 200
        yield d
    finally:
        d.stop()


class _Engine:
    """The daemon's engine child, asked directly (its API key read from its argv)."""

    def __init__(self, d: DaemonProc) -> None:
        info = next(e for e in d.engines() if e["model"] == MODEL and e["state"] == "ready")
        argv = Path(f"/proc/{info['pid']}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
        assert argv[argv.index("-b") + 1] == str(STEP)
        self.url = f"http://127.0.0.1:{info['port']}"
        self.headers = {"Authorization": f"Bearer {argv[argv.index('--api-key') + 1]}"}

    def busy(self) -> int:
        slots = httpx.get(f"{self.url}/slots", headers=self.headers, timeout=10).json()
        return sum(1 for s in slots if s["is_processing"])

    def counters(self) -> tuple[float, float]:
        """Prompt tokens read and tokens generated so far."""
        text = httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=10).text
        values = dict(line.split()[:2] for line in text.splitlines() if line and not line.startswith("#"))
        return float(values["llamacpp:prompt_tokens_total"]), float(values["llamacpp:tokens_predicted_total"])

    def wait(self, busy: bool, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while bool(self.busy()) != busy:
            assert time.monotonic() < deadline, f"the slot never became {'busy' if busy else 'idle'}"
            time.sleep(0.02)


def _prompt(tag: str) -> str:
    # About 3,000 tokens of text of its own, so nothing of it is in the prompt cache.
    words = "the river bends past seven quiet mills where grey herons wait".split()
    return f"{tag} {time.time()}: " + " ".join(words[i % len(words)] + str(i % 97) for i in range(1500))


def _prompt_tokens(d: DaemonProc, text: str) -> int:
    r = httpx.post(
        f"{d.url}/v1/messages/count_tokens",
        json={"model": MODEL, "messages": [{"role": "user", "content": text}]},
        timeout=60,
    )
    return int(r.json()["input_tokens"])


def _open_raw(d: DaemonProc, path: str, payload: dict[str, Any]) -> socket.socket:
    """The request on a bare socket, so that closing it is exactly a client going away."""
    host, port = d.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(payload).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection((host, int(port)))
    sock.sendall(head.encode() + body)
    return sock


def _fresh_prompt(d: DaemonProc, tag: str) -> tuple[_Engine, str, int, tuple[float, float]]:
    """The idle engine, a long prompt of its own, its size, and the engine's counters now."""
    engine = _Engine(d)
    engine.wait(busy=False)
    text = _prompt(tag)
    return engine, text, _prompt_tokens(d, text), engine.counters()


def _stopped_mid_prompt(engine: _Engine, before: tuple[float, float], n_prompt: int) -> None:
    engine.wait(busy=False)
    read, generated = engine.counters()
    assert generated == before[1], "the engine generated tokens for a request that had ended"
    assert read - before[0] < n_prompt - STEP, f"the engine read the whole prompt ({read - before[0]:.0f})"


@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_disconnect_mid_prompt_stops_the_engine_there(prefill_daemon: DaemonProc, path: str) -> None:
    engine, text, n_prompt, before = _fresh_prompt(prefill_daemon, path)
    payload = {"model": MODEL, "messages": [{"role": "user", "content": text}], **BODIES[path]}
    sock = _open_raw(prefill_daemon, path, payload)
    engine.wait(busy=True, timeout_s=30)
    time.sleep(0.2)
    sock.close()
    _stopped_mid_prompt(engine, before, n_prompt)


@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_a_cancel_or_deadline_mid_prompt_stops_the_engine_there(prefill_daemon: DaemonProc, how: str) -> None:
    engine, text, n_prompt, before = _fresh_prompt(prefill_daemon, how)
    payload = {"model": MODEL, "messages": [{"role": "user", "content": text}], **BODIES[CHAT]}
    headers = {"X-Blazar-Deadline-Ms": "1500"} if how == "deadline" else {}
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", f"{prefill_daemon.url}{CHAT}", json=payload, headers=headers) as r:
            if how == "cancel":
                engine.wait(busy=True, timeout_s=30)
                trace = r.headers["x-blazar-trace-id"]
                ended = httpx.post(f"{prefill_daemon.url}/v1/requests/{trace}/cancel", timeout=10)
                assert ended.json()["cancelled"] is True
            body = r.read().decode()
    code = "CLIENT_CLOSED_REQUEST" if how == "cancel" else "DEADLINE_EXCEEDED"
    assert code in body and "[DONE]" not in body, body[:300]
    _stopped_mid_prompt(engine, before, n_prompt)
    card = httpx.get(f"{prefill_daemon.url}/v1/requests/{r.headers['x-blazar-trace-id']}", timeout=10).json()
    assert card["state"] == "cancelled"


def test_progress_events_reach_only_a_client_that_asked(prefill_daemon: DaemonProc) -> None:
    def events(**extra: Any) -> list[dict[str, Any]]:
        payload = {
            "model": MODEL,
            # A few prompt batches (STEP tokens each): progress is reported per batch
            "messages": [{"role": "user", "content": _prompt("progress")[: STEP * 5]}],
            "max_tokens": 2,
            "stream": True,
            **extra,
        }
        r = httpx.post(f"{prefill_daemon.url}/v1/chat/completions", json=payload, timeout=120)
        assert r.status_code == 200
        lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ") and ln != "data: [DONE]"]
        return [json.loads(ln) for ln in lines]

    plain = events()
    assert plain and not any("prompt_progress" in e for e in plain)
    assert plain[0]["choices"][0]["delta"].get("role") == "assistant"
    asked = events(return_progress=True)
    assert any("prompt_progress" in e for e in asked)
