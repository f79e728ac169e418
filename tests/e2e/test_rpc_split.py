"""llama.cpp's RPC backend for real: ``blazar rpc-worker`` runs ``rpc-server`` (supervised:
a crash is followed by a restart), and a daemon whose model lists that worker starts
``llama-server --rpc`` with the fit plan's split, so that a model larger than the daemon's
memory budget answers the official ``openai`` client with most of its layers on the worker.

It runs where the binaries exist:

* ``rpc-server`` (``ggml-rpc-server`` in newer llama.cpp) on ``PATH``, or its path in
  ``BLAZAR_RPC_SERVER``: the worker tests;
* also a ``llama-server`` built with RPC support on ``PATH``, or in ``BLAZAR_LLAMA_SERVER``:
  the split model test (``BLAZAR_TEST_LLAMA_ARGS``: extra flags for it, e.g. ``--no-repack``
  where a native build's AMX weight repacking crashes under a hypervisor that does not
  grant AMX).

Build both from llama.cpp with ``cmake -B build -DGGML_RPC=ON`` and ``cmake --build build
--target ggml-rpc-server llama-server``. Elsewhere each test skips with the reason (the
xllamacpp wheel, the lane used here otherwise, has no RPC backend)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from actors.engines.llamacpp import rpc_problem
from actors.rpc import NAMES
from tests.support import (
    MODEL,
    DaemonProc,
    descendants,
    ensure_model,
    free_port,
    home_env,
    make_home,
    start_daemon,
)

pytestmark = pytest.mark.slow


def _rpc_server() -> str:
    found = os.environ.get("BLAZAR_RPC_SERVER") or next(
        (path for name in NAMES if (path := shutil.which(name))), None
    )
    if not found:
        pytest.skip(
            "rpc-server is not installed here: build llama.cpp with -DGGML_RPC=ON (target "
            "ggml-rpc-server) and put it on PATH, or name it in BLAZAR_RPC_SERVER"
        )
    return found


def _llama_server_with_rpc() -> str:
    found = os.environ.get("BLAZAR_LLAMA_SERVER") or shutil.which("llama-server")
    if not found:
        pytest.skip(
            "no llama-server here (the xllamacpp wheel has no RPC backend): build llama.cpp's "
            "llama-server with -DGGML_RPC=ON and put it on PATH, or name it in BLAZAR_LLAMA_SERVER"
        )
    problem = rpc_problem(found)
    if problem:
        pytest.skip(problem)
    return found


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Worker:
    """``blazar rpc-worker`` as a user runs it, its output collected."""

    def __init__(self, home: Path, port: int, *extra: str) -> None:
        self.port = port
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "blazar", "rpc-worker", "--port", str(port), *extra],
            env=home_env(home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def server_pid(self) -> int:
        """The rpc-server process (under the watchdog, under the worker)."""
        found = [
            p for p in descendants(self.proc.pid) if "rpc-server" in Path(f"/proc/{p}/cmdline").read_text()
        ]
        binaries = [p for p in found if "watchdog" not in Path(f"/proc/{p}/cmdline").read_text()]
        assert binaries, f"no rpc-server under the worker: {self.output}"
        return binaries[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def worker_home(tmp_path: Path) -> Path:
    home = tmp_path / "worker"
    home.mkdir()
    (home / "config.toml").write_text(f'[engine]\nrpc_server = "{_rpc_server()}"\n')
    return home


def test_the_worker_serves_restarts_after_a_crash_and_stops_with_the_verb(worker_home: Path) -> None:
    port = free_port()
    worker = Worker(worker_home, port)
    try:
        _wait(lambda: _listening(port), 30, f"rpc-server on port {port}")
        assert "warning" not in worker.output  # loopback: no exposure warning
        assert f'rpc = ["127.0.0.1:{port}"]' in worker.output
        first = worker.server_pid()
        os.kill(first, signal.SIGKILL)
        _wait(lambda: "restarting" in worker.output, 15, "the crash to be noticed")
        _wait(lambda: _listening(port), 30, "rpc-server to come back")
        assert worker.server_pid() != first
    finally:
        worker.stop()
    assert worker.proc.returncode == 0
    _wait(lambda: not _listening(port), 10, "rpc-server to stop with the worker")


def test_a_worker_on_another_address_is_told_rpc_server_has_no_authentication(worker_home: Path) -> None:
    port = free_port()
    worker = Worker(worker_home, port, "--host", "0.0.0.0")
    try:
        _wait(lambda: "no authentication" in worker.output, 15, "the warning")
        assert "trusted network" in worker.output
    finally:
        worker.stop()


def test_without_rpc_server_the_verb_says_how_to_build_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = home_env(home) | {"PATH": "/nonexistent"}  # nothing configured, nothing on PATH
    argv = [sys.executable, "-m", "blazar", "rpc-worker"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "no llama.cpp rpc-server found" in done.stderr and "-DGGML_RPC=ON" in done.stderr


@pytest.fixture
def split_daemon(tmp_path: Path, worker_home: Path) -> Iterator[tuple[DaemonProc, Worker]]:
    llama_server = _llama_server_with_rpc()
    port = free_port()
    worker = Worker(worker_home, port)
    _wait(lambda: _listening(port), 30, f"rpc-server on port {port}")
    # A budget below the model's whole footprint (about 250 MiB at this context): it can run
    # here only split, with the worker holding most of it.
    config = f"""\
memory_budget_mb = 200
[engine]
llama_server = "{llama_server}"
start_timeout_s = 300
[models."{MODEL}"]
ctx = 2048
slots = 1
rpc = ["127.0.0.1:{port}"]
rpc_memory_mb = [4096]
extra_args = {json.dumps(os.environ.get("BLAZAR_TEST_LLAMA_ARGS", "").split())}
"""
    home = make_home(tmp_path / "main", ensure_model(), config=config)
    daemon = start_daemon(home)
    try:
        yield daemon, worker
    finally:
        daemon.stop()
        worker.stop()


def test_a_model_over_the_budget_runs_split_over_the_worker(split_daemon: tuple[DaemonProc, Worker]) -> None:
    daemon, worker = split_daemon
    plan = json.loads(daemon.cli("plan", MODEL, "--json").stdout)
    split = plan["rpc"]
    local, remote = split["parts"]
    assert remote["name"] == f"127.0.0.1:{worker.port}" and remote["layers"] > local["layers"]
    assert split["verdict"] == "fits" and plan["preview"]["refused"] is None
    assert plan["gpu_layers"] == split["gpu_layers"] > 0
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="none", timeout=300)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content
    assert "Accepted client connection" in worker.output  # the engine connected to the worker
