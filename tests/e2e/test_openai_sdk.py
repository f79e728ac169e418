"""The real daemon, the real engine, the official ``openai`` SDK."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import MODEL, DaemonProc, engine_pids, wait_gone

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Name three colours."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_list_and_get(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_non_stream(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=16, temperature=0)
    assert r.model == MODEL  # the engine's --alias makes relayed bytes carry the name
    assert r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens > 0


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=PROMPT,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(text).strip()
    assert usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 0


def test_legacy_completions(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=5, temperature=0)
    assert r.choices[0].text


def test_gateway_answer_equals_direct_engine(
    daemon: DaemonProc, client: openai.OpenAI, model_path: Path, tmp_path: Path
) -> None:
    """At temperature 0 with a fixed seed the relayed answer is the engine's own."""
    engine = daemon.engines()[0] if daemon.engines() else None
    slots, ctx = (engine["slots"], engine["ctx_per_slot"]) if engine else (4, 4096)
    port = free_port()
    argv = [sys.executable, "-m", "actors.engines.llamacpp_host", "-m", str(model_path),
            "-c", str(int(ctx) * int(slots)), "-np", str(slots), "--port", str(port), "--alias", MODEL]  # type: ignore[call-overload]  # fmt: skip
    direct = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        body = {"messages": PROMPT, "max_tokens": 24, "temperature": 0, "seed": 7}
        expected = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60).json()
        got = client.chat.completions.create(model=MODEL, **body)  # type: ignore[call-overload]
        assert got.choices[0].message.content == expected["choices"][0]["message"]["content"]
        assert got.model == expected["model"] == MODEL
    finally:
        direct.terminate()
        direct.wait(10)


def test_unknown_model_is_404_with_code(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=PROMPT)
    body = info.value.body
    assert isinstance(body, dict) and body["blazar_code"] == "MODEL_NOT_FOUND"
    assert "blazar pull no-such-model" in body["message"]


def test_bad_field_is_400_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens="many")  # type: ignore[arg-type]
    body = info.value.body
    assert isinstance(body, dict) and body["blazar_code"] == "BAD_REQUEST"
    assert "max_tokens" in body["message"]


def _busy_slots(daemon: DaemonProc) -> int:
    slots = httpx.get(f"{daemon.url}/admin/engines/{MODEL}/slots", timeout=5).json()
    return sum(1 for s in slots if s.get("is_processing"))


def test_disconnect_frees_the_slot(daemon: DaemonProc) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 2000,
        "stream": True,
    }
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{daemon.url}/v1/chat/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        assert _busy_slots(daemon) == 1
    t0 = time.monotonic()
    while _busy_slots(daemon) and time.monotonic() - t0 < 2.0:
        time.sleep(0.02)
    assert _busy_slots(daemon) == 0, "the engine slot was still busy 2 s after the client left"
    assert daemon.engines()[0]["in_flight"] == 0


def test_engine_kill_mid_stream_fails_fast_then_recovers(daemon: DaemonProc, client: openai.OpenAI) -> None:
    client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=2)  # make sure it runs
    before = daemon.engines()[0]
    pid = before["pid"]
    assert isinstance(pid, int)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a long story."}],
        max_tokens=2000,
        stream=True,
    )
    t0 = 0.0
    with pytest.raises(openai.APIError) as info:
        for i, _chunk in enumerate(stream):
            if i == 3:
                t0 = time.monotonic()
                os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - t0 < 5.0
    assert isinstance(info.value.body, dict) and info.value.body["blazar_code"] == "ENGINE_CRASHED"
    r = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=4)
    assert r.choices[0].message.content is not None
    ps = daemon.cli("ps", "--json")
    engine = json.loads(ps.stdout)["engines"][0]
    assert engine["restarts"] == int(before["restarts"]) + 1  # type: ignore[call-overload]
    assert engine["state"] == "ready" and engine["pid"] != pid


def test_a_request_right_after_the_idle_engine_was_killed_is_answered(
    daemon: DaemonProc, client: openai.OpenAI
) -> None:
    """A kill -9 (or the OOM killer) between two requests: the next one, sent at once, waits
    for the engine to start again instead of meeting the crash (502 ENGINE_CRASHED), whether
    it comes while the child's threads still exit, before the daemon has read its exit, or
    after."""
    client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=2)  # make sure it runs
    before = daemon.engines()[0]
    pid = before["pid"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGKILL)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=PROMPT, max_tokens=4)
    assert raw.parse().choices[0].message.content is not None
    assert raw.headers["x-blazar-status"] == "loading"  # the answer says it waited for the start
    engine = daemon.engines()[0]
    assert engine["restarts"] == int(before["restarts"]) + 1  # type: ignore[call-overload]
    assert engine["state"] == "ready" and engine["pid"] != pid
    # The same through a translated dialect (Ollama's chat, read from the engine's stream).
    os.kill(int(engine["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    body = {"model": MODEL, "messages": PROMPT, "stream": False, "options": {"num_predict": 4}}
    answer = httpx.post(f"{daemon.url}/api/chat", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["done"] is True
    assert daemon.engines()[0]["restarts"] == int(before["restarts"]) + 2  # type: ignore[call-overload]


def test_concurrent_streams_share_slots(client: openai.OpenAI) -> None:
    results: list[str] = []

    def one() -> None:
        r = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=8, temperature=0)
        results.append(r.choices[0].message.content or "")

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4 and all(results)


def test_blazar_run_streams_an_answer(daemon: DaemonProc) -> None:
    out = daemon.cli("run", MODEL, "Why is the sky blue?", "--temperature", "0", "--max-tokens", "32")
    assert out.returncode == 0
    assert len(out.stdout.strip()) > 10
    assert "started a background daemon" not in out.stderr


def test_no_engine_left_after_stop(daemon: DaemonProc, client: openai.OpenAI) -> None:
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    pids = [e["pid"] for e in daemon.engines() if e["pid"]]
    assert pids and all(p in engine_pids() for p in pids)
    out = daemon.cli("stop", check=False)
    assert out.returncode == 0, out.stderr
    assert daemon.proc.wait(timeout=30) == 0
    assert wait_gone([p for p in pids if isinstance(p, int)]) == []
