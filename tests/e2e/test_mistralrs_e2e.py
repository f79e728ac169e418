"""The mistral.rs lane for real, through the daemon: a model pinned to it answers the official
OpenAI, Anthropic and Ollama clients, calls a tool through the gateway's emulation, runs beside a
llama.cpp model, comes back after a ``kill -9`` of its host, and never outlives the daemon.

The wheel is slow on these cores (a few tokens a second when the machine is busy): outputs
are short and no test looks at speed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from registry.store import Store
from tests.support import MODEL, DaemonProc, engine_pids, make_home, start_daemon, wait_gone

pytestmark = pytest.mark.slow

MISTRAL = "smollm2-mistral"
CONFIG = (
    f'[models."{MISTRAL}"]\nengine = "mistralrs"\nctx = 2048\n'
    f'[models."{MODEL}"]\nlanes = ["mistralrs"]\n'  # llama.cpp's, and mistral.rs's on request
)
HI = [{"role": "user", "content": "Say hello."}]


def _home(root: Path, model_path: Path) -> Path:
    home = make_home(root, model_path, config=CONFIG)
    Store(home / "models").import_file(model_path, MISTRAL, source="test")
    return home


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    d = start_daemon(_home(tmp_path_factory.mktemp("mistralrs") / "home", model_path))
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=180)


def _engine(daemon: DaemonProc, model: str) -> dict[str, Any]:
    return next(e for e in daemon.engines() if e["model"] == model)


def test_the_openai_client_streams_a_chat_from_the_lane(daemon: DaemonProc, client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MISTRAL, messages=HI, max_tokens=8, stream=True)  # type: ignore[arg-type]
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 2 and "".join(pieces).strip(), pieces
    engine = _engine(daemon, MISTRAL)
    assert (engine["lane"], engine["engine"]) == ("mistral.rs", "mistralrs-host")
    assert engine["version"].startswith("mistralrs ") and engine["pid"] in engine_pids("mistralrs_host")
    plan = httpx.get(f"{daemon.url}/api/plan/{MISTRAL}", timeout=30).json()
    lanes = {c["lane"]: c for c in plan["lanes"]}
    assert plan["lane"] == "mistralrs-host" and lanes["mistralrs"]["taken"]
    assert lanes["llamacpp"]["why"] == "the model is pinned to mistralrs"


def test_the_anthropic_and_ollama_routes_are_translated_onto_it(daemon: DaemonProc) -> None:
    ant = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=180)
    m = ant.messages.create(model=MISTRAL, max_tokens=8, messages=HI)  # type: ignore[arg-type]
    assert m.content[0].type == "text" and m.content[0].text.strip()  # type: ignore[union-attr]
    assert m.usage.output_tokens > 0
    answer = ollama.Client(host=daemon.url, timeout=180).chat(
        model=MISTRAL, messages=HI, options={"num_predict": 8}
    )
    assert answer.message.content and answer.done


def test_a_tool_call_goes_through_the_gateways_emulation(client: openai.OpenAI) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    r = client.chat.completions.create(
        model=MISTRAL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=40,
    )
    (call,) = r.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert isinstance(json.loads(call.function.arguments)["city"], str)  # type: ignore[union-attr]


def test_two_models_on_two_lanes_side_by_side(daemon: DaemonProc, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)
    assert r.choices[0].message.content is not None
    ps = subprocess.run(
        [sys.executable, "-m", "blazar", "ps"],
        env={**daemon.env, "COLUMNS": "160"},  # a wide terminal: no column cut short
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "mistralrs-host" in ps.stdout and "llamacpp-host" in ps.stdout, ps.stdout
    kinds = {e["model"]: e["engine"] for e in json.loads(daemon.cli("ps", "--json").stdout)["engines"]}
    assert kinds == {MODEL: "llamacpp-host", MISTRAL: "mistralrs-host"}


def test_a_request_asks_for_a_lane_the_model_allows(daemon: DaemonProc) -> None:
    side = {"x-blazar-engine": "mistralrs"}
    body = {"model": MODEL, "messages": HI, "max_tokens": 4}
    r = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, headers=side, timeout=180)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == MODEL  # the name asked for, whichever lane answered
    both = {e["model"]: e["lane"] for e in daemon.engines()}
    assert both[MODEL] == "llama.cpp" and both[f"{MODEL}@mistralrs"] == "mistral.rs"
    m = httpx.post(f"{daemon.url}/v1/messages", headers=side, timeout=180,
                   json={"model": MODEL, "max_tokens": 4, "messages": HI})  # fmt: skip
    assert m.status_code == 200 and m.json()["content"][0]["text"], m.text
    refused = httpx.post(f"{daemon.url}/v1/chat/completions", headers={"x-blazar-engine": "llamacpp"},
                         json={"model": MISTRAL, "messages": HI, "max_tokens": 4}, timeout=60)  # fmt: skip
    assert refused.status_code == 400 and refused.json()["error"]["blazar_code"] == "MODEL_UNSUPPORTED_ENGINE"
    assert "lanes" in refused.json()["error"]["message"]


def test_kill_9_of_its_host_is_engine_crashed_then_it_restarts(
    daemon: DaemonProc, client: openai.OpenAI
) -> None:
    before = _engine(daemon, MISTRAL)
    stream = client.chat.completions.create(
        model=MISTRAL,
        messages=[{"role": "user", "content": "Write a long story."}],
        max_tokens=400,
        stream=True,  # type: ignore[arg-type]
    )
    with pytest.raises(openai.APIError) as info:
        for i, _chunk in enumerate(stream):
            if i == 2:
                os.kill(before["pid"], signal.SIGKILL)
    assert isinstance(info.value.body, dict) and info.value.body["blazar_code"] == "ENGINE_CRASHED"
    r = client.chat.completions.create(model=MISTRAL, messages=HI, max_tokens=4)
    assert r.choices[0].message.content is not None
    after = _engine(daemon, MISTRAL)
    assert after["pid"] != before["pid"] and after["restarts"] == before["restarts"] + 1


def test_its_host_never_outlives_the_daemon(tmp_path: Path, model_path: Path) -> None:
    d = start_daemon(_home(tmp_path / "home", model_path))
    try:
        r = httpx.post(
            f"{d.url}/v1/chat/completions",
            json={"model": MISTRAL, "messages": HI, "max_tokens": 2},
            timeout=180,
        )
        assert r.status_code == 200, r.text
        host = _engine(d, MISTRAL)["pid"]
        d.proc.kill()  # SIGKILL: no shutdown hooks
        d.proc.wait(10)
        assert wait_gone([host], timeout_s=10) == []
    finally:
        if d.proc.poll() is None:
            d.stop()
