"""llama.cpp's RPC backend as a lane option: ``[models."NAME"] rpc`` reaches the engine's argv
as ``--rpc`` with the split's ``--tensor-split`` and ``-ngl``, ``blazar explain`` names where
each came from, a lane without RPC support refuses the model (it must not start on one
machine as if the workers were not there), and the config is checked strictly."""

from __future__ import annotations

import ctypes
import dataclasses
import sys
from pathlib import Path

import msgspec
import pytest
import trio

from actors.config import EngineConfig, ModelOverride, RuntimeConfig
from actors.engines import llamacpp, llamacpp_host, rpc_backend, vllm
from actors.engines.lane import Lane
from actors.engines.spec import LaunchSpec
from actors.errors import UnsupportedEngine
from actors.rpc import WorkerOptions, is_loopback, run_worker, worker_argv, workers_of
from actors.settings import RPC_ALL_LAYERS, Resolved, resolve_launch
from blazar.config import ConfigError, load_config, resolve_paths
from registry.fit import Memory
from registry.gguf import ModelInfo
from registry.split import Part, RpcSplit
from registry.store import ModelFile, ModelRecord

NAME = "big-model"
WORKERS = ["10.0.0.2:50052", "10.0.0.3:50052"]


def _gguf_record() -> ModelRecord:
    return ModelRecord(name=NAME, digest="sha256:" + "0" * 64, size=1, path=f"/m/{NAME}.gguf", source="t",
                       created_at=0, modified_at=0)  # fmt: skip


def _info() -> ModelInfo:
    return ModelInfo(
        architecture="llama", parameter_count=1, context_length=8192, tensor_count=0, data_offset=0
    )


def _split() -> RpcSplit:
    def part(name: str, layers: int, first: int) -> Part:
        kind = "local" if name == "local" else "worker"
        return Part(name=name, kind=kind, layers=layers, first_layer=first, output=name == "local",
                    bytes=1, available=2, headroom=1)  # fmt: skip

    parts = [part("local", 10, 0), part(WORKERS[0], 12, 10), part(WORKERS[1], 10, 22)]
    return RpcSplit(verdict="fits", parts=parts, gpu_layers=22, tensor_split=[12, 10], n_layers=33, total=3)


def _config(over: ModelOverride) -> RuntimeConfig:
    config = RuntimeConfig.in_home("/h")
    return msgspec.structs.replace(config, models={NAME: over})


def _rpc_lane(binary: str = "/opt/llama/llama-server") -> Lane:
    """The llama.cpp lane on a llama-server whose RPC support was established (the probe itself
    is exercised against real builds: the wheel below, a built llama-server in the e2e test)."""
    return dataclasses.replace(llamacpp.lane(EngineConfig(llama_server=binary)), rpc_problem=lambda: None)


def _resolve(over: ModelOverride, lane: Lane, split: RpcSplit | None = None, **kw: object) -> Resolved:
    asked: list[tuple[int, int]] = []

    def plan(ctx: int, slots: int) -> RpcSplit | None:
        asked.append((ctx, slots))
        return split

    resolved = resolve_launch(_config(over), _gguf_record(), _info(), lanes={"llamacpp": lane},
                              plan_gpu_layers=lambda ctx, slots: None, plan_rpc=plan, **kw)  # type: ignore[arg-type]  # fmt: skip
    if over.rpc and resolved.refusal is None and resolved.spec.lane == "llamacpp":
        assert asked == [(resolved.spec.ctx_per_slot, resolved.spec.slots)]
    return resolved


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_workers_and_the_split_reach_llama_server() -> None:
    lane = _rpc_lane()
    r = _resolve(ModelOverride(rpc=WORKERS, rpc_memory_mb=[8192, 6144]), lane, _split())
    assert r.spec.rpc == WORKERS and r.spec.tensor_split == [12, 10] and r.spec.gpu_layers == 22
    assert r.rpc_split == _split()
    argv = lane.argv(r.spec, 8080, "k")
    assert argv[3] == "/opt/llama/llama-server"  # under the watchdog
    assert _flag(argv, "--rpc") == "10.0.0.2:50052,10.0.0.3:50052"
    assert _flag(argv, "--tensor-split") == "12,10"
    assert _flag(argv, "-ngl") == "22"
    by = {s.name: s for s in r.settings}
    assert (by["rpc"].value, by["rpc"].source, by["rpc"].key) == (WORKERS, "override", f'models."{NAME}".rpc')
    assert (by["rpc_memory_mb"].value, by["rpc_memory_mb"].source) == ([8192, 6144], "override")
    assert (by["tensor_split"].value, by["tensor_split"].source) == ([12, 10], "derived")
    assert (by["gpu_layers"].value, by["gpu_layers"].source) == (22, "derived")


def test_without_a_plan_every_layer_goes_to_the_devices_and_an_override_wins() -> None:
    lane = _rpc_lane()
    r = _resolve(ModelOverride(rpc=WORKERS[:1]), lane, None)
    argv = lane.argv(r.spec, 8080, "k")
    assert _flag(argv, "-ngl") == str(RPC_ALL_LAYERS) and "--tensor-split" not in argv
    assert _flag(argv, "--rpc") == WORKERS[0]
    by = {s.name: s for s in r.settings}
    assert by["rpc_memory_mb"].source == "default" and by["tensor_split"].value is None
    r = _resolve(ModelOverride(rpc=WORKERS, gpu_layers=7), lane, _split())
    assert _flag(lane.argv(r.spec, 8080, "k"), "-ngl") == "7"


def test_a_model_without_workers_gets_no_rpc_flags() -> None:
    lane = _rpc_lane()
    r = _resolve(ModelOverride(), lane)
    argv = lane.argv(r.spec, 8080, "k")
    assert "--rpc" not in argv and "--tensor-split" not in argv
    assert "rpc" not in {s.name for s in r.settings}


def _wheel_lane() -> Lane:
    wheel = llamacpp.lane(EngineConfig())
    if wheel.binary is not None:
        pytest.skip(f"a llama-server is on PATH ({wheel.binary}): the wheel lane is not the one taken")
    return wheel


def test_the_wheel_has_no_rpc_backend_of_its_own_and_the_lane_says_what_to_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import xllamacpp

    library = ctypes.CDLL(str(next(Path(xllamacpp.__file__).parent.glob("xllamacpp*.so"))))
    library.llama_supports_rpc.restype = ctypes.c_bool
    assert library.llama_supports_rpc() is False  # built without GGML_RPC…
    assert library.ggml_backend_load and library.ggml_backend_register  # …but its registry is open
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there
    wheel = _wheel_lane()
    problem = wheel.rpc_problem()
    assert problem is not None and "make rpc-server" in problem
    assert "blazar/rpc-server/xllamacpp-" in problem and str(tmp_path) not in problem  # no local path
    with pytest.raises(UnsupportedEngine, match="RPC backend for xllamacpp") as caught:
        _resolve(ModelOverride(rpc=WORKERS), wheel)
    assert f'models."{NAME}".rpc' in str(caught.value)
    plan = _resolve(ModelOverride(rpc=WORKERS), wheel, unrouted=True)  # a plan shows it refused
    assert plan.refusal is not None and "make rpc-server" in plan.refusal


def test_with_the_backend_built_the_wheel_lane_passes_the_split_to_its_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    version = rpc_backend.wheel_version()
    assert version is not None
    module = rpc_backend.build_dir(version) / rpc_backend.MODULE
    module.parent.mkdir(parents=True)
    module.write_bytes(b"")
    wheel = _wheel_lane()
    assert wheel.rpc_problem() is None
    r = _resolve(ModelOverride(rpc=WORKERS, rpc_memory_mb=[8192, 6144]), wheel, _split())
    argv = wheel.argv(r.spec, 8080, "k")
    assert argv[1:3] == ["-m", "actors.engines.llamacpp_host"]
    assert _flag(argv, "--rpc") == ",".join(WORKERS) and _flag(argv, "--tensor-split") == "12,10"
    assert _flag(argv, "-ngl") == "22"  # the wheel gets -ngl only with workers (its CPU is no device)
    host_ns = llamacpp_host.parse_args(argv[3:])
    params = llamacpp_host.build_params(host_ns)
    assert params.n_gpu_layers == 22 and list(params.tensor_split[:3]) == [12.0, 10.0, 0.0]
    alone = LaunchSpec(model="m", path="/m.gguf", ctx_per_slot=1024, slots=1, gpu_layers=5)
    assert "-ngl" not in llamacpp.build_argv(alone, port=1, api_key="k", binary=None)


def test_a_worker_that_does_not_answer_is_named_before_llama_cpp_is_asked(tmp_path: Path) -> None:
    with pytest.raises(rpc_backend.RpcAttachError, match=r"cannot reach the RPC worker 127\.0\.0\.1:9"):
        rpc_backend.attach(["127.0.0.1:9"], "/nonexistent.so", tmp_path / "libggml-rpc.so", timeout_s=2)


def test_a_binary_that_cannot_run_is_not_taken_for_an_rpc_build(tmp_path: Path) -> None:
    missing = str(tmp_path / "llama-server")
    problem = llamacpp.rpc_problem(missing)
    assert problem is not None and "does not answer --version as llama-server does" in problem


def test_a_lane_that_does_not_read_rpc_shows_it_unused() -> None:
    file = ModelFile(name="config.json", digest="sha256:" + "1" * 64, size=1)
    record = msgspec.structs.replace(_gguf_record(), path=f"/m/{NAME}", files=[file], format="safetensors")
    lanes: dict[str, Lane | None] = {"llamacpp": _rpc_lane(), "vllm": vllm.lane(EngineConfig(), "/opt/vllm")}
    r = resolve_launch(_config(ModelOverride(rpc=WORKERS)), record, _info(), lanes=lanes,
                       plan_gpu_layers=lambda ctx, slots: None)  # fmt: skip
    assert r.spec.lane == "vllm" and r.spec.rpc == []
    by = {s.name: s for s in r.settings}
    assert by["rpc"].note == "unused: the vllm lane does not read it"


def test_the_llamacpp_argv_pins_the_flags_of_a_split() -> None:
    spec = LaunchSpec(model="m", path="/m.gguf", ctx_per_slot=1024, slots=2, rpc=["a:1", "[::1]:2"],
                      tensor_split=[5, 3, 1], gpu_layers=9)  # fmt: skip
    argv = llamacpp.build_argv(spec, port=1, api_key="k", binary="/bin/llama-server")
    tail = argv[argv.index("--rpc") :]
    assert tail[:6] == ["--rpc", "a:1,[::1]:2", "--tensor-split", "5,3,1", "-ngl", "9"]


def test_workers_offer_their_configured_memory_or_this_machines() -> None:
    memory = Memory(ram_available=5 << 30)
    sized = workers_of(ModelOverride(rpc=WORKERS, rpc_memory_mb=[1024, 2048]), memory)
    assert [(w.address, w.memory) for w in sized] == [(WORKERS[0], 1 << 30), (WORKERS[1], 2 << 30)]
    assert [w.memory for w in workers_of(ModelOverride(rpc=WORKERS), memory)] == [5 << 30, 5 << 30]


def test_the_worker_command_line() -> None:
    argv = worker_argv("/opt/rpc-server", WorkerOptions(), mem_flag=False)
    assert argv[1:4] == ["-m", "actors.engines.watchdog", "/opt/rpc-server"]
    assert argv[4:] == ["--host", "127.0.0.1", "--port", "50052"]
    full = WorkerOptions(host="10.0.0.2", port=6000, mem_mb=4096, threads=8, device="CUDA0", cache=True)
    assert worker_argv("/opt/rpc-server", full, mem_flag=True)[4:] == [
        "--host", "10.0.0.2", "--port", "6000", "--mem", "4096",
        "--threads", "8", "--device", "CUDA0", "--cache",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="has no --mem"):
        worker_argv("/opt/rpc-server", WorkerOptions(mem_mb=4096), mem_flag=False)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.2") and not is_loopback("gpu-box")


def _load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> object:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text(text)
    return load_config(resolve_paths())


def test_the_config_takes_workers_and_refuses_bad_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _load(tmp_path, monkeypatch, f'[engine]\nrpc_server = "/opt/rpc-server"\n[models."{NAME}"]\n'
                   'rpc = ["10.0.0.2:50052", "[fd00::2]:50052"]\nrpc_memory_mb = [8192, 4096]\n')  # fmt: skip
    over = config.models[NAME]  # type: ignore[attr-defined]
    assert over.rpc == ["10.0.0.2:50052", "[fd00::2]:50052"] and over.rpc_memory_mb == [8192, 4096]
    assert config.engine.rpc_server == "/opt/rpc-server"  # type: ignore[attr-defined]
    for bad, said in (
        ('rpc = ["10.0.0.2"]', "matching regex"),
        ('rpc = ["a:1"]\nrpc_memory_mb = [1, 2]', "one per worker"),
        ("rpc_memory_mb = [1024]", "rpc_memory_mb goes with rpc"),
        ('rpc = ["a:1", "a:1"]', "more than once"),
        ("rpc = []", "length"),
        ('rpc_workers = ["a:1"]', "unknown field"),
    ):
        with pytest.raises(ConfigError, match=said):
            _load(tmp_path, monkeypatch, f'[models."{NAME}"]\n{bad}\n')


async def test_the_worker_is_restarted_after_a_crash_and_given_up_on_after_too_many(tmp_path: Path) -> None:
    """``run_worker``'s supervision on a real child process: a crashing child is started again
    with a doubling wait until it crashes more than ``max_restarts`` times in the window; one
    that exits cleanly is not restarted."""
    runs = tmp_path / "runs"
    crash = [sys.executable, "-c", f"open({str(runs)!r}, 'a').write('x'); raise SystemExit(3)", "x"]
    said: list[str] = []
    with trio.fail_after(60):
        code = await run_worker(crash, say=said.append, max_restarts=2, backoff_s=0.01, backoff_max_s=0.02)
    assert code == 3 and runs.read_text() == "xxx"
    assert sum("restarting" in line for line in said) == 2 and "giving up" in said[-1]
    clean = [sys.executable, "-c", f"open({str(runs)!r}, 'a').write('y')", "x"]
    with trio.fail_after(60):
        assert await run_worker(clean, say=said.append) == 0
    assert runs.read_text() == "xxxy" and said[-1] == "rpc-server stopped"


def test_the_worker_a_crashed_split_engine_lost_is_read_from_its_last_lines() -> None:
    from actors.rpc import describe_loss, lost_workers

    workers = ["10.0.0.2:50052", "10.0.0.3:50052"]
    named = "error: --rpc: the RPC worker 10.0.0.3:50052 went away (ggml-rpc.cpp:651: Remote RPC server …)"
    assert lost_workers(f"llamacpp_host: loading | {named}", workers) == ["10.0.0.3:50052"]
    assert describe_loss(["10.0.0.3:50052"], workers) == "its RPC worker 10.0.0.3:50052 went away"
    # a llama-server binary names none: any of them
    said = "ggml-rpc.cpp:651: Remote RPC server crashed or returned malformed response"
    assert lost_workers(said, workers) == workers
    assert describe_loss(workers, workers).startswith(f"one of its RPC workers ({', '.join(workers)})")
    assert lost_workers("Segmentation fault", workers) == [] and lost_workers(named, []) == []


def test_without_a_missing_worker_the_model_keeps_the_others_and_their_memory() -> None:
    from actors.rpc import without_workers

    over = ModelOverride(rpc=["a:1", "b:2", "c:3"], rpc_memory_mb=[100, 200, 300], rpc_fallback="remaining")
    config = without_workers(_config(over), NAME, ["b:2"])
    assert (config.models[NAME].rpc, config.models[NAME].rpc_memory_mb) == (["a:1", "c:3"], [100, 300])
    alone = without_workers(_config(over), NAME, ["a:1", "b:2", "c:3"]).models[NAME]
    assert (alone.rpc, alone.rpc_memory_mb, alone.rpc_fallback) == (None, None, None)
    with pytest.raises(msgspec.ValidationError, match="rpc_fallback goes with rpc"):
        msgspec.convert({"rpc_fallback": "remaining"}, ModelOverride)


def test_a_worker_whose_connection_closed_is_told_from_those_that_answer() -> None:
    """What the host's abort callback and watcher look at: its own sockets to each worker."""
    import socket

    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    workers = [f"127.0.0.1:{s.getsockname()[1]}" for s in listeners]
    clients = [socket.create_connection(s.getsockname()) for s in listeners]
    accepted = [s.accept()[0] for s in listeners]
    try:
        assert rpc_backend._lost(workers) == []
        accepted[1].close()  # the second worker's process went away
        assert rpc_backend._lost(workers) == [workers[1]]
        accepted[0].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        accepted[0].close()  # reset rather than closed
        assert rpc_backend._lost(workers) == workers
    finally:
        for s in [*listeners, *clients, *accepted]:
            s.close()
