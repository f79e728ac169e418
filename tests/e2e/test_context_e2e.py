"""Context and output limits with the real engine: SmolLM2-135M is trained on 8192 tokens.

A configured context of 32768 is clamped to 8192 and reported as what llama.cpp serves;
an explicit YaRN extension makes llama.cpp serve more (a prompt past 8192 tokens runs);
an Ollama client that varies num_ctx above the training length starts the engine once;
a request with no output limit stops at the configured cap.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

CLAMPED = f"""slots = 1
[models."{MODEL}"]
ctx = 32768
max_output_tokens = 8
"""

EXTENDED = f"""slots = 1
[models."{MODEL}"]
ctx = 16384
rope_scaling = "yarn"
extra_args = ["-b", "256", "-ub", "256"]
"""

LONG = "the " * 9000
"""About 9,000 tokens: more than the 8,192 the model was trained on."""


def _daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path, config: str) -> Iterator[DaemonProc]:
    home = make_home(tmp_path_factory.mktemp("context") / "home", model_path, config=config)
    d = start_daemon(home)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def clamped(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    yield from _daemon(tmp_path_factory, model_path, CLAMPED)


@pytest.fixture(scope="module")
def extended(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    yield from _daemon(tmp_path_factory, model_path, EXTENDED)


def _engine(d: DaemonProc) -> dict[str, object]:
    (engine,) = d.engines()
    return engine


def test_a_num_ctx_that_varies_above_the_training_length_starts_the_engine_once(
    clamped: DaemonProc,
) -> None:
    # What aider sends: num_ctx = prompt tokens x 1.25 + 8192, different every time.
    for num_ctx in (9000, 9500, 12000):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hi."}],
            "stream": False,
            "options": {"num_ctx": num_ctx, "num_predict": 4},
        }
        r = httpx.post(f"{clamped.url}/api/chat", json=body, timeout=120)
        assert r.status_code == 200 and r.json()["message"]["content"]
        assert r.headers["x-blazar-context"] == "8192"
        assert r.headers["x-blazar-context-asked"] == str(num_ctx)
    engine = _engine(clamped)
    assert engine["starts"] == 1 and engine["restarts"] == 0


def test_the_clamped_context_is_what_ps_and_plan_report(clamped: DaemonProc) -> None:
    httpx.post(f"{clamped.url}/api/generate", json={"model": MODEL}, timeout=120)  # loaded
    slots = httpx.get(f"{clamped.url}/admin/engines/{MODEL}/slots", timeout=30).json()
    assert [s["n_ctx"] for s in slots] == [8192]  # llama.cpp's own word
    ps = httpx.get(f"{clamped.url}/api/ps", timeout=10).json()["models"]
    assert [m["context_length"] for m in ps] == [8192]
    engine = _engine(clamped)
    assert engine["ctx_served"] == 8192 and engine["ctx_per_slot"] == 8192
    (row,) = [line.split() for line in clamped.cli("ps").stdout.splitlines() if " ready " in line]
    assert "8192" in row and "32768" not in row
    plan = clamped.cli("plan", MODEL).stdout
    assert "8192 per slot x 1 slot(s) = 8192" in " ".join(plan.split())
    assert "clamped from 32768 to 8192 (training length); set rope_scaling to extend" in " ".join(
        plan.split()
    )


def test_a_request_without_an_output_limit_stops_at_the_cap(clamped: DaemonProc) -> None:
    # ignore_eos (llama.cpp's own field): the model never ends the answer by itself.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to 200."}], "ignore_eos": True}
    r = httpx.post(f"{clamped.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200 and r.headers["x-blazar-output-cap"] == "8"
    doc = r.json()
    assert doc["usage"]["completion_tokens"] == 8 and doc["choices"][0]["finish_reason"] == "length"
    assert _engine(clamped)["starts"] == 1


def test_a_prompt_past_the_training_length_gets_advice_that_can_work(clamped: DaemonProc) -> None:
    body = {"model": MODEL, "prompt": LONG, "raw": True, "stream": False}
    r = httpx.post(f"{clamped.url}/api/generate", json=body, timeout=120)
    assert r.status_code == 400 and r.json()["blazar_code"] == "PROMPT_TOO_LONG"
    message = r.json()["error"]
    assert "holds 8192 per slot" in message and "raise the context" not in message
    assert "rope_scaling" in message


def test_an_explicit_extension_is_served_by_llama_cpp(extended: DaemonProc) -> None:
    # The same prompt past the training length: llama.cpp takes it into a slot (it reports
    # the prompt's progress) where the clamped engine above refuses it. The stream is closed
    # after that first event, which stops the engine (processing all of it takes minutes here).
    body = {"model": MODEL, "prompt": LONG, "max_tokens": 1, "stream": True, "return_progress": True}
    with httpx.stream("POST", f"{extended.url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["x-blazar-context"] == "16384"
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
    assert json.loads(first[6:])["prompt_progress"]["total"] > 8192
    slots = httpx.get(f"{extended.url}/admin/engines/{MODEL}/slots", timeout=60).json()
    assert [s["n_ctx"] for s in slots] == [16384]
    ps = httpx.get(f"{extended.url}/api/ps", timeout=10).json()["models"]
    assert [m["context_length"] for m in ps] == [16384]
    plan = " ".join(extended.cli("plan", MODEL).stdout.split())
    assert "the engine serves 16384 per slot" in plan and "extended with yarn x2" in plan
