"""The MLX lane: ``mlx_lm.server`` for an MLX directory (Apple silicon; MLX's CUDA build too).

The program is a configured path (the ``mlx_lm.server`` script, or a Python
interpreter of a venv that has ``mlx-lm``), else ``mlx_lm.server`` on ``PATH`` or
beside the daemon's interpreter, else ``python -m mlx_lm.server`` when the daemon's
interpreter has ``mlx_lm``. It runs under our watchdog.

Of the ``LaunchSpec`` it reads the model directory, ``slots`` (``--decode-concurrency``
and, up to 8, ``--prompt-concurrency``), ``prompt_batch`` (``--prefill-step-size``),
``max_output_tokens`` (``--max-tokens``, the default cap), ``chat_template`` (its
text: the server takes the template itself, not a file) and ``extra_args``. MLX has
no per-request context limit to set and no GPU memory fraction (memory is unified;
the server wires what the system recommends), so the gateway enforces the context.

The server speaks OpenAI for chat and completions, with three differences the
gateway must absorb: it checks no API key (only loopback guards it); a request's
``model`` names the model to *load* (anything but ``default_model`` or the served
path makes it look for another model), so the gateway rewrites ``model`` to
``default_model`` and replies name the model ``default_model``; and ``/health`` is
200 as soon as the HTTP server is up, while the weights still load (the first request
waits for them).
"""

from __future__ import annotations

from pathlib import Path

from actors.config import EngineConfig
from actors.engines._gpu import ApiMap, Program, find_program, gpu_lane, offline_env, watched
from actors.engines.lane import Lane
from actors.engines.spec import LaunchSpec

__all__ = [
    "API",
    "CAPABILITIES",
    "FORMATS",
    "LANE",
    "MAX_PROMPT_CONCURRENCY",
    "build_argv",
    "find_mlx",
    "lane",
    "launch_env",
]

LANE = "MLX"

FORMATS = frozenset({"mlx", "safetensors"})
"""An MLX directory (``mlx_lm.convert``'s output, quantized or not); a plain 16-bit
Hugging Face directory loads too (converted in memory). Not AWQ/GPTQ/FP8 checkpoints."""

CAPABILITIES = frozenset({"chat", "completions", "tools"})
"""Chat and completions; tool calls where the model's tokenizer has a tool-call format
(mlx-lm parses them). No embeddings, JSON schema or images."""

API = ApiMap(
    health="/health",
    relay=("/v1/chat/completions", "/v1/completions"),
    translate=(
        "rewrite the request's model to default_model (the server loads whatever model a "
        "request names) and the reply's model back to the canonical name",
        "no response_format/json_schema: refuse it (or emulate) before relaying",
    ),
    checks_api_key=False,
    names_model=False,
    request_model="default_model",
    health_means_loaded=False,
)

MAX_PROMPT_CONCURRENCY = 8
"""mlx-lm's own default for prompts read at once; more slots only batch decoding."""


def find_mlx(configured: str | None) -> Program | None:
    return find_program(configured, names=("mlx_lm.server",), module=("mlx_lm.server",), dist="mlx-lm")


def launch_env(spec: LaunchSpec) -> dict[str, str]:
    return offline_env()


def build_argv(spec: LaunchSpec, *, port: int, api_key: str, program: Program) -> list[str]:
    """``api_key`` is not passed: the server has no such option."""
    flags = [
        "--model", spec.path,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--decode-concurrency", str(spec.slots),
        "--prompt-concurrency", str(min(spec.slots, MAX_PROMPT_CONCURRENCY)),
        "--log-level", "WARNING",
    ]  # fmt: skip
    if spec.prompt_batch:
        flags += ["--prefill-step-size", str(spec.prompt_batch)]
    if spec.max_output_tokens:
        flags += ["--max-tokens", str(spec.max_output_tokens)]
    if spec.chat_template:
        flags += ["--chat-template", Path(spec.chat_template).read_text(encoding="utf-8")]
    flags += spec.extra_args
    return watched(program, flags)


def lane(config: EngineConfig, path: str | None = None) -> Lane | None:
    """The MLX lane, with the program at ``path`` (``[engine] mlx``) or found; None when
    mlx-lm is not installed."""
    return gpu_lane(
        find_mlx(path),
        name=LANE,
        kind="mlx-lm",
        label="mlx-lm",
        build=build_argv,
        api=API,
        capabilities=CAPABILITIES,
        formats=FORMATS,
        env=launch_env,
    )
