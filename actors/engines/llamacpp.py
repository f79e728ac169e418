"""The llama.cpp lane: which program to run, with which flags.

A ``llama-server`` binary is used when one is configured or on PATH; otherwise
our host module runs llama.cpp's C++ server from the ``xllamacpp`` wheel with
the same flags. A binary does not watch its stdin, so it runs under our
watchdog, which ties its life to the daemon's.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

from actors.config import EngineConfig
from actors.engines.lane import Lane
from actors.engines.rpc_backend import missing_module, wheel_version
from actors.engines.spec import LaunchSpec
from actors.engines.versions import EngineVersion

if TYPE_CHECKING:
    import httpx

__all__ = [
    "CPU_PROMPT_BATCH",
    "LANE",
    "LaunchSpec",
    "build_argv",
    "engine_version",
    "find_llama_server",
    "lane",
    "prompt_batch_for",
    "rpc_problem",
    "served_context",
    "speculation_flags",
]


CPU_PROMPT_BATCH = 256
"""Prompt batch on the CPU lane. llama.cpp notices a client gone only between steps of
the prompt (when it writes a progress event), so a step bounds how long a cancelled
prompt keeps its slot busy; smaller steps read the prompt more slowly. BENCHMARK.md
(cancellation during prefill) has the curve this value was chosen from."""


def prompt_batch_for(*, gpu_layers: int | None, configured: int | None) -> int | None:
    """The prompt batch an engine runs with: the configured one, else ``CPU_PROMPT_BATCH``
    on the CPU lane; on a GPU llama.cpp's own (a step of 512 tokens takes milliseconds)."""
    if configured is not None:
        return configured
    return CPU_PROMPT_BATCH if not gpu_layers else None


LANE = "llama.cpp"

_version_cache: dict[str | None, str | None] = {}


def engine_version(binary: str | None) -> str | None:
    """What runs the lane, with its version: ``llama-server b4743 (d07c6213)`` from the
    binary's ``--version``, or ``xllamacpp 0.2.5`` for the wheel's host; None when it will
    not say. Cached per binary (a binary's ``--version`` takes a moment: call it off the loop)."""
    if binary not in _version_cache:
        _version_cache[binary] = _binary_version(binary) if binary else _wheel_version("xllamacpp")
    return _version_cache[binary]


def _wheel_version(dist: str) -> str | None:
    try:
        return f"{dist} {importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return None


def _binary_version(binary: str) -> str | None:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (done.stdout + done.stderr).splitlines():  # llama.cpp prints it on stderr
        if line.startswith("version:"):
            return f"llama-server b{line.removeprefix('version:').strip()}"
    return None


def find_llama_server(configured: str | None) -> str | None:
    if configured:
        return configured
    return shutil.which("llama-server")


_GPU_BACKENDS = ("CUDA", "ROCm", "HIP", "Metal", "Vulkan", "SYCL")
_gpu_backend_cache: dict[str, str | None] = {}


def gpu_backend(binary: str) -> str | None:
    """The GPU backend a ``llama-server`` build offers (``CUDA``, ``Metal``, ``Vulkan``…),
    from its ``--list-devices``; None for a CPU-only build or a binary that will not say."""
    if binary not in _gpu_backend_cache:
        try:
            out = subprocess.run(
                [binary, "--list-devices"], capture_output=True, text=True, timeout=20, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        found = None
        for line in out.splitlines():
            device = line.strip().split(":", 1)[0]
            found = next((b for b in _GPU_BACKENDS if device.upper().startswith(b.upper())), None)
            if found:
                break
        _gpu_backend_cache[binary] = found
    return _gpu_backend_cache[binary]


_rpc_cache: dict[str, str | None] = {}


def _said(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not run it: {exc}"
    return done.stdout + done.stderr


def rpc_problem(binary: str | None, wheel: str | None = None) -> str | None:
    """Why this llama.cpp engine cannot split a model over ``rpc-server`` workers, or None.

    The xllamacpp wheel (``binary`` None; ``wheel``: its version, the installed one when
    None) has no RPC backend of its own: it takes the one ``make rpc-server`` built from its
    own sources, when that is there (``rpc_backend``).

    A ``llama-server`` is asked directly: ``--rpc`` is handled before ``--version`` exits,
    and a build without the backend refuses it ("RPC not supported in this build"; builds
    older than the flag call it an invalid argument). A build with the backend tries to
    reach the worker named (nothing listens on port 9) and fails in its own way, which is
    not a refusal. Cached per binary."""
    if binary is None:
        return missing_module(wheel or wheel_version())
    if binary not in _rpc_cache:
        problem = None
        version = _said([binary, "--version"])
        if "version:" not in version:
            last = (version.strip().splitlines() or ["no output"])[-1][:200]
            problem = f"{binary} does not answer --version as llama-server does ({last})"
        else:
            said = _said([binary, "--rpc", "127.0.0.1:9", "--version"]).lower()
            if "not supported in this build" in said or "failed to find rpc backend" in said:
                problem = f"{binary} is built without llama.cpp's RPC backend; rebuild it with -DGGML_RPC=ON"
            elif "--rpc" in said and ("invalid argument" in said or "unknown argument" in said):
                problem = f"{binary} predates llama.cpp's --rpc flag: install a build with -DGGML_RPC=ON"
        _rpc_cache[binary] = problem
    return _rpc_cache[binary]


async def served_context(client: httpx.AsyncClient) -> int | None:
    """The per-slot context a healthy llama.cpp server really gives each slot (it caps
    ``-c / -np`` at what the model can serve); None when it does not say."""
    import httpx

    try:
        resp = await client.get("/props", timeout=5.0)
        if resp.status_code == 200:
            n = (resp.json().get("default_generation_settings") or {}).get("n_ctx")
            if isinstance(n, int) and n > 0:
                return n
        resp = await client.get("/slots", timeout=5.0)
        if resp.status_code == 200:
            slots = resp.json()
            if isinstance(slots, list) and slots and isinstance(slots[0].get("n_ctx"), int):
                return int(slots[0]["n_ctx"])
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return None


NGRAM_LENGTH_FLAG = {
    "ngram-simple": "--spec-ngram-simple-size-m",
    "ngram-map-k": "--spec-ngram-map-k-size-m",
    "ngram-map-k4v": "--spec-ngram-map-k4v-size-m",
    "ngram-mod": "--spec-ngram-mod-n-max",
}
"""Per n-gram kind, the flag of its draft length (llama.cpp names them per kind since the
generic ``--spec-ngram-size-m`` was split up); ``ngram-cache`` has none."""


def speculation_flags(spec: LaunchSpec) -> list[str]:
    """llama-server's flags for ``spec.speculation``: ``--model-draft`` with the draft's length
    (``--spec-draft-n-max``/``-n-min``), or ``--spec-type`` with the n-gram kind's length."""
    s = spec.speculation
    if s is None:
        return []
    if s.draft_path is not None:
        flags = ["--model-draft", s.draft_path, "--spec-draft-n-max", str(s.max)]
        return flags + (["--spec-draft-n-min", str(s.min)] if s.min else [])
    if s.ngram is None:
        return []
    flags = ["--spec-type", s.ngram]
    if (length := NGRAM_LENGTH_FLAG.get(s.ngram)) is not None:
        flags += [length, str(s.max)]
    if s.ngram == "ngram-mod":  # its own floor (48) would exceed a shorter max
        flags += ["--spec-ngram-mod-n-min", str(min(s.min, s.max))]
    return flags


def build_argv(
    spec: LaunchSpec, *, port: int, api_key: str, binary: str | None, python: str = sys.executable
) -> list[str]:
    flags = [
        "-m", spec.path,
        "-c", str(spec.ctx_total),
        "-np", str(spec.slots),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--api-key", api_key,
        "--alias", spec.alias or spec.model,
        "--metrics",
    ]  # fmt: skip
    if spec.reranking:
        flags += ["--reranking"]
    elif spec.embeddings:
        flags += ["--embeddings", "--pooling", "none" if spec.token_embeddings else "mean"]
        if spec.slots > 1:
            # With a KV stream per slot, llama.cpp mean-pools every input but the first of a
            # batch wrongly (a vector unlike the input's own); one shared stream pools right.
            flags += ["--kv-unified"]
    if spec.slot_save_path:
        flags += ["--slot-save-path", spec.slot_save_path]
    if spec.chat_template:
        flags += ["--chat-template", spec.chat_template]
    if spec.projector:
        flags += ["--mmproj", spec.projector]
    if spec.threads:
        flags += ["-t", str(spec.threads)]
    batch = spec.prompt_step  # a whole input per step where the engine embeds or ranks
    if batch:
        flags += ["-b", str(batch)]
    if spec.micro_step:
        flags += ["-ub", str(spec.micro_step)]
    if spec.kv_cache:
        flags += ["-ctk", spec.kv_cache, "-ctv", spec.kv_cache]
    if spec.flash_attn:
        flags += ["-fa", spec.flash_attn]
    if spec.rpc:
        flags += ["--rpc", ",".join(spec.rpc)]
        if spec.tensor_split:
            flags += ["--tensor-split", ",".join(str(n) for n in spec.tensor_split)]
    if spec.gpu_layers is not None and (binary is not None or spec.rpc):
        flags += ["-ngl", str(spec.gpu_layers)]
    if spec.rope_scaling:
        flags += ["--rope-scaling", spec.rope_scaling]
        if spec.rope_scale:
            flags += ["--rope-scale", f"{spec.rope_scale:g}"]
    for lora in spec.loras:
        flags += ["--lora-scaled", lora.path, f"{lora.scale:g}"]
    for vector in spec.control_vectors:
        flags += ["--control-vector-scaled", vector.path, repr(vector.strength)]
    if spec.control_vectors and spec.control_layers is not None:
        flags += ["--control-vector-layer-range", *(str(n) for n in spec.control_layers)]
    if spec.idle_sleep_s:
        flags += ["--sleep-idle-seconds", str(spec.idle_sleep_s)]
    flags += speculation_flags(spec)
    flags += spec.extra_args
    if binary is None:
        return [python, "-m", "actors.engines.llamacpp_host", *flags]
    return [sys.executable, "-m", "actors.engines.watchdog", binary, *flags]


CAPABILITIES = frozenset(
    {
        "chat", "completions", "embeddings", "rerank", "tools", "json_schema", "vision", "tokenize",
        "infill", "thinking",
    }
)  # fmt: skip
"""``tokenize``: its /tokenize, /detokenize and /apply-template routes; ``infill``: /infill
(fill-in-the-middle, for a model whose vocabulary has the tokens); ``thinking``: reasoning
switched per request (``chat_template_kwargs.enable_thinking``) and cut at a token budget
(``reasoning_budget_tokens``)."""


def lane(config: EngineConfig, release: EngineVersion | None = None) -> Lane:
    """The llama.cpp lane under ``config``: a ``llama-server`` binary when one is configured or
    on PATH, else llama.cpp's server from the xllamacpp wheel, run by our host module. An
    installed ``release`` (``blazar engine``) replaces either: its venv's wheel or its binary."""
    python = sys.executable
    binary = find_llama_server(config.llama_server)
    found = lambda: engine_version(binary)  # noqa: E731
    if release is not None and release.form == "wheel":
        python, binary = release.path, None
        found = lambda: f"xllamacpp {release.version}"  # noqa: E731
    elif release is not None:
        binary = release.path
    return Lane(
        name=LANE,
        kind="llama-server" if binary else "llamacpp-host",
        binary=binary,
        argv=lambda spec, port, api_key: build_argv(
            spec, port=port, api_key=api_key, binary=binary, python=python
        ),
        version=found,
        release=release.version if release is not None else None,
        capabilities=CAPABILITIES,
        formats=frozenset({"gguf"}),
        served_context=served_context,
        llguidance=binary is None,  # the wheel's build reads them; a binary may not
        rpc_problem=lambda: rpc_problem(binary, release.version if release is not None else None),
    )
