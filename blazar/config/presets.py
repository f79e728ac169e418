"""Named sets of config keys (``blazar config preset NAME``) and workload intents (``blazar run
--intent``).

A preset owns the keys in ``OWNED``: applying one sets each of them to its value, or removes
it from the file (its built-in default applies) when the preset leaves it out, so presets
replace each other instead of piling up. ``balanced`` is the built-in defaults. The KV cache
type is the one setting with no key of its own: ``low-memory`` adds llama.cpp's
``-ctk``/``-ctv`` flags to ``engine.extra_args`` and the others take them out, leaving the
user's other flags alone. ``--model NAME`` adds the preset's per-model keys for that model.

An intent (``agent``, ``batch``, ``coding``, ``reasoning``, ``vision``) changes one run only:
the context and slots the model's engine runs with for it, the keep-alive, the sampling
defaults; the config file is not touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["INTENTS", "OWNED", "PRESETS", "Intent", "Preset", "preset_changes"]

OWNED = (
    "slots",
    "default_ctx",
    "keep_alive_s",
    "max_loaded_models",
    "max_queue",
    "queue_timeout_s",
    "jobs_max_running",
    "mcp_default",
)
_KV_FLAGS = ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v")


@dataclass(frozen=True)
class Preset:
    summary: str
    keys: dict[str, Any]
    """Values of ``OWNED`` keys; an owned key not here goes back to its default."""
    kv_cache: str | None = None
    """KV cache type for ``-ctk``/``-ctv`` (None: llama.cpp's own, f16)."""
    model_keys: dict[str, Any] = field(default_factory=dict)
    """``models.NAME.KEY`` values, written for ``--model NAME``."""
    preload_model: bool = False
    """With ``--model NAME``: load NAME when the daemon starts."""


PRESETS: dict[str, Preset] = {
    "balanced": Preset(
        summary="the built-in defaults: 4 slots, 4096 tokens per slot, models unloaded after 5 idle minutes",
        keys={},
    ),
    "throughput": Preset(
        summary="more parallel requests and bigger prompt batches: 8 slots, long queues, 4 jobs at once",
        keys={
            "slots": 8,
            "max_queue": 1024,
            "queue_timeout_s": 300.0,
            "jobs_max_running": 4,
            "keep_alive_s": 1800.0,
        },
        model_keys={"prompt_batch": 1024},
    ),
    "low-memory": Preset(
        summary="the least memory: 1 slot of 2048 tokens, a q8_0 KV cache, one model loaded, "
        "unloaded after 1 idle minute",
        keys={
            "slots": 1,
            "default_ctx": 2048,
            "max_loaded_models": 1,
            "keep_alive_s": 60.0,
            "jobs_max_running": 1,
        },
        kv_cache="q8_0",
    ),
    "agent": Preset(
        summary="long context and tools for one model kept warm: 16384 tokens per slot (clamped to what the "
        "model serves), 2 slots, every MCP server's tools, one model loaded and never unloaded",
        keys={
            "slots": 2,
            "default_ctx": 16384,
            "max_loaded_models": 1,
            "keep_alive_s": -1.0,
            "mcp_default": "all",
        },
        preload_model=True,
    ),
}


def _without_kv(args: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in _KV_FLAGS:
            skip = True
            continue
        if any(arg.startswith(flag + "=") for flag in _KV_FLAGS):
            continue
        out.append(arg)
    return out


def preset_changes(preset: Preset, current: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The keys applying ``preset`` writes, as dotted key → value (None: removed from the file).

    ``current``: the file's values (dotted keys) — only keys whose value changes are returned."""
    wanted: dict[str, Any] = {key: preset.keys.get(key) for key in OWNED}
    extra = list(current.get("engine.extra_args") or [])
    args = _without_kv(extra)
    if preset.kv_cache is not None:
        args += ["-ctk", preset.kv_cache, "-ctv", preset.kv_cache]
    wanted["engine.extra_args"] = args or None
    if model is not None:
        for key, value in preset.model_keys.items():
            wanted[f"models.{model}.{key}"] = value
        if preset.preload_model:
            preload = list(current.get("preload") or [])
            wanted["preload"] = preload if model in preload else [model, *preload]
    return {k: v for k, v in wanted.items() if current.get(k) != v}


@dataclass(frozen=True)
class Intent:
    summary: str
    ctx: int
    """Per-slot context asked for (clamped to what the model serves)."""
    slots: int
    keep_alive_s: float
    options: dict[str, Any]
    """Sampling defaults for the run's requests (an explicit flag wins)."""
    vision: bool = False


INTENTS: dict[str, Intent] = {
    "agent": Intent(
        summary="long context, one slot, kept loaded, near-deterministic",
        ctx=16384,
        slots=1,
        keep_alive_s=-1.0,
        options={"temperature": 0.2},
    ),
    "batch": Intent(
        summary="many short requests side by side: 8 slots of 2048 tokens, greedy",
        ctx=2048,
        slots=8,
        keep_alive_s=300.0,
        options={"temperature": 0.0},
    ),
    "coding": Intent(
        summary="long files and exact answers: 8192 tokens, 2 slots, low temperature",
        ctx=8192,
        slots=2,
        keep_alive_s=1800.0,
        options={"temperature": 0.1},
    ),
    "reasoning": Intent(
        summary="long thinking: 8192 tokens, 1 slot, moderate temperature",
        ctx=8192,
        slots=1,
        keep_alive_s=1800.0,
        options={"temperature": 0.6},
    ),
    "vision": Intent(
        summary="images in the prompt: needs a model with a vision projector, 4096 tokens, 2 slots",
        ctx=4096,
        slots=2,
        keep_alive_s=300.0,
        options={"temperature": 0.2},
        vision=True,
    ),
}
