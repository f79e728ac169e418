"""Directory models, diffusion checkpoints and whisper.cpp files through the gateway, served
in-process: listings and show, the plan, and the refusals — a text request to a model whose
lane is not installed here (400 MODEL_UNSUPPORTED_ENGINE naming how to install it) and to an
image model (400 MODEL_KIND_MISMATCH). No engine starts: none of these lanes runs here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from actors.config import EngineConfig
from actors.engines.routing import installed
from blazar.config import Config
from registry.imports import import_path
from registry.store import Store
from tests.instant import Gateway, serve_gateway
from tests.registry.test_formats import sd15_tensors, write_safetensors
from tests.registry.test_weights import awq_dir, sharded_dir, whisper_ggml


@pytest.fixture
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path / "home"))
    here = installed(EngineConfig())
    if any(here.get(lane) is not None for lane in ("vllm", "sglang", "mlx", "sdcpp", "whispercpp")):
        pytest.skip("a GPU lane is installed here: these models would start on it")
    store = Store(tmp_path / "home" / "models")
    src = tmp_path / "src"
    src.mkdir()
    import_path(store, sharded_dir(src), "acme/tiny")
    import_path(store, awq_dir(src), "tiny-awq")
    import_path(store, write_safetensors(src / "sd15.safetensors", sd15_tensors()), "sd15")
    import_path(store, whisper_ggml(src / "ggml-tiny.en.bin"), "whisper-cpp")
    async with serve_gateway(Config()) as gw:
        yield gw


def _openai(gw: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gw.client.base_url}/v1", api_key="none", max_retries=0)


async def test_a_model_whose_lane_is_not_installed_is_a_clear_400(gateway: Gateway) -> None:
    client = _openai(gateway)
    with pytest.raises(openai.BadRequestError) as exc:
        await client.chat.completions.create(model="acme/tiny", messages=[{"role": "user", "content": "hi"}])
    body = exc.value.body
    assert isinstance(body, dict) and body["blazar_code"] == "MODEL_UNSUPPORTED_ENGINE"
    assert "runs on vllm or sglang or mlx, not installed here" in body["message"]
    assert "install vLLM" in body["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        await client.completions.create(model="tiny-awq", prompt="hi")
    body = exc.value.body
    assert isinstance(body, dict) and body["blazar_code"] == "MODEL_UNSUPPORTED_ENGINE"
    assert "(safetensors:awq)" in body["message"] and "runs on vllm or sglang," in body["message"]
    # in Anthropic's shape on its route
    r = await gateway.client.post(
        "/v1/messages",
        json={"model": "acme/tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["blazar_code"] == "MODEL_UNSUPPORTED_ENGINE"
    assert (await gateway.client.get("/health")).status_code == 200


async def test_an_image_model_is_refused_by_the_text_routes(gateway: Gateway) -> None:
    client = _openai(gateway)
    with pytest.raises(openai.BadRequestError) as exc:
        await client.chat.completions.create(model="sd15", messages=[{"role": "user", "content": "a cat"}])
    body = exc.value.body
    assert isinstance(body, dict) and body["blazar_code"] == "MODEL_KIND_MISMATCH"
    assert "an image (diffusion) model" in body["message"] and "/v1/images/generations" in body["message"]
    with pytest.raises(openai.BadRequestError):
        await client.embeddings.create(model="sd15", input="a cat")
    r = await gateway.client.post("/api/generate", json={"model": "sd15", "prompt": "a cat"})
    assert r.status_code == 400 and r.json()["blazar_code"] == "MODEL_KIND_MISMATCH"


async def test_listings_and_show_say_format_and_kind(gateway: Gateway) -> None:
    models = await _openai(gateway).models.list()
    assert {m.id for m in models.data} == {"acme/tiny", "tiny-awq", "sd15", "whisper-cpp"}
    tags = (await gateway.client.get("/api/tags")).json()["models"]
    details = {t["name"]: t["details"] for t in tags}
    assert details["acme/tiny:latest"]["format"] == "safetensors"
    assert details["acme/tiny:latest"]["family"] == "LlamaForCausalLM"
    assert details["tiny-awq:latest"]["quantization_level"] == "awq"
    assert (details["sd15:latest"]["format"], details["sd15:latest"]["family"]) == ("diffusion", "sd1")
    assert details["whisper-cpp:latest"]["format"] == "ggml-whisper"
    show = (await gateway.client.post("/api/show", json={"model": "sd15"})).json()
    assert show["capabilities"] == ["image"] and show["model_info"]["general.kind"] == "image"
    show = (await gateway.client.post("/api/show", json={"model": "acme/tiny"})).json()
    assert show["capabilities"][0] == "completion"
    info = show["model_info"]
    assert info["LlamaForCausalLM.context_length"] == 8192 and info["general.parameter_count"] > 0
    show = (await gateway.client.post("/api/show", json={"model": "whisper-cpp"})).json()
    assert show["capabilities"] == ["stt"] and show["model_info"]["whisper.n_audio_layer"] == 4


async def test_the_plan_shows_the_lane_that_would_run_it(gateway: Gateway) -> None:
    for name, lane in (("acme/tiny", "vllm"), ("sd15", "sdcpp"), ("whisper-cpp", "whispercpp")):
        r = await gateway.client.get(f"/api/plan/{name}")
        assert r.status_code == 200, r.text
        plan = r.json()
        assert plan["lane"] is None and plan["preview"]["code"] == "MODEL_UNSUPPORTED_ENGINE"
        why = {c["lane"]: c["why"] for c in plan["lanes"]}
        assert why[lane].startswith("not installed (") and why["llamacpp"].startswith("does not load")
        assert plan["estimate"]["total"] > plan["estimate"]["weights"] > 0


async def test_a_transcription_on_a_lane_not_installed_is_refused(gateway: Gateway) -> None:
    wav = b"RIFF" + (36).to_bytes(4, "little") + b"WAVEfmt " + bytes(28) + b"data" + bytes(4)
    r = await gateway.client.post(
        "/v1/audio/transcriptions",
        data={"model": "whisper-cpp"},
        files={"file": ("a.wav", wav, "audio/wav")},
    )
    assert r.status_code == 400 and r.json()["error"]["blazar_code"] == "MODEL_UNSUPPORTED_ENGINE"
    assert "whisper-server" in r.json()["error"]["message"]
