"""The vLLM lane: ``vllm serve DIR`` for a Hugging Face safetensors model on a GPU.

The program is a configured path (the ``vllm`` script, or a Python interpreter of a
venv that has vLLM), else ``vllm`` on ``PATH`` or beside the daemon's interpreter,
else ``python -m vllm.entrypoints.cli.main serve`` when the daemon's interpreter
has the ``vllm`` package. It runs under our watchdog.

Of the ``LaunchSpec`` it reads the model directory and name, ``ctx_per_slot``
(``--max-model-len``: vLLM's limit is per request), ``slots`` (``--max-num-seqs``),
``embeddings`` (the pooling runner), ``chat_template``, ``prompt_batch``
(``--max-num-batched-tokens``), ``extra_args`` and its GPU settings (``spec.gpu``: the
memory fraction, sized by the fit plan unless configured; tensor parallelism; a
quantization to apply; the dtype; the tool-call parser, else the one known for the
model's ``architecture``), which ``options`` maps onto ``build_argv``'s keywords.

vLLM speaks OpenAI: the gateway relays chat, completions, embeddings and models as
they are. ``/health`` answers 200 only once the engine has loaded the weights (the
HTTP server starts after them); ``--api-key`` guards the ``/v1`` routes.
"""

from __future__ import annotations

from typing import Any

from actors.config import EngineConfig
from actors.engines._gpu import (
    ApiMap,
    Program,
    find_program,
    gpu_lane,
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
    "find_vllm",
    "lane",
    "launch_env",
    "options",
    "serve_flags",
    "tool_parser_for",
]

LANE = "vLLM"

FORMATS = frozenset({
    "safetensors",
    "safetensors:awq",
    "safetensors:gptq",
    "safetensors:fp8",
    "safetensors:compressed-tensors",
    "safetensors:bitsandbytes",
})  # fmt: skip
"""A Hugging Face directory, plain or quantized in the checkpoint (``quantization_config``:
vLLM reads it and picks its fastest kernel, e.g. Marlin for AWQ and GPTQ)."""

CAPABILITIES = frozenset({"chat", "completions", "embeddings", "tools", "json_schema", "vision"})
"""Embeddings with ``embeddings = true`` (the pooling runner, one model one task); tools
with a tool-call parser for the model's family; JSON schema through ``response_format``
(structured outputs); vision for vision-language architectures."""

API = ApiMap(
    health="/health",
    relay=("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/tokenize"),
    translate=(
        "llama.cpp's own request fields (grammar, n_probs, mirostat, timings) do not exist: "
        "the gateway must not send them, and reads prefill/decode time from its own clock",
    ),
    checks_api_key=True,
    names_model=True,
)

DEFAULT_MEMORY_FRACTION = 0.90
"""vLLM's own default; the fit plan should size it to the model (``_gpu.memory_fraction``)."""

_TOOL_PARSERS = {
    "Qwen2ForCausalLM": "hermes",
    "Qwen3ForCausalLM": "hermes",
    "Qwen3MoeForCausalLM": "hermes",
    "LlamaForCausalLM": "llama3_json",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mistral",
}


def tool_parser_for(architecture: str | None) -> str | None:
    """vLLM's ``--tool-call-parser`` for a config.json architecture; None: unknown family
    (tool calls then need one named in the model's ``extra_args``)."""
    return _TOOL_PARSERS.get(architecture or "")


def find_vllm(configured: str | None) -> Program | None:
    return find_program(
        configured,
        names=("vllm",),
        subcommand=("serve",),
        module=("vllm.entrypoints.cli.main", "serve"),
        dist="vllm",
    )


def launch_env(spec: LaunchSpec) -> dict[str, str]:
    # Usage statistics are reported to vLLM's servers unless this is set.
    return {**offline_env(), "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def build_argv(
    spec: LaunchSpec,
    *,
    port: int,
    api_key: str,
    program: Program,
    gpu_memory_fraction: float = DEFAULT_MEMORY_FRACTION,
    tensor_parallel: int = 1,
    quantization: str | None = None,
    dtype: str | None = None,
    tool_parser: str | None = None,
) -> list[str]:
    """``quantization`` is one vLLM applies at load (``fp8`` on a 16-bit checkpoint); a
    quantized checkpoint says its own and needs none (naming ``awq`` would force the slow
    kernel over Marlin)."""
    return watched(
        program,
        serve_flags(
            spec, port=port, api_key=api_key, gpu_memory_fraction=gpu_memory_fraction,
            tensor_parallel=tensor_parallel, quantization=quantization, dtype=dtype,
            tool_parser=tool_parser,
        ),
    )  # fmt: skip


def serve_flags(
    spec: LaunchSpec,
    *,
    port: int,
    api_key: str | None,
    gpu_memory_fraction: float = DEFAULT_MEMORY_FRACTION,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    quantization: str | None = None,
    dtype: str | None = None,
    tool_parser: str | None = None,
) -> list[str]:
    """``vllm serve``'s flags after the program (``build_argv``; a multi-node plan adds its own,
    ``actors.engines.multinode``). ``api_key`` None: no ``--api-key`` (a headless node serves no
    HTTP); ``pipeline_parallel`` above 1 adds ``--pipeline-parallel-size``."""
    flags = [
        spec.path,
        "--host", "127.0.0.1",
        "--port", str(port),
        *(["--api-key", api_key] if api_key is not None else []),
        "--served-model-name", spec.alias or spec.model,
        "--max-model-len", str(spec.ctx_per_slot),
        "--max-num-seqs", str(spec.slots),
        "--gpu-memory-utilization", f"{gpu_memory_fraction:.2f}",
        "--tensor-parallel-size", str(tensor_parallel),
        *(["--pipeline-parallel-size", str(pipeline_parallel)] if pipeline_parallel > 1 else []),
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    if quantization:
        flags += ["--quantization", quantization]
    if dtype:
        flags += ["--dtype", dtype]
    if spec.embeddings:
        flags += ["--runner", "pooling"]
    elif tool_parser:
        flags += ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser]
    if spec.chat_template:
        flags += ["--chat-template", spec.chat_template]
    if spec.prompt_batch:
        flags += ["--max-num-batched-tokens", str(spec.prompt_batch)]
    flags += spec.extra_args
    return flags


def options(spec: LaunchSpec) -> dict[str, Any]:
    """``build_argv``'s settings from the spec (``_gpu.serving_options``)."""
    return serving_options(
        spec,
        fraction="gpu_memory_fraction",
        default_fraction=DEFAULT_MEMORY_FRACTION,
        parser_for=tool_parser_for,
    )


def lane(config: EngineConfig, path: str | None = None) -> Lane | None:
    """The vLLM lane, with the program at ``path`` (``[engine] vllm``) or found; None when
    vLLM is not installed."""
    return gpu_lane(
        find_vllm(path),
        name=LANE,
        kind="vllm",
        label="vllm",
        build=build_argv,
        api=API,
        capabilities=CAPABILITIES,
        formats=FORMATS,
        env=launch_env,
        served_context=served_context_from_models,
        start_timeout_s=900.0,  # it compiles and captures kernels before it listens
        options=options,
    )
