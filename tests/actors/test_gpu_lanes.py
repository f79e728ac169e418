"""The GPU lanes' launch data (vLLM, SGLang, MLX, stable-diffusion.cpp), pinned per lane.

No GPU and none of these engines here: argv, discovery, versions and the API maps are
tested with stand-in programs; the engines run in the slow integration tests at the
end, which skip with the reason where the engine, a GPU or a model is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from actors.config import EngineConfig
from actors.engines import _gpu, mlx, sdcpp, sglang, vllm
from actors.engines._gpu import Program, memory_fraction, program_version, served_context_from_models
from actors.engines.spec import LaunchSpec

WATCHDOG = [sys.executable, "-m", "actors.engines.watchdog"]
GIB = 1 << 30


def spec(**kw: object) -> LaunchSpec:
    base: dict[str, object] = {"model": "qwen2.5-7b-instruct", "path": "/m/qwen2.5-7b", "ctx_per_slot": 8192}
    return LaunchSpec(**{**base, "slots": 4, **kw})  # type: ignore[arg-type]


def _executable(folder: Path, name: str, body: str = "exit 0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# -- vLLM --------------------------------------------------------------------------


def test_vllm_7b_argv() -> None:
    """A 7B bf16 model (about 15 GiB of weights) sized for one 80 GiB GPU by the fit plan."""
    fraction = memory_fraction(15 * GIB + 2 * GIB, 80 * GIB)  # weights + KV for 4 slots of 8192
    assert fraction == 0.24
    program = Program(argv=["/opt/vllm/bin/vllm", "serve"], found="configured", dist="vllm")
    argv = vllm.build_argv(
        spec(), port=8123, api_key="k", program=program, gpu_memory_fraction=fraction, tensor_parallel=1
    )
    assert argv == [
        *WATCHDOG, "/opt/vllm/bin/vllm", "serve", "/m/qwen2.5-7b",
        "--host", "127.0.0.1",
        "--port", "8123",
        "--api-key", "k",
        "--served-model-name", "qwen2.5-7b-instruct",
        "--max-model-len", "8192",
        "--max-num-seqs", "4",
        "--gpu-memory-utilization", "0.24",
        "--tensor-parallel-size", "1",
        "--disable-uvicorn-access-log",
    ]  # fmt: skip


def test_vllm_options() -> None:
    program = Program(argv=["vllm", "serve"], found="path", dist="vllm")
    argv = vllm.build_argv(
        spec(chat_template="/t.jinja", prompt_batch=2048, extra_args=["--enforce-eager"]),
        port=1, api_key="k", program=program, tensor_parallel=2, quantization="fp8", dtype="bfloat16",
        tool_parser=vllm.tool_parser_for("Qwen2ForCausalLM"),
    )  # fmt: skip
    tail = argv[argv.index("--disable-uvicorn-access-log") + 1 :]
    assert tail == [
        "--quantization", "fp8",
        "--dtype", "bfloat16",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--chat-template", "/t.jinja",
        "--max-num-batched-tokens", "2048",
        "--enforce-eager",
    ]  # fmt: skip
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    embed = vllm.build_argv(spec(embeddings=True), port=1, api_key="k", program=program, tool_parser="hermes")
    assert embed[-2:] == ["--runner", "pooling"] and "--enable-auto-tool-choice" not in embed
    assert vllm.tool_parser_for("GPT2LMHeadModel") is None and vllm.tool_parser_for(None) is None
    env = vllm.launch_env(spec())
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"


# -- SGLang ------------------------------------------------------------------------


def test_sglang_awq_argv() -> None:
    """An AWQ checkpoint: SGLang reads the quantization from config.json (no flag), as vLLM."""
    program = Program(
        argv=["/venvs/sgl/bin/python", "-m", "sglang.launch_server"], found="configured", dist="sglang"
    )
    argv = sglang.build_argv(
        spec(model="qwen2.5-7b-awq", path="/m/qwen2.5-7b-awq", slots=8, ctx_per_slot=4096),
        port=30001, api_key="k", program=program, mem_fraction=0.30,
        tool_parser=sglang.tool_parser_for("Qwen2ForCausalLM"),
    )  # fmt: skip
    assert argv == [
        *WATCHDOG, "/venvs/sgl/bin/python", "-m", "sglang.launch_server",
        "--model-path", "/m/qwen2.5-7b-awq",
        "--host", "127.0.0.1",
        "--port", "30001",
        "--api-key", "k",
        "--served-model-name", "qwen2.5-7b-awq",
        "--context-length", "4096",
        "--max-running-requests", "8",
        "--mem-fraction-static", "0.30",
        "--tp-size", "1",
        "--enable-metrics",
        "--tool-call-parser", "qwen",
    ]  # fmt: skip


def test_sglang_options() -> None:
    program = Program(argv=["sglang", "serve"], found="path", dist="sglang")
    argv = sglang.build_argv(
        spec(embeddings=True, prompt_batch=4096), port=1, api_key="k", program=program,
        tensor_parallel=4, quantization="fp8", tool_parser="qwen",
    )  # fmt: skip
    assert argv[: len(WATCHDOG) + 2] == [*WATCHDOG, "sglang", "serve"]
    assert argv[argv.index("--tp-size") + 1] == "4"
    assert argv[argv.index("--enable-metrics") + 1 :] == [
        "--quantization", "fp8", "--is-embedding", "--chunked-prefill-size", "4096",
    ]  # fmt: skip
    assert sglang.tool_parser_for("LlamaForCausalLM") == "llama3"


def test_sglang_discovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_gpu, "module_available", lambda name: False)
    monkeypatch.setattr(sglang, "module_available", lambda name: False)
    assert sglang.find_sglang(None) is None
    assert sglang.lane(EngineConfig()) is None
    script = _executable(tmp_path, "sglang")
    assert sglang.find_sglang(None) == Program(argv=[str(script), "serve"], found="path", dist="sglang")
    venv = sglang.find_sglang("/venvs/sgl/bin/python3")
    assert venv is not None and venv.argv == ["/venvs/sgl/bin/python3", "-m", "sglang.launch_server"]
    monkeypatch.setattr(sglang, "module_available", lambda name: name == "sglang")
    ours = sglang.find_sglang(None)
    assert ours is not None and ours.argv == [sys.executable, "-m", "sglang.launch_server"]


# -- MLX ---------------------------------------------------------------------------


def test_mlx_dir_argv(tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages[0].content }}")
    program = Program(argv=["/opt/homebrew/bin/mlx_lm.server"], found="path", dist="mlx-lm")
    argv = mlx.build_argv(
        spec(model="llama-3.2-3b-4bit", path="/m/Llama-3.2-3B-Instruct-4bit", slots=16,
             max_output_tokens=1024, chat_template=str(template)),
        port=8080, api_key="unused", program=program,
    )  # fmt: skip
    assert argv == [
        *WATCHDOG, "/opt/homebrew/bin/mlx_lm.server",
        "--model", "/m/Llama-3.2-3B-Instruct-4bit",
        "--host", "127.0.0.1",
        "--port", "8080",
        "--decode-concurrency", "16",
        "--prompt-concurrency", "8",
        "--log-level", "WARNING",
        "--max-tokens", "1024",
        "--chat-template", "{{ messages[0].content }}",
    ]  # fmt: skip
    assert "unused" not in argv  # the server has no key option: loopback guards it
    assert mlx.API.request_model == "default_model" and not mlx.API.checks_api_key
    assert not mlx.API.health_means_loaded


def test_mlx_discovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_gpu, "module_available", lambda name: False)
    monkeypatch.setattr(_gpu.sys, "executable", str(tmp_path / "nobin" / "python"))
    assert mlx.find_mlx(None) is None and mlx.lane(EngineConfig()) is None
    server = _executable(tmp_path, "mlx_lm.server")
    lane = mlx.lane(EngineConfig())
    assert lane is not None and lane.binary == str(server) and lane.kind == "mlx-lm"
    assert lane.formats == {"mlx", "safetensors"} and "json_schema" not in lane.capabilities
    monkeypatch.setattr(_gpu, "module_available", lambda name: name == "mlx_lm")
    server.unlink()
    module = mlx.find_mlx(None)
    assert module is not None and module.argv[1:] == ["-m", "mlx_lm.server"] and module.found == "module"


# -- stable-diffusion.cpp ------------------------------------------------------------


def test_sd_checkpoint_argv() -> None:
    program = Program(argv=["/opt/sd/sd-server"], found="configured", dist="")
    argv = sdcpp.build_argv(
        spec(model="sd-1.5", path="/m/blobs/sha256-5e", slots=1, threads=8),
        port=7860,
        api_key="k",
        program=program,
    )
    assert argv == [
        *WATCHDOG, "/opt/sd/sd-server",
        "--listen-ip", "127.0.0.1",
        "--listen-port", "7860",
        "-m", "/m/blobs/sha256-5e",
        "-t", "8",
    ]  # fmt: skip


def test_sd_standalone_flux_argv() -> None:
    program = Program(argv=["sd-server"], found="path", dist="")
    components = {"vae": "/m/ae.safetensors", "clip_l": "/m/clip_l.safetensors", "t5xxl": "/m/t5xxl_q8.gguf"}
    role = sdcpp.role_for("flux", has_components=True)
    argv = sdcpp.build_argv(
        spec(model="flux-schnell", path="/m/flux1-schnell-q4.gguf"), port=1, api_key="k", program=program,
        role=role, components=components, offload_to_cpu=True, flash_attention=True, vae_tiling=True,
        weight_type="q8_0", upscalers_dir="/m/upscalers",
    )  # fmt: skip
    assert argv[len(WATCHDOG) + 1 :] == [
        "--listen-ip", "127.0.0.1",
        "--listen-port", "1",
        "--diffusion-model", "/m/flux1-schnell-q4.gguf",
        "--vae", "/m/ae.safetensors",
        "--clip_l", "/m/clip_l.safetensors",
        "--t5xxl", "/m/t5xxl_q8.gguf",
        "--type", "q8_0",
        "--offload-to-cpu",
        "--diffusion-fa",
        "--vae-tiling",
        "--hires-upscalers-dir", "/m/upscalers",
    ]  # fmt: skip
    assert sdcpp.role_for("sd1", has_components=True) == "model"
    assert sdcpp.role_for("flux", has_components=False) == "model"  # a full Flux checkpoint
    with pytest.raises(ValueError, match="component"):
        sdcpp.build_argv(spec(), port=1, api_key="k", program=program, components={"unet": "/x"})


def test_sd_api_map() -> None:
    assert sdcpp.API.health == "/v1/models"  # sd-server has no /health; it listens once loaded
    assert "/v1/images/generations" in sdcpp.API.relay and not sdcpp.API.checks_api_key
    assert any("variations" in t for t in sdcpp.API.translate)
    assert sdcpp.CAPABILITIES == {"images"} and sdcpp.FORMATS == {"diffusion"}


# -- shared: discovery, versions, context, memory -----------------------------------------


def test_vllm_discovery_and_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(_gpu, "module_available", lambda name: False)
    monkeypatch.setattr(_gpu.sys, "executable", str(tmp_path / "nobin" / "python"))
    assert vllm.lane(EngineConfig()) is None
    script = _executable(tmp_path / "bin", "vllm", 'if [ "$1" = --version ]; then echo 0.11.2; fi')
    lane = vllm.lane(EngineConfig())
    assert lane is not None and lane.kind == "vllm" and lane.binary == str(script)
    assert lane.argv(spec(), 5, "k")[len(WATCHDOG) : len(WATCHDOG) + 3] == [
        str(script),
        "serve",
        "/m/qwen2.5-7b",
    ]
    assert lane.version() == "vllm 0.11.2"
    assert "safetensors:awq" in lane.formats and "gguf" not in lane.formats
    assert not lane.llguidance
    configured = vllm.lane(EngineConfig(), str(tmp_path / "elsewhere" / "vllm"))
    assert configured is not None and configured.binary == str(tmp_path / "elsewhere" / "vllm")


def test_version_from_a_venv_interpreter(tmp_path: Path) -> None:
    """A configured interpreter is asked for its distribution's version, not ``--version``."""
    program = Program(argv=[sys.executable, "-m", "msgspec"], found="configured", dist="msgspec")
    import importlib.metadata

    assert program_version(program, label="msgspec") == f"msgspec {importlib.metadata.version('msgspec')}"
    other = Program(
        argv=[str(_executable(tmp_path, "python3", "exit 3")), "-m", "x"], found="configured", dist="x"
    )
    assert program_version(other, label="x") is None


def test_sd_server_lane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sdcpp.lane(EngineConfig()) is None
    _executable(tmp_path, "sd-server", 'echo "stable-diffusion.cpp version master-1a2b3c4, commit 1a2b3c4"')
    lane = sdcpp.lane(EngineConfig())
    assert lane is not None and lane.kind == "sd-server"
    assert lane.version() == "stable-diffusion.cpp version master-1a2b3c4, commit 1a2b3c4"


@pytest.mark.parametrize(
    ("need", "total", "expected"),
    [
        (17 * GIB, 80 * GIB, 0.24),
        (1 * GIB, 141 * GIB, 0.10),
        (79 * GIB, 80 * GIB, 0.95),
        (8 * GIB, 88 * GIB, 0.10),
    ],
)
def test_memory_fraction(need: int, total: int, expected: float) -> None:
    assert memory_fraction(need, total) == expected
    with pytest.raises(ValueError):
        memory_fraction(need, 0)


async def test_served_context_from_models() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 8192}]})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://e") as client:
        assert await served_context_from_models(client) == 8192

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"data": [{"id": "m"}]})),
        base_url="http://e",
    ) as client:
        assert await served_context_from_models(client) is None


def test_gpu_check_degrades_without_a_gpu(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi") is not None:
        pytest.skip("a GPU is here: scripts/gpu_check.py runs the lanes for real instead")
    out = tmp_path / "check.json"
    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["kind"] == "gpu-check" and "schema" not in doc  # the benchmark report skips it
    assert [r["lane"] for r in doc["results"]] == ["llama.cpp", "vllm", "sglang", "stable-diffusion.cpp"]
    for r in doc["results"]:
        assert r["status"] == "skipped" and r["reason"].startswith("no NVIDIA GPU; ")
    if vllm.lane(EngineConfig()) is None:
        assert doc["results"][1]["reason"] == "no NVIDIA GPU; not installed"


# -- the engines for real (where installed) ---------------------------------------------------


def _gpu_reason() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here (nvidia-smi not found)"
    return None


def _model_dir(var: str, what: str) -> Path:
    value = os.environ.get(var)
    if not value or not Path(value).exists():
        pytest.skip(f"no {what}: set {var} to one (nothing is downloaded in tests)")
    return Path(value)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_until_healthy(
    argv: list[str], env: dict[str, str], port: int, health: str, timeout_s: float
) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise AssertionError(f"engine exited with {child.returncode} during start")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=2).status_code == 200:
                return child
        except httpx.TransportError:
            pass
        time.sleep(1.0)  # polling a real engine's start (integration tier)
    child.kill()
    raise AssertionError(f"engine not healthy within {timeout_s:.0f} s")


def _chat(port: int, model: str, key: str) -> dict[str, object]:
    resp = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_safetensors_lane_runs(engine: str) -> None:
    module = vllm if engine == "vllm" else sglang
    lane = module.lane(EngineConfig())
    if lane is None:
        pytest.skip(f"{engine} is not installed here (pip install {engine} on a CUDA machine)")
    if reason := _gpu_reason():
        pytest.skip(reason)
    folder = _model_dir("BLAZAR_TEST_HF_MODEL", "Hugging Face safetensors model directory")
    port, key = _free_port(), "test-key"
    s = spec(model="probe", path=str(folder), ctx_per_slot=2048, slots=2)
    child = _run_until_healthy(lane.argv(s, port, key), lane.env(s), port, module.API.health, 900)
    try:
        reply = _chat(port, "probe", key)
        assert reply["model"] == "probe"
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 401  # keyed
    finally:
        child.terminate()
        child.wait(60)


@pytest.mark.slow
def test_mlx_lane_runs() -> None:
    lane = mlx.lane(EngineConfig())
    if lane is None:
        pytest.skip("mlx-lm is not installed here (pip install mlx-lm on Apple silicon)")
    folder = _model_dir("BLAZAR_TEST_MLX_MODEL", "MLX model directory")
    port = _free_port()
    s = spec(model="probe", path=str(folder), slots=1)
    child = _run_until_healthy(lane.argv(s, port, ""), lane.env(s), port, mlx.API.health, 300)
    try:
        reply = _chat(port, mlx.API.request_model or "probe", "")
        assert reply["choices"]
    finally:
        child.terminate()
        child.wait(60)


@pytest.mark.slow
def test_sd_lane_runs() -> None:
    lane = sdcpp.lane(EngineConfig())
    if lane is None:
        pytest.skip("sd-server is not installed here (build stable-diffusion.cpp's server, put it on PATH)")
    checkpoint = _model_dir("BLAZAR_TEST_SD_MODEL", "diffusion checkpoint")
    port = _free_port()
    s = spec(model="sd", path=str(checkpoint), slots=1)
    child = _run_until_healthy(lane.argv(s, port, ""), lane.env(s), port, sdcpp.API.health, 600)
    try:
        resp = httpx.post(
            f"http://127.0.0.1:{port}/v1/images/generations",
            json={"prompt": "a red circle", "n": 1, "size": "256x256"},
            timeout=600,
        )
        assert resp.status_code == 200, resp.text
        assert json.loads(resp.text)["data"][0]["b64_json"]
    finally:
        child.terminate()
        child.wait(60)


def test_each_gpu_lane_says_where_it_is_healthy_and_how_long_a_start_may_take() -> None:
    from actors.engines import sdcpp, vllm
    from actors.engines.lane import Lane

    def made(module: object, path: str) -> Lane | None:
        return module.lane(EngineConfig(), path)  # type: ignore[attr-defined,no-any-return]

    assert sdcpp.API.health == "/v1/models" and vllm.API.health == "/health"
    served = made(vllm, "/usr/bin/true")  # a configured program is taken as given
    assert served is not None and (served.health, served.start_timeout_s) == ("/health", 900.0)
    images = made(sdcpp, "/usr/bin/true")
    assert images is not None and (images.health, images.start_timeout_s) == ("/v1/models", None)
