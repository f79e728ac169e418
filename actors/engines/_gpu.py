"""What the GPU lanes (vLLM, SGLang, MLX, stable-diffusion.cpp) share: finding the
program, reading back the context, and the size of the memory fraction.

Each of these engines is a program we do not ship: a configured path, else one on
``PATH``, else a Python module importable by the daemon's own interpreter. None of
them watches its stdin, so each runs under our watchdog, which ties its life to the
daemon's (``python -m actors.engines.watchdog PROGRAM …``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from actors.engines.lane import Lane
from actors.engines.spec import LaunchSpec

if TYPE_CHECKING:
    import httpx

__all__ = [
    "ApiMap",
    "Program",
    "find_program",
    "gpu_lane",
    "memory_fraction",
    "module_available",
    "offline_env",
    "program_version",
    "served_context_from_models",
    "watched",
]


class Program(msgspec.Struct, frozen=True, kw_only=True):
    argv: list[str]
    """What starts the engine before its own flags: ``["/usr/bin/vllm", "serve"]``,
    ``[python, "-m", "sglang.launch_server"]``."""
    found: str
    """How it was found: ``configured``, ``path`` or ``module``."""
    dist: str
    """The Python distribution that provides it (``vllm``, ``sglang``, ``mlx-lm``), for its
    version; empty for a program that is not one (``sd-server``)."""


class ApiMap(msgspec.Struct, frozen=True, kw_only=True):
    """How a lane's HTTP API maps onto the gateway's."""

    health: str
    """The path that answers 200 once the engine serves (the engine actor polls it)."""
    relay: tuple[str, ...]
    """Routes the gateway relays as they are (the engine speaks OpenAI there)."""
    translate: tuple[str, ...] = ()
    """What the gateway must change on the way, in words (one item each)."""
    checks_api_key: bool
    """The engine refuses requests without ``--api-key``; otherwise only loopback guards it."""
    names_model: bool
    """Replies carry the canonical model name (``--served-model-name``)."""
    request_model: str | None = None
    """What a relayed request's ``model`` must be rewritten to; None: the engine takes any
    (or the canonical name)."""
    health_means_loaded: bool = True
    """200 on ``health`` means the weights are loaded; False: the first request waits."""


def module_available(module: str) -> bool:
    """The daemon's interpreter can import ``module`` (looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def find_program(
    configured: str | None,
    *,
    names: tuple[str, ...],
    dist: str,
    subcommand: tuple[str, ...] = (),
    module: tuple[str, ...] | None = None,
) -> Program | None:
    """The configured program, else the first of ``names`` on ``PATH`` (or beside the
    daemon's interpreter, as a venv installs it), else ``python -m MODULE…`` when the
    daemon's interpreter has it; None: not installed.

    A configured path that is a Python interpreter (its name starts with ``python``)
    runs ``module`` with it: the engine may live in a venv of its own."""
    if configured:
        if module is not None and os.path.basename(configured).startswith("python"):
            return Program(argv=[configured, "-m", *module], found="configured", dist=dist)
        return Program(argv=[configured, *subcommand], found="configured", dist=dist)
    here = os.path.dirname(sys.executable)
    for name in names:
        found = shutil.which(name) or shutil.which(name, path=here)
        if found:
            return Program(argv=[found, *subcommand], found="path", dist=dist)
    if module is not None and module_available(module[0].split(".")[0]):
        return Program(argv=[sys.executable, "-m", *module], found="module", dist=dist)
    return None


def watched(program: Program, flags: list[str]) -> list[str]:
    """The child's argv: the program and its flags under our watchdog."""
    return [sys.executable, "-m", "actors.engines.watchdog", *program.argv, *flags]


_version_cache: dict[tuple[str, ...], str | None] = {}
_DIST_VERSION = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"


def program_version(program: Program, *, label: str) -> str | None:
    """``label VERSION``: the distribution's version, read in the interpreter that runs it
    (ours without a process), else the last line of ``PROGRAM --version``; None when it
    will not say. Blocking and cached (call it off the event loop)."""
    key = (*program.argv, label)
    if key not in _version_cache:
        _version_cache[key] = _version(program, label)
    return _version_cache[key]


def _version(program: Program, label: str) -> str | None:
    python_module = program.argv[1:2] == ["-m"]
    ours = program.argv[0] == sys.executable or (
        program.found == "path" and os.path.dirname(program.argv[0]) == os.path.dirname(sys.executable)
    )
    if ours and program.dist:
        try:
            return f"{label} {importlib.metadata.version(program.dist)}"
        except importlib.metadata.PackageNotFoundError:
            return None
    if python_module:
        if not program.dist:
            return None
        cmd = [program.argv[0], "-c", _DIST_VERSION, program.dist]
    else:
        cmd = [program.argv[0], "--version"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (done.stdout or done.stderr).strip().splitlines()
    if done.returncode != 0 or not lines:
        return None
    text = lines[-1].strip()
    return text if text.lower().startswith(label.lower()) else f"{label} {text}"


def offline_env() -> dict[str, str]:
    """No hub downloads from a child: the model is a local directory."""
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


async def served_context_from_models(client: httpx.AsyncClient) -> int | None:
    """The per-request context an OpenAI server reports in ``GET /v1/models``
    (``max_model_len``, as vLLM and SGLang say it); None when it does not say."""
    import httpx

    try:
        resp = await client.get("/v1/models", timeout=5.0)
        if resp.status_code == 200:
            data = resp.json().get("data") or []
            n = data[0].get("max_model_len") if data and isinstance(data[0], dict) else None
            if isinstance(n, int) and n > 0:
                return n
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return None


MIN_FRACTION = 0.10
MAX_FRACTION = 0.95


def threaded_env(spec: LaunchSpec) -> dict[str, str]:
    """``offline_env`` with the spec's thread count for onnxruntime / CTranslate2 (``OMP_NUM_THREADS``)."""
    env = offline_env()
    if spec.threads:
        env["OMP_NUM_THREADS"] = str(spec.threads)
    return env


def wheel_version(package: str, runtime: str) -> str | None:
    """``package 1.2 (runtime 3.4)`` for a host lane's wheel and what it runs on; None when
    the wheel is not installed."""
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        return f"{package} {version} ({runtime} {importlib.metadata.version(runtime)})"
    except importlib.metadata.PackageNotFoundError:
        return f"{package} {version}"


def memory_fraction(need_bytes: int, gpu_total_bytes: int, *, headroom: float = 1.10) -> float:
    """The share of one GPU's memory an engine is given (vLLM ``--gpu-memory-utilization``,
    SGLang ``--mem-fraction-static``): what the fit plan says the model needs (weights and
    the KV cache for ``ctx_per_slot * slots``) with ``headroom``, over the GPU's total,
    rounded up to a hundredth and kept within [0.10, 0.95]. Such engines take all of their
    fraction at start, so a fraction sized to the model leaves the rest to other engines."""
    if gpu_total_bytes <= 0:
        raise ValueError("gpu_total_bytes must be positive")
    share = math.ceil(need_bytes * headroom / gpu_total_bytes * 100 - 1e-9) / 100
    return min(MAX_FRACTION, max(MIN_FRACTION, share))


def serving_options(
    spec: LaunchSpec,
    *,
    fraction: str,
    default_fraction: float,
    parser_for: Callable[[str | None], str | None],
) -> dict[str, Any]:
    """A GPU serving engine's ``build_argv`` settings from the spec (vLLM, SGLang): its GPU
    settings, under the lane's keyword ``fraction`` for the memory share (``default_fraction``
    when neither configured nor planned), and the tool-call parser known for the model's
    architecture when none is set."""
    gpu = spec.gpu
    return {
        fraction: gpu.memory_fraction or default_fraction,
        "tensor_parallel": gpu.tensor_parallel,
        "quantization": gpu.quantization,
        "dtype": gpu.dtype,
        "tool_parser": gpu.tool_parser or parser_for(spec.architecture),
    }


def gpu_lane(
    program: Program | None,
    *,
    name: str,
    kind: str,
    label: str,
    build: Callable[..., list[str]],
    api: ApiMap,
    capabilities: frozenset[str],
    formats: frozenset[str],
    env: Callable[[LaunchSpec], dict[str, str]] | None = None,
    served_context: Callable[[httpx.AsyncClient], Awaitable[int | None]] | None = None,
    start_timeout_s: float | None = None,
    options: Callable[[LaunchSpec], dict[str, Any]] | None = None,
    sequences: int | None = None,
) -> Lane | None:
    """The ``Lane`` of a GPU engine found as ``program`` (None: not installed). ``build`` is the
    lane's ``build_argv(spec, *, port, api_key, program, **options(spec))``: ``options`` maps
    the spec's lane-specific settings onto its keyword arguments. No grammar for the gateway's
    tool emulation: these engines parse tool calls themselves."""
    if program is None:
        return None
    extra: dict[str, Any] = {}
    if env is not None:
        extra["env"] = env
    if served_context is not None:
        extra["served_context"] = served_context
    return Lane(
        name=name,
        kind=kind,
        binary=program.argv[0],
        argv=lambda spec, port, api_key: build(
            spec, port=port, api_key=api_key, program=program, **(options(spec) if options else {})
        ),
        version=lambda: program_version(program, label=label),
        capabilities=capabilities,
        formats=formats,
        llguidance=False,
        health=api.health,
        start_timeout_s=start_timeout_s,
        request_model=api.request_model,
        sequences=sequences,
        **extra,
    )
