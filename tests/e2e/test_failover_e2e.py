"""A failover chain over two real lanes: the test model on llama.cpp, then the same GGUF on
mistral.rs (``MODEL@mistralrs``). A ``kill -9`` of the llama.cpp engine before a request
sends the chain to mistral.rs (the official OpenAI client sees x-blazar-target say so),
the llama.cpp target is benched, and once its bench is over a request probes it back. A
``kill -9`` during a stream ends that stream with the dialect's error event: the gateway
never restarts an answer the client has started reading.

mistral.rs is slow on these cores: outputs are short, and no test looks at speed."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

SIDE = f"{MODEL}@mistralrs"
CONFIG = f"""
[models."{MODEL}"]
lanes = ["mistralrs"]

[[failover]]
name = "duo"
targets = ["{MODEL}", "{SIDE}"]
bench_s = 3
bench_max_s = 6
"""
HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    d = start_daemon(make_home(tmp_path_factory.mktemp("failover") / "home", model_path, config=CONFIG))
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=180)


def _chain(daemon: DaemonProc) -> dict[str, dict[str, Any]]:
    doc = httpx.get(f"{daemon.url}/api/failover", timeout=30).json()
    (chain,) = doc["chains"]
    return {t["target"]: t for t in chain["targets"]}


def _kill_engine(daemon: DaemonProc, key: str) -> int:
    (engine,) = [e for e in daemon.engines() if e["model"] == key]
    pid = engine["pid"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGKILL)
    return pid


def _ask(client: openai.OpenAI) -> tuple[str, str | None, str]:
    raw = client.chat.completions.with_raw_response.create(model="duo", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    answer = raw.parse()
    assert answer.choices[0].message.content is not None
    return raw.headers["x-blazar-target"], raw.headers.get("x-blazar-failover"), answer.model


def test_a_killed_engine_moves_the_chain_to_the_other_lane_then_it_is_probed_back(
    daemon: DaemonProc, client: openai.OpenAI
) -> None:
    assert _ask(client)[0] == MODEL  # the first target, on llama.cpp
    warm = httpx.post(  # the side lane's engine loaded beforehand: mistral.rs starts slowly here
        f"{daemon.url}/v1/chat/completions",
        json={"model": MODEL, "messages": HI, "max_tokens": 2},
        headers={"x-blazar-engine": "mistralrs"},
        timeout=180,
    )
    assert warm.status_code == 200, warm.text
    _kill_engine(daemon, MODEL)

    target, passed, model = _ask(client)
    assert (target, model) == (SIDE, MODEL)  # mistral.rs answered, under the model's own name
    assert passed is not None and passed.startswith(f"{MODEL}=")
    lanes = {e["model"]: e["lane"] for e in daemon.engines()}
    assert lanes[SIDE] == "mistral.rs"
    first = _chain(daemon)[MODEL]
    # Benched (or already probing, on a machine slow enough for the bench to have run out).
    assert first["state"] in ("benched", "probing") and first["failures"] == 1
    assert first["last_code"] in ("ENGINE_CRASHED", "BAD_GATEWAY") and "-9" in first["last_error"]
    assert _chain(daemon)[SIDE]["served"] == 1

    # While benched, the chain stays on mistral.rs; once the bench is over it probes llama.cpp.
    deadline = time.monotonic() + 60
    while _chain(daemon)[MODEL]["state"] == "benched":
        assert time.monotonic() < deadline, "the bench never ended"
        time.sleep(0.2)
    assert _chain(daemon)[MODEL]["state"] == "probing"
    target, passed, _ = _ask(client)
    assert (target, passed) == (MODEL, None)
    first = _chain(daemon)[MODEL]
    assert (first["state"], first["failures"]) == ("healthy", 0)
    metrics = httpx.get(f"{daemon.url}/metrics", timeout=30).text
    assert f'blazar_failovers_total{{chain="duo",target="{MODEL}"}} 1.0' in metrics


def test_a_kill_during_a_stream_ends_it_with_an_error_event_not_a_restart(daemon: DaemonProc) -> None:
    body = {
        "model": "duo",
        "messages": [{"role": "user", "content": "Write a long story about the sea."}],
        "max_tokens": 400,
        "stream": True,
    }
    with httpx.stream("POST", f"{daemon.url}/v1/chat/completions", json=body, timeout=180) as r:
        assert r.status_code == 200 and r.headers["x-blazar-target"] == MODEL
        events: list[str] = []
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 3:
                _kill_engine(daemon, MODEL)
    assert len(events) > 3 and "[DONE]" not in events
    last = httpx.Response(200, content=events[-1]).json()
    assert last["error"]["blazar_code"] in ("ENGINE_CRASHED", "BAD_GATEWAY"), last
    # Nothing came from mistral.rs on that stream: it was not restarted elsewhere.
    assert _chain(daemon)[SIDE]["served"] == 1

    # The next request finds the crash and goes to the other lane.
    r2 = httpx.post(
        f"{daemon.url}/v1/messages",
        json={"model": "duo", "max_tokens": 4, "messages": HI},
        headers={"anthropic-version": "2023-06-01"},
        timeout=180,
    )
    assert r2.status_code == 200, r2.text
    assert r2.headers["x-blazar-target"] == SIDE and r2.json()["content"][0]["text"]
