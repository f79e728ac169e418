"""EngineActor with the real llama.cpp host (and a fake binary for the binary lane)."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from actors.config import EngineConfig
from actors.engine import EngineActor, EngineHandle, EngineState, EnsureReady, StopEngine
from actors.engines.llamacpp import LaunchSpec, build_argv
from actors.errors import EngineCircuitOpen, EngineCrashed, EngineStartTimeout
from tests.support import pid_alive, wait_gone

pytestmark = pytest.mark.slow


def spec_for(path: Path, *, slots: int = 2, ctx: int = 512) -> LaunchSpec:
    return LaunchSpec(model="smollm2-135m", path=str(path), ctx_per_slot=ctx, slots=slots)


async def test_start_use_crash_restart_stop(model_path: Path, tmp_path: Path) -> None:
    engine = EngineActor(spec_for(model_path), EngineConfig(), run_dir=tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with trio.fail_after(60):
            handle: EngineHandle = await engine.ask(EnsureReady())
            assert engine.state is EngineState.READY
            assert (tmp_path / "engines" / "smollm2-135m.pid").exists()
            slots = (await handle.client.get("/slots")).json()
            assert len(slots) == 2 and slots[0]["n_ctx"] == 512  # -c is the total over the slots
            models = (await handle.client.get("/v1/models")).json()
            assert models["data"][0]["id"] == "smollm2-135m"  # --alias
            # Without the key the child refuses requests: each child has its own.
            async with httpx.AsyncClient(base_url=handle.base_url) as anon:
                assert (await anon.get("/v1/models")).status_code == 401

            ready = engine.statistics()
            assert ready.lane == "llama.cpp" and (ready.version or "").startswith("xllamacpp ")
            assert ready.breaker == "closed" and ready.breaker_retry_after_s is None

            first_pid = handle.pid
            os.kill(first_pid, signal.SIGKILL)
            while engine.state is not EngineState.FAILED:  # noqa: ASYNC110 - polls another actor's state
                await trio.sleep(0.02)
            stats = engine.statistics()
            assert stats.crashes == 1 and "-9" in (stats.last_error or "")

            handle = await engine.ask(EnsureReady())
            assert handle.pid != first_pid and engine.restarts == 1 and handle.generation == 2

            await engine.ask(StopEngine())
            assert engine.state is EngineState.STOPPED
            assert wait_gone([handle.pid]) == []
            handle = await engine.ask(EnsureReady())  # lazily started again on demand
        nursery.cancel_scope.cancel()
    assert wait_gone([handle.pid]) == []
    assert not (tmp_path / "engines" / "smollm2-135m.pid").exists()


def wait_ended(pid: int) -> None:
    """Block (no checkpoint: nothing else in the trio run goes on) until our child ``pid``
    can be reaped, without reaping it. Not its ``Z`` state in /proc: a killed process whose
    other threads are still exiting shows it before ``waitpid`` can take it."""
    deadline = time.monotonic() + 10
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline, f"pid {pid} did not end"
        time.sleep(0.01)


async def test_a_child_dead_before_its_exit_is_taken_in_is_started_again_not_handed_out(
    model_path: Path, tmp_path: Path
) -> None:
    """A request right after the engine died while idle (a kill -9, the OOM killer) gets a
    new child, not the dead one and a crash it did not meet."""
    engine = EngineActor(spec_for(model_path), EngineConfig(), run_dir=tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with trio.fail_after(60):
            first: EngineHandle = await engine.ask(EnsureReady())
            os.kill(first.pid, signal.SIGKILL)
            wait_ended(first.pid)
            # No checkpoint since the kill: the actor has not heard of it.
            assert engine.state is EngineState.READY and engine.exited_unnoticed()
            assert engine.ready_handle() is None  # the fast path does not hand it out
            second: EngineHandle = await engine.ask(EnsureReady())
            assert second.pid != first.pid and second.generation == first.generation + 1
            assert engine.state is EngineState.READY and not engine.exited_unnoticed()
            assert engine.statistics().crashes == 1  # counted once, for the breaker
            await trio.sleep(0.2)  # the exit's own message, when it comes, finds its generation gone
            assert engine.ready_handle() is second and engine.statistics().crashes == 1
        nursery.cancel_scope.cancel()
    assert wait_gone([second.pid]) == []


async def test_concurrent_asks_share_one_start(model_path: Path, tmp_path: Path) -> None:
    engine = EngineActor(spec_for(model_path), EngineConfig(), run_dir=tmp_path)
    handles: list[EngineHandle] = []

    async def ask() -> None:
        handles.append(await engine.ask(EnsureReady()))

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with trio.fail_after(60):
            async with trio.open_nursery() as askers:
                for _ in range(5):
                    askers.start_soon(ask)
        assert len({h.pid for h in handles}) == 1 and engine.generation == 1
        nursery.cancel_scope.cancel()


async def test_bad_model_file_fails_with_stderr_then_opens_breaker(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"GGUF" + b"\0" * 64)
    config = EngineConfig(breaker_crashes=2, breaker_window_s=60)
    engine = EngineActor(spec_for(bogus), config, run_dir=tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with trio.fail_after(60):
            for _ in range(2):
                with pytest.raises(EngineCrashed) as info:
                    await engine.ask(EnsureReady())
                # The child's own words are the operator's (stderr_tail), not the message a
                # client is sent, which names the model and where to look.
                assert "llama.cpp could not start with model" in info.value.stderr_tail
                assert "blazar logs" in info.value.message and str(bogus) not in info.value.message
            assert engine.state is EngineState.FAILED
            with pytest.raises(EngineCircuitOpen):
                await engine.ask(EnsureReady())
            stats = engine.statistics()
            assert stats.breaker == "open" and 0 < (stats.breaker_retry_after_s or 0) <= 60
            assert "could not start with model" in stats.stderr_tail  # the last child's, kept
        nursery.cancel_scope.cancel()


def _fake_binary(tmp_path: Path) -> Path:
    """A 'llama-server' that never becomes healthy and ignores TERM."""
    script = tmp_path / "llama-server"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(os.environ['FAKE_PID_FILE'], 'w').write(str(os.getpid()))\n"
        "print('loading forever', file=sys.stderr, flush=True)\n"
        "time.sleep(600)\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


async def test_binary_lane_start_timeout_and_watchdog(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = _fake_binary(tmp_path)
    pid_file = tmp_path / "fake.pid"
    monkeypatch.setenv("FAKE_PID_FILE", str(pid_file))
    config = EngineConfig(llama_server=str(binary), start_timeout_s=1.0, stop_grace_s=0.5)
    engine = EngineActor(spec_for(model_path), config, run_dir=tmp_path)
    assert engine.engine_kind == "llama-server"
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with trio.fail_after(30):
            with pytest.raises(EngineStartTimeout) as info:
                await engine.ask(EnsureReady())
        assert "not healthy within 1 s" in info.value.message
        nursery.cancel_scope.cancel()
    fake_pid = int(pid_file.read_text())
    assert wait_gone([fake_pid]) == [], "the watchdog must take the binary down with it"


def test_argv_maps_the_defaults() -> None:
    spec = LaunchSpec(model="m", path="/x.gguf", ctx_per_slot=4096, slots=4, embeddings=True)
    argv = build_argv(spec, port=1234, api_key="k", binary=None)
    assert argv[:3] == [sys.executable, "-m", "actors.engines.llamacpp_host"]
    flags = argv[3:]
    assert flags[flags.index("-c") + 1] == "16384" and flags[flags.index("-np") + 1] == "4"
    assert flags[flags.index("--alias") + 1] == "m" and flags[flags.index("--api-key") + 1] == "k"
    assert "--embeddings" in flags and flags[flags.index("--pooling") + 1] == "mean"
    binary_argv = build_argv(spec, port=1, api_key="k", binary="/opt/llama-server")
    assert binary_argv[1:4] == ["-m", "actors.engines.watchdog", "/opt/llama-server"]


def test_host_accepts_llama_server_flags() -> None:
    from actors.engines.llamacpp_host import build_params, parse_args

    flags = (
        "-m /x.gguf -c 2048 -np 2 --port 9 --api-key k --alias m --embeddings -ngl 0 -ctk q8_0 -t 2 --metrics"
    )
    ns = parse_args(flags.split())
    p = build_params(ns)
    assert (p.n_ctx, p.n_parallel, p.port, p.n_gpu_layers) == (2048, 2, 9, 0)
    assert p.api_keys == ["k"] and p.model_alias == {"m"} and p.embedding and p.endpoint_metrics
    assert p.cpuparams.n_threads == 2 and p.cpuparams_batch.n_threads == 2  # -tb follows -t


def test_idle_sleep_reaches_the_engine_as_llama_servers_flag() -> None:
    from actors.engines.llamacpp_host import build_params, parse_args

    spec = LaunchSpec(model="m", path="/x.gguf", ctx_per_slot=512, slots=1, idle_sleep_s=30)
    flags = build_argv(spec, port=1, api_key="k", binary=None)[3:]
    assert flags[flags.index("--sleep-idle-seconds") + 1] == "30"
    assert "--sleep-idle-seconds" not in build_argv(
        LaunchSpec(model="m", path="/x.gguf", ctx_per_slot=512, slots=1), port=1, api_key="k", binary=None
    )
    assert build_params(parse_args(flags)).sleep_idle_seconds == 30


def test_host_reads_llama_servers_thread_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from actors.engines.llamacpp_host import build_params, parse_args

    monkeypatch.setenv("LLAMA_ARG_THREADS", "1")
    p = build_params(parse_args(["-m", "/x.gguf"]))
    assert (p.cpuparams.n_threads, p.cpuparams_batch.n_threads) == (1, 1)
    p = build_params(parse_args(["-m", "/x.gguf", "-t", "3"]))  # the flag wins, as in llama-server
    assert (p.cpuparams.n_threads, p.cpuparams_batch.n_threads) == (3, 3)
    monkeypatch.setenv("LLAMA_ARG_THREADS_BATCH", "2")
    p = build_params(parse_args(["-m", "/x.gguf"]))
    assert (p.cpuparams.n_threads, p.cpuparams_batch.n_threads) == (1, 2)
    monkeypatch.delenv("LLAMA_ARG_THREADS")
    monkeypatch.delenv("LLAMA_ARG_THREADS_BATCH")
    p = build_params(parse_args(["-m", "/x.gguf"]))
    assert (p.cpuparams.n_threads, p.cpuparams_batch.n_threads) == (-1, -1)  # llama.cpp decides


def test_pid_alive_helper() -> None:
    assert pid_alive(os.getpid())


@pytest.mark.parametrize("how", ["stop-engine", "actor-stops"])
async def test_a_stop_during_the_start_leaves_no_child(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    binary = _fake_binary(tmp_path)
    pid_file = tmp_path / "fake.pid"
    monkeypatch.setenv("FAKE_PID_FILE", str(pid_file))
    config = EngineConfig(llama_server=str(binary), start_timeout_s=60.0, stop_grace_s=0.5)
    engine = EngineActor(spec_for(model_path), config, run_dir=tmp_path)
    failures: list[Exception] = []

    async def ask() -> None:
        try:
            await engine.ask(EnsureReady())
        except Exception as exc:
            failures.append(exc)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            nursery.start_soon(ask)
            while not pid_file.exists() or engine.statistics().pid is None:  # noqa: ASYNC110 - a file and another actor
                await trio.sleep(0.02)
            assert engine.state is EngineState.STARTING  # the launch reported its child
            if how == "stop-engine":
                await engine.ask(StopEngine())
                assert engine.state is EngineState.STOPPED and engine.statistics().pid is None
                assert wait_gone([int(pid_file.read_text())]) == []
                await trio.sleep(0.1)
                assert [type(e).__name__ for e in failures] == ["EngineUnavailable"]
            nursery.cancel_scope.cancel()
    assert wait_gone([int(pid_file.read_text())]) == []
