"""The mistral.rs lane: which program to run, with which flags, and what it can do.

A mistral.rs binary is used when one is configured or on PATH: ``mistralrs``
(``mistralrs serve …``, the CLI since 0.7) or the older ``mistralrs-server``.
Otherwise our host module serves the model through the ``mistralrs`` wheel
(``pip install 'blazar[mistralrs]'``), which has a Python API and no HTTP server.
A binary does not watch its stdin, so it runs under our watchdog, which ties its
life to the daemon's.

The launch data reuses the llama.cpp lane's ``LaunchSpec``. Of it this lane reads
the model path and name, ``slots``, ``ctx_per_slot`` (the binary sizes its device
map with it; the host serves the model's whole training length), ``threads``,
``gpu_layers`` (unset: CPU) and ``chat_template``; llama.cpp's own flags
(``extra_args``, prompt batch, rope scaling, projector, embeddings) do not apply.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from typing import Literal

import msgspec

from actors.config import EngineConfig
from actors.engines.lane import Lane, unknown_context
from actors.engines.llamacpp import served_context
from actors.engines.spec import LaunchSpec
from actors.engines.versions import EngineVersion

__all__ = [
    "CPU_MAX_SEQS",
    "FORMATS",
    "Binary",
    "LaneInfo",
    "LaunchSpec",
    "build_argv",
    "find_mistralrs",
    "host_available",
    "lane",
    "lane_info",
    "launch_env",
    "max_seqs_for",
    "served_context",
]

FORMATS = ("gguf",)
"""Model formats this lane loads today. A Hugging Face safetensors directory
(``config.json`` + ``*.safetensors``) is the next: the wheel's ``Which.Plain`` and
``mistralrs serve -m DIR`` load one, once the store recognises such directories."""

CPU_MAX_SEQS = 1
"""Sequences the engine runs at once on the CPU. With two or more, mistral.rs 0.9.5
batches them and its quantized matmul fails ("input tensor is not contiguous") on
the CPU GGUF path; with one, further requests queue inside the engine and all succeed."""


class Binary(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    style: Literal["serve", "server"]
    """``serve``: the ``mistralrs`` CLI (``mistralrs serve``); ``server``: ``mistralrs-server``."""


class LaneInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What one form of the lane does, for routing and for the engine actor."""

    lane: str
    """``mistralrs-host``, ``mistralrs-serve`` or ``mistralrs-server``."""
    kind: str = "mistralrs"
    formats: tuple[str, ...] = FORMATS
    capabilities: frozenset[str] = frozenset({"chat", "completions", "json_schema"})
    """Chat and text completions, JSON-schema constrained output (llguidance grammars).
    No embeddings, vision or native tools for the text GGUFs this lane runs: the gateway
    emulates tools as it does on llama.cpp."""
    checks_api_key: bool
    """The child refuses requests without its key. mistral.rs's own server checks none,
    so only loopback guards it."""
    names_model: bool
    """Replies carry the canonical model name; the binary names the model by its path."""
    streams_completions: bool
    """``/v1/completions`` streams token by token. The wheel's completion call does not
    stream, so the host sends the whole text as one event."""
    props: bool
    """``GET /props`` says the served context (``default_generation_settings.n_ctx``) and
    the sequences run at once (``total_slots``), as llama-server's does."""


def host_available() -> bool:
    """The ``mistralrs`` wheel is installed, so the host can run."""
    return importlib.util.find_spec("mistralrs") is not None


def find_mistralrs(configured: str | None) -> Binary | None:
    """The configured binary, else ``mistralrs`` or ``mistralrs-server`` on PATH; None: the host."""
    if configured:
        style: Literal["serve", "server"] = (
            "server" if os.path.basename(configured).startswith("mistralrs-server") else "serve"
        )
        return Binary(path=configured, style=style)
    if found := shutil.which("mistralrs"):
        return Binary(path=found, style="serve")
    if found := shutil.which("mistralrs-server"):
        return Binary(path=found, style="server")
    return None


def lane_info(binary: Binary | None) -> LaneInfo:
    if binary is None:
        return LaneInfo(
            lane="mistralrs-host",
            checks_api_key=True,
            names_model=True,
            streams_completions=False,
            props=True,
        )
    return LaneInfo(
        lane=f"mistralrs-{binary.style}",
        checks_api_key=False,
        names_model=False,
        streams_completions=True,
        props=False,
    )


def max_seqs_for(spec: LaunchSpec) -> int:
    """``spec.slots`` on a GPU; ``CPU_MAX_SEQS`` on the CPU, where batching fails."""
    return spec.slots if spec.gpu_layers else min(spec.slots, CPU_MAX_SEQS)


def launch_env(spec: LaunchSpec) -> dict[str, str]:
    """Variables to add to the child's environment: no network (the tokenizer is in the
    GGUF) and, for a binary, the CPU thread count (the host takes ``-t``)."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if spec.threads:
        env["RAYON_NUM_THREADS"] = str(spec.threads)
    return env


def build_argv(
    spec: LaunchSpec, *, port: int, api_key: str, binary: Binary | None, python: str = sys.executable
) -> list[str]:
    max_seqs = str(max_seqs_for(spec))
    if binary is None:
        flags = [
            "-m", spec.path,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--api-key", api_key,
            "--alias", spec.alias or spec.model,
            "--max-seqs", max_seqs,
        ]  # fmt: skip
        if spec.threads:
            flags += ["-t", str(spec.threads)]
        if spec.chat_template:
            flags += ["--chat-template", spec.chat_template]
        return [python, "-m", "actors.engines.mistralrs_host", *flags]
    model_dir, model_file = os.path.split(os.path.abspath(spec.path))
    template = ["-j", spec.chat_template] if spec.chat_template else []
    if binary.style == "serve":
        flags = [
            "--token-source", "none",
            "serve",
            "--host", "127.0.0.1",
            "-p", str(port),
            "--no-ui",
            "--disable-access-log",
            "--max-seqs", max_seqs,
            "--max-seq-len", str(spec.ctx_per_slot),
            "--max-batch-size", max_seqs,
            *template,
            # The store's blobs have no .gguf suffix, from which the CLI would guess the format.
            "--format", "gguf",
            "-m", model_dir,
            "-f", model_file,
        ]  # fmt: skip
        if not spec.gpu_layers:
            flags.append("--cpu")
    else:
        flags = [
            "--serve-ip", "127.0.0.1",
            "-p", str(port),
            "--token-source", "none",
            "--max-seqs", max_seqs,
            *template,
            "gguf",
            "-m", model_dir,
            "-f", model_file,
        ]  # fmt: skip
    return [sys.executable, "-m", "actors.engines.watchdog", binary.path, *flags]


LANE = "mistral.rs"


def _version(binary: Binary | None) -> str | None:
    if binary is None:
        try:
            return f"mistralrs {importlib.metadata.version('mistralrs')}"
        except importlib.metadata.PackageNotFoundError:
            return None
    try:
        done = subprocess.run(
            [binary.path, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    line = (done.stdout or done.stderr).strip().splitlines()
    return line[0].strip() if line else None


def lane(config: EngineConfig, release: EngineVersion | None = None) -> Lane | None:
    """The mistral.rs lane under ``config``, or None when neither a binary nor the wheel is here.
    An installed ``release`` (``blazar engine``) replaces either: its venv's wheel or its binary."""
    python = sys.executable
    binary = find_mistralrs(config.mistralrs)
    found = lambda: _version(binary)  # noqa: E731
    if release is not None and release.form == "wheel":
        python, binary = release.path, None
        found = lambda: f"mistralrs {release.version}"  # noqa: E731
    elif release is not None:
        binary = find_mistralrs(release.path)
    elif binary is None and not host_available():
        return None
    info = lane_info(binary)
    return Lane(
        name=LANE,
        kind=info.lane,
        binary=binary.path if binary else None,
        argv=lambda spec, port, api_key: build_argv(
            spec, port=port, api_key=api_key, binary=binary, python=python
        ),
        version=found,
        release=release.version if release is not None else None,
        capabilities=info.capabilities,
        formats=frozenset(info.formats),
        env=launch_env,
        served_context=served_context if info.props else unknown_context,
        llguidance=binary is None,  # the host's grammars are tested; a binary's are not here
        cpu_sequences=CPU_MAX_SEQS,
    )
