"""A GPU build of llama-server: detected from --list-devices, -ngl set from the fit plan.

No GPU here: the detection and the argv are tested with a stand-in binary and a
census of a GPU; the real CUDA engine is tried only where one is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest

import actors.planning as planning
from actors.census import Census, Gpu
from actors.config import EngineConfig, ModelOverride, RuntimeConfig
from actors.engines.llamacpp import build_argv, gpu_backend
from actors.planning import launch_spec_for
from registry import fit
from registry.shape import read_shape
from registry.store import Store

GIB = 1 << 30
H200 = "Available devices:\\n  CUDA0: NVIDIA H200 (143771 MiB, 142000 MiB free)\\n"


def _fake_server(tmp_path: Path, devices: str) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "llama-server"
    script.write_text(f"#!/bin/sh\nif [ \"$1\" = --list-devices ]; then printf '{devices}'; fi\n")
    script.chmod(0o755)
    return str(script)


def test_backend_from_the_device_list(tmp_path: Path) -> None:
    cuda = _fake_server(
        tmp_path / "a", "Available devices:\\n  CUDA0: NVIDIA H200 (143771 MiB, 142000 MiB free)\\n"
    )
    assert gpu_backend(cuda) == "CUDA"
    vulkan = _fake_server(tmp_path / "b", "Available devices:\\n  Vulkan0: AMD Radeon (16368 MiB)\\n")
    assert gpu_backend(vulkan) == "Vulkan"
    assert gpu_backend(_fake_server(tmp_path / "c", "Available devices:\\n")) is None  # a CPU build
    assert gpu_backend(str(tmp_path / "missing")) is None


def _config(tmp_path: Path, binary: str, **models: ModelOverride) -> RuntimeConfig:
    return RuntimeConfig(
        home=str(tmp_path),
        run_dir=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "cache"),
        slots=1,
        default_ctx=4096,
        engine=EngineConfig(llama_server=binary),
        models=models,
    )


@pytest.fixture
def gpu_binary(tmp_path: Path) -> str:
    for d in ("x", "y"):
        (tmp_path / d).mkdir(exist_ok=True)
    return _fake_server(
        tmp_path / "x", "Available devices:\\n  CUDA0: NVIDIA H200 (143771 MiB, 142000 MiB free)\\n"
    )


def _census(free: int) -> Census:
    gpu = Gpu(index=0, name="NVIDIA H200", total=141 * GIB, used=141 * GIB - free, free=free)
    return Census(source="nvml", gpus=[gpu], ram_total=64 * GIB, ram_available=32 * GIB)


def test_ngl_comes_from_the_fit_plan(
    tmp_path: Path, model_path: Path, gpu_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path / "models")
    record = store.import_file(model_path, "smol")
    shape = read_shape(model_path)
    config = _config(tmp_path, gpu_binary)

    monkeypatch.setattr(planning, "take_census", lambda: _census(100 * GIB))
    spec = launch_spec_for(config, store, record)
    assert spec.gpu_layers is not None and spec.gpu_layers >= shape.n_layer  # everything fits
    argv = build_argv(spec, port=1, api_key="k", binary=gpu_binary)
    assert argv[argv.index("-ngl") + 1] == str(spec.gpu_layers)

    settings = fit.Settings(ctx_per_slot=4096, slots=1)
    tight = fit.GPU_OVERHEAD + fit.estimate(shape, settings).total // 2  # about half the model fits
    monkeypatch.setattr(planning, "take_census", lambda: _census(tight))
    partial = launch_spec_for(config, store, record).gpu_layers
    assert partial == fit.fit(shape, settings, _census(tight).memory()).gpu_layers
    assert partial is not None and 0 < partial < shape.n_layer

    pinned = _config(tmp_path, gpu_binary, smol=ModelOverride(gpu_layers=7))
    assert launch_spec_for(pinned, store, record).gpu_layers == 7  # the user's choice wins


def test_the_cpu_lane_never_passes_ngl(tmp_path: Path, model_path: Path) -> None:
    store = Store(tmp_path / "models")
    record = store.import_file(model_path, "smol")
    cpu = _fake_server(tmp_path, "Available devices:\\n")
    spec = launch_spec_for(_config(tmp_path, cpu), store, record)
    assert spec.gpu_layers is None
    assert "-ngl" not in build_argv(spec, port=1, api_key="k", binary=cpu)
    gpu_spec = msgspec.structs.replace(spec, gpu_layers=10)
    assert "-ngl" not in build_argv(gpu_spec, port=1, api_key="k", binary=None)  # xllamacpp: CPU only


@pytest.mark.slow
def test_a_cuda_llama_server_offloads_the_planned_layers(tmp_path: Path, model_path: Path) -> None:
    binary = os.environ.get("BLAZAR_LLAMA_SERVER") or shutil.which("llama-server")
    if binary is None or gpu_backend(binary) != "CUDA":
        pytest.skip("no CUDA build of llama-server on this machine (set BLAZAR_LLAMA_SERVER to one)")
    store = Store(tmp_path / "models")
    record = store.import_file(model_path, "smol")
    spec = launch_spec_for(_config(tmp_path, binary), store, record)
    assert spec.gpu_layers
    argv = build_argv(spec, port=0, api_key="k", binary=binary)[3:]  # the flags, without the watchdog
    proc = subprocess.Popen([binary, *argv], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "offloaded" in line:
                assert f"offloaded {min(spec.gpu_layers, read_shape(model_path).n_layer + 1)}/" in line
                break
        else:
            pytest.fail("llama-server exited without reporting its offload")
    finally:
        proc.kill()
        proc.wait()


def test_a_vision_model_starts_with_its_projector(tmp_path: Path, model_path: Path) -> None:
    """A model pulled with an mmproj companion runs with --mmproj, on both lanes."""
    from actors.engines.llamacpp_host import build_params, parse_args

    store = Store(tmp_path / "models")
    record = store.import_file(model_path, "smol")
    record = msgspec.structs.replace(record, projector=str(tmp_path / "mmproj.gguf"))
    spec = launch_spec_for(_config(tmp_path, ""), store, record)
    assert spec.projector == record.projector
    argv = build_argv(spec, port=1, api_key="k", binary=None)
    assert argv[argv.index("--mmproj") + 1] == record.projector
    params = build_params(parse_args(argv[3:]))  # the xllamacpp host maps it onto llama.cpp's params
    assert params.mmproj.path == record.projector
