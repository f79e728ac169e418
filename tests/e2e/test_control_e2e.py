"""Control vectors on the real engine: `POST /v1/chat/completions/control` runs the request on
an engine started with the vectors. A strong vector changes the greedy answer, strength 0
gives the plain answer back, plain chat is never steered, and what does not fit the model is
refused with a code naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from tests.support import MODEL, add_key, make_home, start_daemon
from tests.synthetic_control import build_vector, model_shape

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name a color."}]
GREEDY = {"temperature": 0, "max_tokens": 16, "seed": 1}
ROUTE = "/v1/chat/completions/control"


def _plain(url: str) -> str:
    r = httpx.post(
        f"{url}/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, **GREEDY}, timeout=300
    )
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def _steered(url: str, vectors: Any, **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": QUESTION, **GREEDY, "control_vectors": vectors, **extra}
    return httpx.post(f"{url}{ROUTE}", json=body, timeout=300)


def _text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["model"] == MODEL
    return str(doc["choices"][0]["message"]["content"])


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    return error


def test_a_strong_vector_changes_the_answer_and_strength_zero_gives_it_back(
    tmp_path: Path, model_path: Path
) -> None:
    home = make_home(tmp_path / "home", model_path, config="default_ctx = 512\nslots = 1\n")
    vector = build_vector(model_path, tmp_path / "noise.gguf")
    width, blocks = model_shape(model_path)
    narrow = build_vector(model_path, tmp_path / "narrow.gguf", width=width // 2)
    deep = build_vector(model_path, tmp_path / "deep.gguf", layers=blocks + 3)
    d = start_daemon(home)
    try:
        base = _plain(d.url)
        assert base

        added = d.cli("control", "add", MODEL, str(vector), check=False)
        assert added.returncode == 0, added.stderr
        assert f"added control vector noise (layers 1-{blocks - 1}, width {width}" in added.stdout
        refused = d.cli("control", "add", MODEL, str(narrow), check=False)
        assert refused.returncode == 1 and f"has width {width // 2}" in refused.stderr
        listed = json.loads(d.cli("control", "list", MODEL, "--json").stdout)
        assert [v["name"] for v in listed[0]["control_vectors"]] == ["noise"]

        assert _text(_steered(d.url, [{"name": "noise", "strength": 0}])) == base
        strong = _text(_steered(d.url, [{"name": "noise", "strength": 20}]))
        assert strong != base
        assert _text(_steered(d.url, [{"name": "noise", "strength": 20}])) == strong  # the same engine again
        # the whole range, said: the same sum; a file by its path: the same vector
        ranged = _steered(
            d.url, [{"path": str(vector), "strength": 20}], control_vector_layers=[1, blocks - 1]
        )
        assert _text(ranged) == strong
        assert _plain(d.url) == base  # plain chat runs on the model's own engine, never steered
        oai = openai.OpenAI(base_url=f"{d.url}/v1", api_key="unused", max_retries=0, timeout=300)
        reply = oai.post(
            "/chat/completions/control",
            cast_to=ChatCompletion,
            body={
                "model": MODEL,
                "messages": QUESTION,
                **GREEDY,
                "control_vectors": [{"name": "noise", "strength": 20}],
            },
        )
        assert reply.choices[0].message.content == strong and reply.model == MODEL

        with httpx.stream(
            "POST",
            f"{d.url}{ROUTE}",
            json={"model": MODEL, "messages": QUESTION, **GREEDY, "stream": True,
                  "control_vectors": [{"name": "noise", "strength": 20}]},
            timeout=300,
        ) as streamed:  # fmt: skip
            assert streamed.status_code == 200
            lines = [
                line.removeprefix("data: ") for line in streamed.iter_lines() if line.startswith("data: ")
            ]
        assert lines[-1] == "[DONE]"
        pieces = [
            json.loads(x)["choices"][0]["delta"].get("content") or ""
            for x in lines[:-1]
            if '"choices":[{' in x
        ]
        assert "".join(pieces) == strong

        engines = {str(e["model"]) for e in d.engines()}
        assert MODEL in engines and any(name.startswith(f"{MODEL}+steer-") for name in engines), engines

        missing = _error(_steered(d.url, [{"name": "sailor", "strength": 1}]), 404)
        assert missing["blazar_code"] == "CONTROL_VECTOR_NOT_FOUND" and "noise" in missing["message"]
        assert missing["param"] == "control_vectors[0].name"
        word = _error(_steered(d.url, [{"name": "noise", "strength": "high"}]), 400)
        assert word["blazar_code"] == "BAD_REQUEST" and word["param"] == "control_vectors[0].strength"
        deeper = _error(_steered(d.url, [{"path": str(deep), "strength": 1}]), 400)
        assert deeper["blazar_code"] == "CONTROL_VECTOR_MISMATCH"
        assert deeper["param"] == "control_vectors[0].path"
        assert f"{blocks + 3} layers" in deeper["message"] and str(tmp_path) not in deeper["message"]
        outside = _error(_steered(d.url, [{"name": "noise"}], control_vector_layers=[0, blocks + 5]), 400)
        assert (
            outside["blazar_code"] == "CONTROL_VECTOR_MISMATCH"
            and outside["param"] == "control_vector_layers"
        )
        nothing = _error(_steered(d.url, []), 400)
        assert nothing["param"] == "control_vectors"
        not_one = _error(_steered(d.url, [{"path": str(model_path), "strength": 1}]), 400)
        assert (
            not_one["blazar_code"] == "CONTROL_VECTOR_INVALID" and str(model_path) not in not_one["message"]
        )

        removed = d.cli("control", "rm", MODEL, "noise", check=False)
        assert removed.returncode == 0, removed.stderr
        gone = _error(_steered(d.url, [{"name": "noise", "strength": 1}]), 404)
        assert gone["blazar_code"] == "CONTROL_VECTOR_NOT_FOUND"
    finally:
        d.stop()


def test_a_vector_by_path_needs_an_admin_key(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config="default_ctx = 512\nslots = 1\n")
    vector = build_vector(model_path, tmp_path / "noise.gguf")
    chat, admin = add_key(home, "chat", "chat"), add_key(home, "root", "admin")
    d = start_daemon(home)
    try:
        body = {"model": MODEL, "messages": QUESTION, "control_vectors": [{"path": str(vector)}]}
        r = httpx.post(f"{d.url}{ROUTE}", json=body, headers={"Authorization": f"Bearer {chat}"}, timeout=60)
        refused = _error(r, 403)
        assert refused["blazar_code"] == "KEY_SCOPE_FORBIDDEN" and "blazar control add" in refused["message"]
        engines = httpx.get(f"{d.url}/admin/engines", headers={"Authorization": f"Bearer {admin}"}).json()
        assert not any(str(e["model"]).startswith(f"{MODEL}+steer-") for e in engines["engines"])  # none made
    finally:
        d.stop()
