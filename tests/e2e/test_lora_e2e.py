"""LoRA adapters on the real engine: `blazar lora add` reloads the model with the adapter,
which changes its greedy answer; a request's `lora` at scale 0 (OpenAI's `extra_body`, Ollama's
`options.lora`) gives the base answer back, and so does `blazar lora rm`."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from tests.lora_adapter import build_adapter
from tests.support import MODEL, make_home, start_daemon

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0, "max_tokens": 8, "seed": 1}


def _openai(client: openai.OpenAI, **extra: object) -> str:
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, extra_body=extra or None, **GREEDY)  # type: ignore[arg-type]
    return reply.choices[0].message.content or ""


def _ollama(client: ollama.Client, **extra: object) -> str:
    options = {"temperature": 0, "num_predict": 8, "seed": 1, **extra}
    return client.chat(model=MODEL, messages=QUESTION, options=options).message.content or ""  # type: ignore[arg-type]


def test_an_adapter_changes_the_answer_and_scale_zero_gives_it_back(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config="default_ctx = 512\nslots = 1\n")
    adapter = build_adapter(model_path, tmp_path / "noise.gguf")
    wrong = build_adapter(model_path, tmp_path / "wrong.gguf", architecture="qwen2", layers=1)
    d = start_daemon(home)
    try:
        oai = openai.OpenAI(base_url=f"{d.url}/v1", api_key="unused", max_retries=0, timeout=300)
        oll = ollama.Client(host=d.url, timeout=300)
        base, base_ollama = _openai(oai), _ollama(oll)
        assert base and base_ollama

        added = d.cli("lora", "add", MODEL, str(adapter), check=False)
        assert added.returncode == 0, added.stderr
        assert "added LoRA adapter noise (id 0, scale 1" in added.stdout
        assert "restarts with it once its requests finish" in added.stdout
        refused = d.cli("lora", "add", MODEL, str(wrong), check=False)
        assert refused.returncode == 1 and "made for a 'qwen2' model" in refused.stderr
        listed = json.loads(d.cli("lora", "list", MODEL, "--json").stdout)
        assert [a["name"] for a in listed[0]["adapters"]] == ["noise"]

        changed = _openai(oai)  # the adapter at its own scale, 1
        assert changed != base
        assert _openai(oai, lora=[{"name": "noise", "scale": 0}]) == base
        assert _openai(oai, lora=[{"id": 0, "scale": 1}]) == changed
        assert _ollama(oll, lora=[{"name": "noise", "scale": 0}]) == base_ollama
        assert _ollama(oll) != base_ollama

        with pytest.raises(openai.NotFoundError) as missing:
            _openai(oai, lora=[{"name": "sailor", "scale": 1}])
        error = missing.value.body  # the SDK keeps the envelope's `error` object
        assert isinstance(error, dict) and error["blazar_code"] == "LORA_NOT_FOUND"
        assert "0: noise" in error["message"]
        explained = httpx.get(f"{d.url}/api/explain/{MODEL}", timeout=30).json()
        loras = next(s for s in explained["settings"] if s["name"] == "loras")
        assert loras["value"] == ["0: noise x1"] and loras["source"] == "model"

        removed = d.cli("lora", "rm", MODEL, "noise", check=False)
        assert removed.returncode == 0, removed.stderr
        assert _openai(oai) == base
        with pytest.raises(openai.NotFoundError):
            _openai(oai, lora=[{"id": 0, "scale": 1}])  # no adapter left
    finally:
        d.stop()


def test_v1_adapters_reads_and_sets_the_scales(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config="default_ctx = 512\nslots = 1\n")
    adapter = build_adapter(model_path, tmp_path / "noise.gguf")
    d = start_daemon(home)
    try:
        oai = openai.OpenAI(base_url=f"{d.url}/v1", api_key="unused", max_retries=0, timeout=300)
        base = _openai(oai)
        assert d.cli("lora", "add", MODEL, str(adapter), check=False).returncode == 0
        changed = _openai(oai)
        assert changed != base

        def listing() -> list[tuple[int, str, float, float | None]]:
            doc = httpx.get(f"{d.url}/v1/adapters", params={"model": MODEL}, timeout=30).json()
            return [(a["id"], a["name"], a["scale"], a["running_scale"]) for a in doc["data"]]

        assert listing() == [(0, "noise", 1.0, 1.0)]
        off = httpx.post(
            f"{d.url}/v1/adapters",
            json={"model": MODEL, "adapters": [{"name": "noise", "scale": 0}]},
            timeout=60,
        )
        assert off.status_code == 200, off.text
        assert off.json()["restarting"] is True and off.json()["data"][0]["scale"] == 0.0
        assert _openai(oai) == base  # every request now runs with the adapter off
        assert listing() == [(0, "noise", 0.0, 0.0)]
        assert _openai(oai, lora=[{"id": 0, "scale": 1}]) == changed  # a request may still ask for it
        listed = json.loads(d.cli("lora", "list", MODEL, "--json").stdout)
        assert listed[0]["adapters"][0]["scale"] == 0.0  # kept in the store: every start uses it

        back = httpx.post(
            f"{d.url}/v1/adapters", json={"model": MODEL, "adapters": [{"id": 0, "scale": 1}]}, timeout=60
        )
        assert back.status_code == 200 and _openai(oai) == changed

        missing = httpx.post(
            f"{d.url}/v1/adapters", json={"model": MODEL, "adapters": [{"name": "x", "scale": 1}]}
        )
        assert missing.status_code == 404 and missing.json()["error"]["blazar_code"] == "LORA_NOT_FOUND"
        wild = httpx.post(f"{d.url}/v1/adapters", json={"model": MODEL, "adapters": [{"id": 0, "scale": 99}]})
        assert wild.status_code == 400, wild.text
        both = httpx.post(
            f"{d.url}/v1/adapters",
            json={"model": MODEL, "adapters": [{"id": 0, "name": "noise", "scale": 1}]},
        )
        assert both.status_code == 400 and both.json()["error"]["param"] == "adapters", both.text
        assert httpx.get(f"{d.url}/v1/adapters", params={"model": "nope"}).status_code == 404
        assert httpx.get(f"{d.url}/v1/adapters").status_code == 400
    finally:
        d.stop()
