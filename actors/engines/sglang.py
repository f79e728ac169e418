"""The SGLang lane: ``python -m sglang.launch_server`` for a Hugging Face safetensors model.

The program is a configured path (a Python interpreter of a venv that has SGLang,
or the ``sglang`` script, run as ``sglang serve``), else the daemon's interpreter
when it has the ``sglang`` package, else ``sglang serve`` from ``PATH``. It runs
under our watchdog.

Of the ``LaunchSpec`` it reads the model directory and name, ``ctx_per_slot``
(``--context-length``, per request), ``slots`` (``--max-running-requests``),
``embeddings`` (``--is-embedding``), ``chat_template``, ``prompt_batch``
(``--chunked-prefill-size``), ``extra_args`` and its GPU settings (``spec.gpu``: the
memory fraction, sized by the fit plan unless configured; tensor parallelism; a
quantization to apply; the dtype; the tool-call parser, else the one known for the
model's ``architecture``), which ``options`` maps onto ``build_argv``'s keywords.

SGLang speaks OpenAI: the gateway relays chat, completions, embeddings and models.
``/health`` is 503 while the server starts and 200 once it serves; ``--api-key``
guards every route but the health checks.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from actors.config import EngineConfig
from actors.engines._gpu import (
    ApiMap,
    Program,
    find_program,
    gpu_lane,
    module_available,
    offline_env,
    served_context_from_models,
    serving_options,
    watched,
)
from actors.engines.lane import Lane
from actors.engines.spec import LaunchSpec

__all__ = [
    "API",
    "CAPABILITIES",
    "DEFAULT_MEMORY_FRACTION",
    "FORMATS",
    "LANE",
    "build_argv",
    "find_sglang",
    "lane",
    "launch_env",
    "options",
    "serve_flags",
    "tool_parser_for",
]

LANE = "SGLang"

FORMATS = frozenset({
    "safetensors",
    "safetensors:awq",
    "safetensors:gptq",
    "safetensors:fp8",
    "safetensors:compressed-tensors",
    "safetensors:bitsandbytes",
})  # fmt: skip
"""A Hugging Face directory, plain or quantized in the checkpoint (SGLang reads
``quantization_config`` and picks the Marlin kernels for AWQ and GPTQ itself)."""

CAPABILITIES = frozenset({"chat", "completions", "embeddings", "tools", "json_schema", "vision"})
"""Embeddings with ``embeddings = true`` (``--is-embedding``); tools with a tool-call
parser for the model's family; JSON schema through ``response_format`` (its grammar
backend, xgrammar by default); vision for vision-language architectures."""

API = ApiMap(
    health="/health",
    relay=("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models"),
    translate=(
        "llama.cpp's own request fields (grammar, n_probs, mirostat, timings) do not exist: "
        "the gateway must not send them, and reads prefill/decode time from its own clock",
    ),
    checks_api_key=True,
    names_model=True,
)

DEFAULT_MEMORY_FRACTION = 0.85
"""Weights and KV pool as a share of the GPU; SGLang's own default depends on the GPU's
size (about 0.9 on a large one). The fit plan should size it (``_gpu.memory_fraction``)."""

_TOOL_PARSERS = {
    "Qwen2ForCausalLM": "qwen",
    "Qwen3ForCausalLM": "qwen",
    "Qwen3MoeForCausalLM": "qwen",
    "LlamaForCausalLM": "llama3",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mistral",
}


def tool_parser_for(architecture: str | None) -> str | None:
    """SGLang's ``--tool-call-parser`` for a config.json architecture; None: unknown."""
    return _TOOL_PARSERS.get(architecture or "")


def find_sglang(configured: str | None) -> Program | None:
    """The configured program (an interpreter runs ``-m sglang.launch_server``, the ``sglang``
    script ``serve``), else the daemon's interpreter when it has SGLang, else ``sglang`` on
    ``PATH``; None: not installed."""
    if configured and os.path.basename(configured).startswith("sglang"):
        return Program(argv=[configured, "serve"], found="configured", dist="sglang")
    if configured:
        return Program(argv=[configured, "-m", "sglang.launch_server"], found="configured", dist="sglang")
    if module_available("sglang"):
        return Program(argv=[sys.executable, "-m", "sglang.launch_server"], found="module", dist="sglang")
    return find_program(None, names=("sglang",), subcommand=("serve",), dist="sglang")


def launch_env(spec: LaunchSpec) -> dict[str, str]:
    return offline_env()


def build_argv(
    spec: LaunchSpec,
    *,
    port: int,
    api_key: str,
    program: Program,
    mem_fraction: float = DEFAULT_MEMORY_FRACTION,
    tensor_parallel: int = 1,
    quantization: str | None = None,
    dtype: str | None = None,
    tool_parser: str | None = None,
) -> list[str]:
    """``quantization`` is one SGLang applies at load (``fp8`` on a 16-bit checkpoint); a
    quantized checkpoint (AWQ, GPTQ, FP8) says its own in config.json and needs none."""
    return watched(
        program,
        serve_flags(
            spec, port=port, api_key=api_key, mem_fraction=mem_fraction,
            tensor_parallel=tensor_parallel, quantization=quantization, dtype=dtype,
            tool_parser=tool_parser,
        ),
    )  # fmt: skip


def serve_flags(
    spec: LaunchSpec,
    *,
    port: int,
    api_key: str | None,
    mem_fraction: float = DEFAULT_MEMORY_FRACTION,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    quantization: str | None = None,
    dtype: str | None = None,
    tool_parser: str | None = None,
) -> list[str]:
    """The server's flags after the program (``build_argv``; a multi-node plan adds its own,
    ``actors.engines.multinode``). ``api_key`` None: no ``--api-key`` (a node of rank above 0
    serves no HTTP); ``pipeline_parallel`` above 1 adds ``--pp-size``."""
    flags = [
        "--model-path", spec.path,
        "--host", "127.0.0.1",
        "--port", str(port),
        *(["--api-key", api_key] if api_key is not None else []),
        "--served-model-name", spec.alias or spec.model,
        "--context-length", str(spec.ctx_per_slot),
        "--max-running-requests", str(spec.slots),
        "--mem-fraction-static", f"{mem_fraction:.2f}",
        "--tp-size", str(tensor_parallel),
        *(["--pp-size", str(pipeline_parallel)] if pipeline_parallel > 1 else []),
        "--enable-metrics",
    ]  # fmt: skip
    if quantization:
        flags += ["--quantization", quantization]
    if dtype:
        flags += ["--dtype", dtype]
    if spec.embeddings:
        flags.append("--is-embedding")
    elif tool_parser:
        flags += ["--tool-call-parser", tool_parser]
    if spec.chat_template:
        flags += ["--chat-template", spec.chat_template]
    if spec.prompt_batch:
        flags += ["--chunked-prefill-size", str(spec.prompt_batch)]
    flags += spec.extra_args
    return flags


def options(spec: LaunchSpec) -> dict[str, Any]:
    """``build_argv``'s settings from the spec (``_gpu.serving_options``)."""
    return serving_options(
        spec,
        fraction="mem_fraction",
        default_fraction=DEFAULT_MEMORY_FRACTION,
        parser_for=tool_parser_for,
    )


def lane(config: EngineConfig, path: str | None = None) -> Lane | None:
    """The SGLang lane, with the program at ``path`` (``[engine] sglang``) or found; None
    when SGLang is not installed."""
    return gpu_lane(
        find_sglang(path),
        name=LANE,
        kind="sglang",
        label="sglang",
        build=build_argv,
        api=API,
        capabilities=CAPABILITIES,
        formats=FORMATS,
        env=launch_env,
        served_context=served_context_from_models,
        start_timeout_s=900.0,  # it compiles and captures kernels before it listens
        options=options,
    )
