"""The lane-specific model settings: ``[models."NAME"]`` GPU and diffusion keys reach the GPU
lanes' argv through the launch spec, the memory fraction comes from the fit plan when unset,
and a key the chosen lane does not read is shown as unused, never dropped unseen."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.config import EngineConfig, ModelOverride, RuntimeConfig
from actors.engines import llamacpp, sdcpp, sglang, vllm
from actors.engines.lane import Lane
from actors.settings import Resolved, resolve_launch
from blazar.config import ConfigError, load_config, resolve_paths
from registry.gguf import ModelInfo
from registry.store import ModelFile, ModelRecord

NAME = "qwen2.5-7b"


def _record(fmt: str, kind: str = "chat") -> ModelRecord:
    file = ModelFile(name="config.json", digest="sha256:" + "1" * 64, size=1)
    return ModelRecord(name=NAME, digest="sha256:" + "0" * 64, size=1, path=f"/m/{NAME}", source="t",
                       created_at=0, modified_at=0, files=[file], format=fmt, kind=kind)  # fmt: skip


def _info(arch: str) -> ModelInfo:
    return ModelInfo(
        architecture=arch, parameter_count=1, context_length=32768, tensor_count=0, data_offset=0
    )


def _resolve(over: ModelOverride, *, fmt: str = "safetensors", arch: str = "Qwen2ForCausalLM",
             lanes: dict[str, Lane | None], fraction: float | None = None) -> Resolved:  # fmt: skip
    config = RuntimeConfig.in_home("/h")
    config = RuntimeConfig(
        **{**{f: getattr(config, f) for f in config.__struct_fields__}, "models": {NAME: over}}
    )
    asked: list[tuple[int, int, int]] = []

    def plan(ctx: int, slots: int, tp: int) -> float | None:
        asked.append((ctx, slots, tp))
        return fraction

    resolved = resolve_launch(config, _record(fmt), _info(arch), lanes=lanes,
                              plan_gpu_layers=lambda ctx, slots: None, plan_memory_fraction=plan)  # fmt: skip
    if resolved.spec.lane in ("vllm", "sglang") and over.gpu_memory_fraction is None:
        assert asked == [(resolved.spec.ctx_per_slot, resolved.spec.slots, resolved.spec.gpu.tensor_parallel)]
    return resolved


def _gpu_lanes() -> dict[str, Lane | None]:
    """Every lane as found at a configured path (nothing runs: argv only)."""
    return {
        "llamacpp": llamacpp.lane(EngineConfig()),
        "mistralrs": None,
        "vllm": vllm.lane(EngineConfig(), "/opt/vllm/bin/vllm"),
        "sglang": sglang.lane(EngineConfig(), "/opt/sgl/bin/python"),
        "mlx": None,
        "sdcpp": sdcpp.lane(EngineConfig(), "/opt/sd-server"),
    }


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_gpu_settings_reach_vllm() -> None:
    over = ModelOverride(gpu_memory_fraction=0.42, tensor_parallel=2, quantization="fp8", dtype="bfloat16")
    r = _resolve(over, lanes=_gpu_lanes())
    assert r.spec.lane == "vllm" and r.spec.architecture == "Qwen2ForCausalLM"
    lane = _gpu_lanes()["vllm"]
    assert lane is not None
    argv = lane.argv(r.spec, 8000, "k")
    assert _flag(argv, "--gpu-memory-utilization") == "0.42" and _flag(argv, "--tensor-parallel-size") == "2"
    assert _flag(argv, "--quantization") == "fp8" and _flag(argv, "--dtype") == "bfloat16"
    assert _flag(argv, "--tool-call-parser") == "hermes"  # known for Qwen2 when none is set
    by = {s.name: s for s in r.settings}
    assert (by["gpu_memory_fraction"].source, by["gpu_memory_fraction"].key) == (
        "override",
        f'models."{NAME}".gpu_memory_fraction',
    )


def test_an_unset_fraction_comes_from_the_fit_plan_else_the_lanes_default() -> None:
    lanes = _gpu_lanes()
    planned = _resolve(ModelOverride(engine="sglang"), lanes=lanes, fraction=0.31)
    assert planned.spec.lane == "sglang" and planned.spec.gpu.memory_fraction == 0.31
    sg = lanes["sglang"]
    assert sg is not None and _flag(sg.argv(planned.spec, 1, "k"), "--mem-fraction-static") == "0.31"
    by = {s.name: s for s in planned.settings}
    assert by["gpu_memory_fraction"].source == "derived" and "fit plan" in (
        by["gpu_memory_fraction"].note or ""
    )
    unmeasured = _resolve(ModelOverride(engine="sglang", tool_parser="qwen25"), lanes=lanes, fraction=None)
    argv = sg.argv(unmeasured.spec, 1, "k")
    assert _flag(argv, "--mem-fraction-static") == f"{sglang.DEFAULT_MEMORY_FRACTION:.2f}"
    assert _flag(argv, "--tool-call-parser") == "qwen25"


def test_the_diffusion_settings_reach_sd_server() -> None:
    over = ModelOverride(components={"vae": "/m/ae.safetensors", "t5xxl": "/m/t5.gguf"}, offload_to_cpu=True,
                         diffusion_fa=True, weight_type="q8_0")  # fmt: skip
    r = _resolve(over, fmt="diffusion", arch="flux", lanes=_gpu_lanes())
    assert r.spec.lane == "sdcpp"
    lane = _gpu_lanes()["sdcpp"]
    assert lane is not None
    argv = lane.argv(r.spec, 7000, "k")
    assert _flag(argv, "--diffusion-model") == f"/m/{NAME}"  # a Flux transformer beside its parts
    assert _flag(argv, "--vae") == "/m/ae.safetensors" and _flag(argv, "--t5xxl") == "/m/t5.gguf"
    assert "--offload-to-cpu" in argv and "--diffusion-fa" in argv and _flag(argv, "--type") == "q8_0"
    assert "--vae-tiling" not in argv
    assert r.spec.slots == 1  # sd-server makes one image at a time: the others queue in the gateway
    assert "1 sequence(s) at a time;" in ({s.name: s for s in r.settings}["slots"].note or "")


def test_a_setting_the_lane_does_not_read_is_shown_unused() -> None:
    over = ModelOverride(engine="sdcpp", tensor_parallel=2, vae_tiling=True)
    r = _resolve(over, fmt="diffusion", arch="sd1", lanes=_gpu_lanes())
    by = {s.name: s for s in r.settings}
    assert by["tensor_parallel"].note == "unused: the sdcpp lane does not read it"
    assert "vae_tiling" in by and by["vae_tiling"].note is None
    assert r.spec.gpu.tensor_parallel == 1 and r.spec.diffusion.vae_tiling


def test_the_config_file_checks_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text(
        '[models."q"]\ngpu_memory_fraction = 0.5\ntensor_parallel = 4\ndtype = "bfloat16"\n'
        'components = { vae = "/v.safetensors" }\n'
    )
    over = load_config(resolve_paths()).models["q"]
    assert (over.gpu_memory_fraction, over.tensor_parallel, over.components) == (
        0.5,
        4,
        {"vae": "/v.safetensors"},
    )
    for bad, key in (("gpu_memory_fraction = 1.5", "gpu_memory_fraction"), ('dtype = "int3"', "dtype"),
                     ('components = { unet = "/u" }', "components")):  # fmt: skip
        (tmp_path / "config.toml").write_text(f'[models."q"]\n{bad}\n')
        with pytest.raises(ConfigError, match=key):
            load_config(resolve_paths())


def test_llama_cpp_s_own_flags_are_unused_on_another_lane() -> None:
    over = ModelOverride(engine="vllm", kv_cache="q8_0", flash_attn="on", micro_batch=64)
    r = _resolve(over, fmt="safetensors", arch="LlamaForCausalLM", lanes=_gpu_lanes())
    by = {s.name: s for s in r.settings}
    for name in ("kv_cache", "flash_attn", "micro_batch"):
        assert by[name].note == "unused: the vllm lane does not read it", by[name]
    assert (r.spec.kv_cache, r.spec.flash_attn, r.spec.micro_batch) == (None, None, None)
