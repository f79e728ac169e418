"""llama.cpp's RPC backend for real: ``blazar rpc-worker`` runs ``rpc-server`` (supervised:
a crash is followed by a restart, and an address other than loopback is refused unless the
operator says they know it is unauthenticated), and a daemon whose model lists two workers
splits it over them and this machine, answering the official ``openai`` client token for
token as the model does on one machine (flash attention off on both), and showing the split
in ``/api/capacity``. A worker killed mid-answer ends the answer with an error naming it,
in the caller's dialect; the model comes back with it, or without it (``rpc_fallback``); and
``rpc-server`` never outlives ``blazar rpc-worker``, even after ``kill -9``.

What it needs, each test skipping with the reason elsewhere:

* ``rpc-server``: the one ``make rpc-server`` builds (``scripts/build_rpc_server.py``, from
  the sources of the installed xllamacpp, cached under ``~/.cache/blazar/rpc-server/``), or
  ``rpc-server``/``ggml-rpc-server`` on ``PATH``, or its path in ``BLAZAR_RPC_SERVER``;
* for the split: the RPC backend module ``make rpc-server`` builds beside it, which the
  xllamacpp wheel's host loads (the wheel has none of its own); or a ``llama-server`` built
  with ``-DGGML_RPC=ON`` in ``BLAZAR_LLAMA_SERVER`` or on ``PATH`` (``BLAZAR_TEST_LLAMA_ARGS``:
  extra flags for it, e.g. ``--no-repack`` where a native build's AMX weight repacking
  crashes under a hypervisor that does not grant AMX)."""

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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from actors.engines.llamacpp import rpc_problem
from actors.engines.rpc_backend import cached_server
from actors.rpc import NAMES, UNAUTHENTICATED_FLAG
from tests.support import (
    MODEL,
    DaemonProc,
    descendants,
    ensure_model,
    free_port,
    home_env,
    make_home,
    pid_alive,
    start_daemon,
    wait_gone,
    wait_until,
)

pytestmark = pytest.mark.slow


def _rpc_server() -> str:
    found = (
        os.environ.get("BLAZAR_RPC_SERVER")
        or next((path for name in NAMES if (path := shutil.which(name))), None)
        or cached_server()
    )
    if not found:
        pytest.skip(
            "rpc-server is not built here: run `make rpc-server` (needs cmake and a C++ compiler), "
            "or put a llama.cpp rpc-server on PATH, or name it in BLAZAR_RPC_SERVER"
        )
    return found


def _llama_engine() -> str | None:
    """A ``llama-server`` with the RPC backend when one is named or on PATH (the lane takes
    it), else None: the xllamacpp wheel with the backend ``make rpc-server`` built for it."""
    found = os.environ.get("BLAZAR_LLAMA_SERVER") or shutil.which("llama-server")
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
        self.idle_mib = 0.0
        """The rpc-server's resident memory before an engine connects (``split_daemon``)."""
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


def test_another_address_is_refused_without_the_flag(tmp_path: Path) -> None:
    """Checked before anything else (no rpc-server is needed to be refused): rpc-server has no
    authentication, so binding it beyond loopback takes the operator's explicit word."""
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    for host in ("0.0.0.0", "10.0.0.2", "::"):
        argv = [sys.executable, "-m", "blazar", "rpc-worker", "--host", host, "--port", str(port)]
        done = subprocess.run(argv, env=home_env(home), capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, done.stderr
        assert "refusing to bind rpc-server" in done.stderr and UNAUTHENTICATED_FLAG in done.stderr
    assert not _listening(port)


def test_a_worker_on_another_address_with_the_flag_is_told_it_has_no_authentication(
    worker_home: Path,
) -> None:
    port = free_port()
    worker = Worker(worker_home, port, "--host", "0.0.0.0", UNAUTHENTICATED_FLAG)
    try:
        _wait(lambda: "no authentication" in worker.output, 15, "the warning")
        assert "trusted network" in worker.output
        _wait(lambda: _listening(port), 30, f"rpc-server on port {port}")
    finally:
        worker.stop()


def test_without_rpc_server_the_verb_says_how_to_build_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # nothing configured, nothing on PATH, nothing built by `make rpc-server`
    env = home_env(home) | {"PATH": "/nonexistent", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "blazar", "rpc-worker"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "no llama.cpp rpc-server found" in done.stderr and "-DGGML_RPC=ON" in done.stderr
    assert "make rpc-server" in done.stderr


PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Explain in detail how a refrigerator keeps food cold, step by step."}
]


EXACT = 1e-4
"""Nats: how far a token's log-probability on the split may stray from one machine's. With
flash attention off both compute every operation with the same ggml kernels, and the
log-probabilities came out identical (docs/federation.md, "Token for token")."""
Token = tuple[str, float, float]
"""A token of an answer: its text, its log-probability, and the margin to the runner-up."""


def _answer(daemon: DaemonProc) -> list[Token]:
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="none", timeout=300)
    reply = client.chat.completions.create(
        model=MODEL, messages=PROMPT, max_tokens=48, temperature=0, seed=1, logprobs=True, top_logprobs=2
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    return [(t.token, t.logprob, t.logprob - t.top_logprobs[1].logprob) for t in logprobs.content]


def _engine_config(llama_server: str | None) -> str:
    if llama_server is None:
        return "[engine]\nstart_timeout_s = 300\n"
    return f'[engine]\nllama_server = "{llama_server}"\nstart_timeout_s = 300\n'


def _model_table(extra: str = "") -> str:
    """The model's table, on one machine and split alike. Flash attention off: with it, the
    workers' attention differs from the engine's own in the last bits (docs/federation.md)."""
    args = json.dumps(os.environ.get("BLAZAR_TEST_LLAMA_ARGS", "").split())
    table = f'[models."{MODEL}"]\nctx = 2048\nslots = 1\nflash_attn = "off"\nextra_args = {args}\n'
    return table + extra


@pytest.fixture
def single_answer(tmp_path: Path) -> list[Token]:
    """The model's answer on this machine alone, on the same engine."""
    config = _engine_config(_llama_engine()) + _model_table()
    daemon = start_daemon(make_home(tmp_path / "single", ensure_model(), config=config))
    try:
        return _answer(daemon)
    finally:
        daemon.stop()


@contextmanager
def _split(
    tmp_path: Path, worker_home: Path, extra: str = "", budget_mb: int = 200
) -> Iterator[tuple[DaemonProc, list[Worker]]]:
    engine = _engine_config(_llama_engine())
    workers = [Worker(worker_home, free_port()) for _ in range(2)]
    try:
        for worker in workers:
            _wait(lambda: _listening(worker.port), 30, f"rpc-server on port {worker.port}")  # noqa: B023
            worker.idle_mib = _rss_mib(worker.server_pid())
        # A budget below the model's whole footprint (about 250 MiB at this context): it can
        # run here only split, with the workers holding most of it.
        rpc = json.dumps([f"127.0.0.1:{w.port}" for w in workers])
        table = _model_table(f"rpc = {rpc}\nrpc_memory_mb = [4096, 2048]\n{extra}")
        config = f"memory_budget_mb = {budget_mb}\n" + engine + table
        daemon = start_daemon(make_home(tmp_path / "main", ensure_model(), config=config))
        try:
            yield daemon, workers
        finally:
            daemon.stop()
    finally:
        for worker in workers:
            worker.stop()


@pytest.fixture
def split_daemon(tmp_path: Path, worker_home: Path) -> Iterator[tuple[DaemonProc, list[Worker]]]:
    with _split(tmp_path, worker_home) as found:
        yield found


@pytest.fixture
def fallback_daemon(tmp_path: Path, worker_home: Path) -> Iterator[tuple[DaemonProc, list[Worker]]]:
    """As ``split_daemon``, the model allowed to run without a worker that does not answer,
    and a budget (150 MiB) this machine could not run it in alone (about 195 MiB)."""
    with _split(tmp_path, worker_home, 'rpc_fallback = "remaining"\n', budget_mb=150) as found:
        yield found


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_a_model_over_the_budget_runs_split_over_two_workers_and_answers_as_on_one_machine(
    single_answer: list[Token], split_daemon: tuple[DaemonProc, list[Worker]]
) -> None:
    daemon, workers = split_daemon
    plan = json.loads(daemon.cli("plan", MODEL, "--json").stdout)
    split = plan["rpc"]
    local, first, second = split["parts"]
    assert [first["name"], second["name"]] == [f"127.0.0.1:{w.port}" for w in workers]
    assert first["layers"] > second["layers"] > 0 and first["layers"] + second["layers"] > local["layers"]
    assert split["verdict"] == "fits" and plan["preview"]["refused"] is None
    assert plan["gpu_layers"] == split["gpu_layers"] > 0
    # Temperature 0: the same answer as on one machine, token for token (at least 24 of them),
    # and the same log-probabilities.
    split = _answer(daemon)
    tokens = ([t[0] for t in single_answer], [t[0] for t in split])
    assert tokens[0] == tokens[1] and len(tokens[0]) >= 24, tokens
    drift = [abs(a[1] - b[1]) for a, b in zip(single_answer, split, strict=True)]
    assert max(drift) < EXACT, drift
    for worker, part in zip(workers, (first, second), strict=True):
        assert "Accepted client connection" in worker.output  # the engine connected to it
        # and it holds its layers: more than 1 MiB each (2.2 MiB of weights, and their KV cache)
        grown = _rss_mib(worker.server_pid()) - worker.idle_mib
        assert grown > part["layers"], (grown, part)
    # /api/capacity shows the running split: each worker, what it offers and holds, its share
    shown = _capacity_split(daemon)
    assert [w["address"] for w in shown["workers"]] == [first["name"], second["name"]]
    for row, part in zip(shown["workers"], (first, second), strict=True):
        assert (row["layers"], row["output"], row["memory_bytes"]) == (
            part["layers"],
            part["output"],
            part["available"],
        )
        assert row["share"] == round((part["layers"] + part["output"]) / split_n(plan), 4)
    assert shown["local_layers"] == local["layers"] and shown["missing"] == []
    assert 0.5 < shown["share"] <= 1
    assert abs(shown["share"] - sum(w["share"] for w in shown["workers"])) < 0.001


def split_n(plan: dict[str, Any]) -> int:
    return int(plan["rpc"]["n_layers"])


def _capacity_split(daemon: DaemonProc) -> dict[str, Any]:
    models = httpx.get(f"{daemon.url}/api/capacity", timeout=30).json()["models"]
    (row,) = [m for m in models if m["model"] == MODEL]
    assert row["rpc"] is not None, row
    return dict(row["rpc"])


STORY = "Write a long story about a lighthouse keeper and the sea."
LONG: list[ChatCompletionMessageParam] = [{"role": "user", "content": STORY}]


def _openai_stream_until_cut(daemon: DaemonProc, kill: object) -> openai.APIError:
    """Streams a long answer and calls ``kill`` at its first token; returns the error the
    stream then ends with."""
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="none", timeout=120, max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=LONG,
        max_tokens=2000,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    killed = False
    try:
        for chunk in stream:
            if not killed and chunk.choices and chunk.choices[0].delta.content:
                kill()  # type: ignore[operator]
                killed = True
    except openai.APIError as exc:
        assert killed
        return exc
    raise AssertionError("the stream ended without an error")


def _asked(daemon: DaemonProc) -> str:
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="none", timeout=300, max_retries=0)
    reply = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=8, temperature=0)
    return reply.choices[0].message.content or ""


def test_a_worker_killed_mid_answer_is_named_and_the_model_comes_back_with_it(
    split_daemon: tuple[DaemonProc, list[Worker]],
) -> None:
    """``kill -9`` of one worker's rpc-server while the split model generates: llama.cpp
    cannot go on without a device, so the engine ends; the caller gets ENGINE_CRASHED naming
    the worker, in its dialect. ``blazar rpc-worker`` restarts the rpc-server, and the next
    request starts the engine over both workers again."""
    daemon, workers = split_daemon
    lost = workers[0]
    address = f"127.0.0.1:{lost.port}"
    error = _openai_stream_until_cut(daemon, lambda: os.kill(lost.server_pid(), signal.SIGKILL))
    body = error.body if isinstance(error.body, dict) else {}
    assert body.get("blazar_code") == "ENGINE_CRASHED", (error, body)
    assert f"its RPC worker {address} went away" in str(body.get("message")), body
    assert _asked(daemon)  # the worker is back (restarted by its verb): the model too
    assert lost.output.count("Accepted client connection") >= 2
    shown = _capacity_split(daemon)
    assert [w["address"] for w in shown["workers"]] == [f"127.0.0.1:{w.port}" for w in workers]


def test_with_rpc_fallback_a_lost_worker_is_left_out_and_a_model_too_large_alone_refused(
    fallback_daemon: tuple[DaemonProc, list[Worker]],
) -> None:
    """``rpc_fallback = "remaining"``: ``kill -9`` of a worker's ``blazar rpc-worker`` (its
    rpc-server dies with it) mid-answer ends the Anthropic stream with an error naming it; the
    next request runs on this machine and the other worker. With that one gone too (while
    idle), this machine alone cannot hold the model: refused, naming the worker."""
    daemon, (kept, lost) = fallback_daemon
    ant = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=120)
    server = lost.server_pid()
    killed = False
    with pytest.raises(anthropic.APIError) as error:
        with ant.messages.stream(
            model=MODEL, max_tokens=2000, messages=[{"role": "user", "content": STORY}]
        ) as stream:
            for event in stream:
                if not killed and event.type == "content_block_delta":
                    lost.proc.kill()
                    killed = True
    assert killed
    body = error.value.body if isinstance(error.value.body, dict) else {}
    assert body.get("blazar_code") == "ENGINE_CRASHED", (error.value, body)
    assert f"its RPC worker 127.0.0.1:{lost.port} went away" in json.dumps(body), body
    assert not wait_gone([server], 10), "rpc-server outlived its blazar rpc-worker (kill -9)"

    assert _asked(daemon)  # without the lost worker
    shown = _capacity_split(daemon)
    assert [w["address"] for w in shown["workers"]] == [f"127.0.0.1:{kept.port}"]
    assert shown["missing"] == [f"127.0.0.1:{lost.port}"]

    engine_pid = next(e["pid"] for e in daemon.engines() if e["model"] == MODEL)
    kept.proc.kill()  # idle: the engine notices its worker gone and ends at once
    assert not wait_gone([int(str(engine_pid))], 15), "the engine outlived its only worker"
    # The process is gone before the daemon has taken in its exit: a request in between
    # meets the crash itself (502 ENGINE_CRASHED), not the refusal of the next start.
    wait_until(
        lambda: all(e.get("pid") != engine_pid for e in daemon.engines() if e["model"] == MODEL),
        15,
        "the daemon still shows the engine that ended",
    )
    with pytest.raises(anthropic.APIStatusError) as refused:
        ant.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert refused.value.status_code == 503
    answer = json.dumps(refused.value.body)
    assert "RPC_WORKER_UNAVAILABLE" in answer and f"127.0.0.1:{kept.port}" in answer, answer


def test_rpc_server_never_outlives_the_worker_verb_even_after_kill_9(worker_home: Path) -> None:
    port = free_port()
    worker = Worker(worker_home, port)
    try:
        _wait(lambda: _listening(port), 30, f"rpc-server on port {port}")
        tree = descendants(worker.proc.pid)  # the watchdog and rpc-server under it
        assert worker.server_pid() in tree
        worker.proc.kill()
        worker.proc.wait()
        assert not wait_gone(tree, 10), [p for p in tree if pid_alive(p)]
        assert not _listening(port)
    finally:
        worker.stop()
