"""Which config keys a running daemon applies at once, which reach engines when they next
start, and which wait for a restart (``actors/reload.py`` applies them); dotted keys.

Light on imports: the CLI reads it to tell the user what a change needs.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = ["ENGINE_KEYS", "LIVE_KEYS", "KeyClass", "changed_keys", "flatten", "key_class"]

KeyClass = Literal["live", "engines", "restart"]

LIVE_KEYS = frozenset(
    {"strict", "max_queue", "queue_timeout_s", "keep_alive_s", "max_loaded_models", "memory_budget_mb"}
)
ENGINE_KEYS = frozenset(
    {"slots", "default_ctx", "max_output_tokens", "late_chunking_max_tokens", "idle_sleep_s"}
)


def key_class(key: str) -> KeyClass:
    """How a change to the dotted ``key`` (``slots``, ``models.NAME.ctx``) reaches a running daemon."""
    if key in LIVE_KEYS:
        return "live"
    if key in ENGINE_KEYS:
        return "engines"
    if key.startswith("models."):
        return "live" if key.endswith(".keep_alive_s") else "engines"
    return "restart"


def flatten(config: msgspec.Struct, fields: tuple[str, ...]) -> dict[str, Any]:
    """``config``'s ``fields`` as dotted keys: ``engine.KEY`` and ``models.NAME.KEY`` one by one,
    every other key (lists of tables included) whole."""
    out: dict[str, Any] = {}
    for name in fields:
        value = msgspec.to_builtins(getattr(config, name))
        if name == "models" and isinstance(value, dict):
            for model, over in value.items():
                for k, v in over.items():
                    out[f"models.{model}.{k}"] = v
        elif name == "engine" and isinstance(value, dict):
            for k, v in value.items():
                out[f"engine.{k}"] = v
        else:
            out[name] = value
    return out


def changed_keys(old: msgspec.Struct, new: msgspec.Struct, fields: tuple[str, ...]) -> list[str]:
    """The dotted keys whose values differ between ``old`` and ``new`` (a key that disappears
    counts: its default applies again)."""
    a, b = flatten(old, fields), flatten(new, fields)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
