"""llama.cpp's RPC backend: the worker side (``rpc-server``) and the split of a model.

A model too large for one machine runs on the main engine with ``--rpc host:port,…``:
each worker's ``rpc-server`` becomes one of the engine's devices and holds the layers
the split gives it. ``blazar rpc-worker`` runs the worker side (``run_worker``); the
split is planned from the model's header against this machine's memory and what each
worker advertises (``plan_split``).

``rpc-server`` has no authentication and no encryption: whoever reaches its port can
make it allocate memory and run computations. ``blazar rpc-worker`` binds it to loopback
and refuses any other address unless told ``--i-know-rpc-is-unauthenticated``: it must only
be exposed on a trusted network.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import trio

from actors.addresses import is_loopback
from actors.census import take_census
from actors.config import ModelOverride, RuntimeConfig
from actors.engines.rpc_backend import cached_server
from registry import fit
from registry.errors import RegistryError
from registry.shape import read_shape
from registry.split import RpcSplit, Worker, placed, split

__all__ = [
    "DEFAULT_PORT",
    "NOT_FOUND",
    "REFUSED_BIND",
    "UNAUTHENTICATED_FLAG",
    "UNSAFE_BIND",
    "WorkerOptions",
    "answering",
    "describe_loss",
    "find_rpc_server",
    "is_loopback",
    "lost_workers",
    "plan_split",
    "run_worker",
    "running_split",
    "takes_mem",
    "within_budget",
    "without_workers",
    "worker_argv",
    "workers_of",
]

DEFAULT_PORT = 50052
"""``rpc-server``'s own default port."""

NAMES = ("rpc-server", "ggml-rpc-server")
"""The binary's name: ``rpc-server`` in older llama.cpp releases, ``ggml-rpc-server`` since."""

NOT_FOUND = (
    "no llama.cpp rpc-server found (looked for [engine] rpc_server, then rpc-server and "
    "ggml-rpc-server on PATH, then the one `make rpc-server` builds into "
    "~/.cache/blazar/rpc-server/) — run `make rpc-server` in blazar's checkout (a CPU build from "
    "the sources of the installed xllamacpp), or build it from llama.cpp with `cmake -B build "
    "-DGGML_RPC=ON` and `cmake --build build --target ggml-rpc-server` (rpc-server in older "
    "releases; add -DGGML_CUDA=ON or your GPU's backend to serve a GPU), then put it on PATH or "
    "set [engine] rpc_server in config.toml"
)

UNAUTHENTICATED_FLAG = "--i-know-rpc-is-unauthenticated"

REFUSED_BIND = (
    "refusing to bind rpc-server to {address}: it has no authentication and no encryption, so "
    "anyone who can reach that address could allocate memory and run computations on this "
    "machine. On a trusted network only (a private LAN, a VPN, a firewall that admits the main "
    "machine alone), add " + UNAUTHENTICATED_FLAG
)

UNSAFE_BIND = (
    "rpc-server has no authentication and no encryption: anyone who can reach {address} can "
    "allocate memory and run computations on this machine. Expose it only on a trusted network "
    "(a private LAN, a VPN, a firewall that admits the main machine alone)."
)


def find_rpc_server(configured: str | None) -> str | None:
    """``[engine] rpc_server`` when set, else ``rpc-server`` or ``ggml-rpc-server`` on PATH,
    else the one ``make rpc-server`` built from the installed xllamacpp's sources (whose wire
    protocol is the wheel's own)."""
    if configured:
        return configured
    found = next((found for name in NAMES if (found := shutil.which(name))), None)
    return found or cached_server()


_mem_cache: dict[str, bool] = {}


def takes_mem(binary: str) -> bool:
    """Whether this ``rpc-server`` has ``--mem`` (older releases do; newer ones advertise the
    device's own memory). Read from its ``--help``; cached per binary."""
    if binary not in _mem_cache:
        try:
            done = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=20, check=False)
            _mem_cache[binary] = "--mem" in done.stdout + done.stderr
        except (OSError, subprocess.SubprocessError):
            _mem_cache[binary] = False
    return _mem_cache[binary]


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    mem_mb: int | None = None
    """Memory the worker offers, in MiB (``--mem``, where the binary has it)."""
    threads: int | None = None
    cache: bool = False
    """``--cache``: keep tensors the engine sends in a local file cache (faster reloads)."""
    device: str | None = None
    """The one ggml device to serve (``CUDA0``…); None: the binary's choice."""


def worker_argv(binary: str, options: WorkerOptions, *, mem_flag: bool) -> list[str]:
    """The ``rpc-server`` command line, run under the watchdog so that it dies with us.
    ``mem_flag``: the binary has ``--mem`` (``takes_mem``); asking for ``mem_mb`` of one that
    does not is a ``ValueError`` (it would be ignored)."""
    flags = ["--host", options.host, "--port", str(options.port)]
    if options.mem_mb is not None:
        if not mem_flag:
            raise ValueError(
                f"{binary} has no --mem (newer llama.cpp releases advertise the device's own memory): "
                "drop --mem, and set rpc_memory_mb for this worker in the main machine's config instead"
            )
        flags += ["--mem", str(options.mem_mb)]
    if options.threads:
        flags += ["--threads", str(options.threads)]
    if options.device:
        flags += ["--device", options.device]
    if options.cache:
        flags += ["--cache"]
    return [sys.executable, "-m", "actors.engines.watchdog", binary, *flags]


async def run_worker(
    argv: list[str],
    *,
    say: Callable[[str], None],
    max_restarts: int = 5,
    window_s: float = 60.0,
    backoff_s: float = 1.0,
    backoff_max_s: float = 30.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Run ``argv`` until it exits cleanly; restart it after a crash, with a backoff that
    doubles, and give up after ``max_restarts`` crashes within ``window_s``. Returns the
    last exit status (0: it stopped cleanly)."""
    crashes: list[float] = []
    delay = backoff_s
    started = False
    while True:
        say(f"starting {' '.join(argv[3:])}")
        process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE)
        if not started:
            task_status.started()
            started = True
        try:
            code = await process.wait()
        finally:
            if process.returncode is None:
                process.terminate()
                with trio.move_on_after(5, shield=True):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
        if code == 0:
            say("rpc-server stopped")
            return 0
        now = trio.current_time()
        crashes = [t for t in crashes if now - t < window_s] + [now]
        if len(crashes) > max_restarts:
            say(f"rpc-server exited with status {code} {len(crashes)} times within {window_s:g} s: giving up")
            return code
        say(f"rpc-server exited with status {code}; restarting in {delay:g} s")
        await trio.sleep(delay)
        delay = min(delay * 2, backoff_max_s)


def plan_split(config: RuntimeConfig, model: str, path: str, ctx: int, slots: int) -> RpcSplit | None:
    """The split of ``model`` (its GGUF at ``path``) over this machine and its ``rpc``
    workers, at ``ctx`` per slot and ``slots``; None when it has no workers or its header
    cannot be read. This machine offers its available RAM (or its GPUs), within
    ``memory_budget_mb`` when that is set; a worker without ``rpc_memory_mb`` is taken to
    offer what this machine has available (an even split between like machines)."""
    over = config.models.get(model)
    if over is None or not over.rpc:
        return None
    try:
        shape = read_shape(path)
    except (RegistryError, OSError, ValueError):
        return None
    memory = within_budget(take_census().memory(), config.memory_budget_mb)
    return split(shape, fit.Settings(ctx_per_slot=ctx, slots=slots), memory, workers_of(over, memory))


def running_split(
    config: RuntimeConfig,
    model: str,
    path: str,
    ctx: int,
    slots: int,
    *,
    rpc: list[str],
    tensor_split: list[int],
    gpu_layers: int | None,
) -> RpcSplit | None:
    """Where an engine started with ``--rpc`` (``rpc``, ``tensor_split``, ``gpu_layers``: its
    flags) holds ``model``'s layers, each part with the memory it was planned with; None
    when the header cannot be read (``/api/capacity``)."""
    over = config.models.get(model)
    if over is None or not over.rpc or not rpc:
        return None
    try:
        shape = read_shape(path)
    except (RegistryError, OSError, ValueError):
        return None
    memory = within_budget(take_census().memory(), config.memory_budget_mb)
    workers = [w for w in workers_of(over, memory) if w.address in rpc]
    settings = fit.Settings(ctx_per_slot=ctx, slots=slots)
    return placed(shape, settings, memory, workers, tensor_split, gpu_layers)


def answering(workers: list[str], *, wait_s: float, timeout_s: float = 2.0) -> list[str]:
    """Those of ``workers`` (``host:port``) that accept a connection, each tried again until
    ``wait_s`` has passed while it refuses (a worker that ``blazar rpc-worker`` is restarting).
    Blocking: run it in a thread."""
    deadline = time.monotonic() + wait_s
    found = []
    for worker in workers:
        host, _, port = worker.rpartition(":")
        while True:
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                    found.append(worker)
                    break
            except (OSError, ValueError):
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
    return found


def without_workers(config: RuntimeConfig, model: str, missing: list[str]) -> RuntimeConfig:
    """``config`` with ``model`` split over its ``rpc`` workers but ``missing`` (this machine
    alone when none is left)."""
    over = config.models[model]
    rpc = over.rpc or []
    kept = [i for i, w in enumerate(rpc) if w not in missing]
    mem = over.rpc_memory_mb
    changed = msgspec.structs.replace(
        over,
        rpc=[rpc[i] for i in kept] or None,
        rpc_memory_mb=[mem[i] for i in kept] if mem and kept else None,
        rpc_fallback=over.rpc_fallback if kept else None,
    )
    return msgspec.structs.replace(config, models={**config.models, model: changed})


LOST_MARK = "error: --rpc: the RPC worker "


def lost_workers(stderr: str, workers: list[str]) -> list[str]:
    """The workers whose loss a split engine's last stderr lines tell of: those the wheel's
    host names (``rpc_backend.name_lost_workers``), or all of ``workers`` where llama.cpp says
    only that one failed (a ``llama-server`` binary); empty when the crash was not a worker's."""
    if not workers:
        return []
    at = stderr.find(LOST_MARK)
    if at >= 0:
        named = stderr[at + len(LOST_MARK) :].split(" went away", 1)[0]
        found = [w for w in (n.strip() for n in named.split(",")) if w in workers]
        if found:
            return found
    return list(workers) if "Remote RPC server crashed" in stderr or at >= 0 else []


def describe_loss(lost: list[str], workers: list[str]) -> str:
    """Which worker a split engine lost, for a crash message."""
    if len(lost) == len(workers) > 1:
        return f"one of its RPC workers ({', '.join(workers)}) went away"
    return f"its RPC worker{'s' if len(lost) > 1 else ''} {', '.join(lost)} went away"


def within_budget(memory: fit.Memory, budget_mb: float | None) -> fit.Memory:
    """This machine's share of a split: its memory, capped by ``memory_budget_mb`` when set
    (the operator's cap on what models hold here)."""
    if budget_mb is None or budget_mb <= 0:
        return memory
    return msgspec.structs.replace(memory, ram_available=min(memory.ram_available, int(budget_mb * 2**20)))


def workers_of(over: ModelOverride, memory: fit.Memory) -> list[Worker]:
    """A model's ``rpc`` workers with the memory each offers: its ``rpc_memory_mb``, else
    what this machine has available (an even split between like machines)."""
    sizes = [mb * 2**20 for mb in over.rpc_memory_mb] if over.rpc_memory_mb else None
    return [
        Worker(address=address, memory=sizes[i] if sizes else memory.ram_available)
        for i, address in enumerate(over.rpc or [])
    ]
