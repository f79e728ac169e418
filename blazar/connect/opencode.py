"""opencode: a ``blazar`` provider in ``~/.config/opencode/opencode.json`` through the AI SDK's
OpenAI-compatible package (``@ai-sdk/openai-compatible``, which opencode installs itself)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from blazar.connect import _probes
from blazar.connect._plan import ConnectError, Context, Plan, Tool, config_home
from blazar.connect.claude import dump, load_object

__all__ = ["TOOL", "plan", "settings_path"]

PROVIDER = "blazar"


def settings_path(home: Path, env: Mapping[str, str]) -> Path:
    return config_home(home, env) / "opencode" / "opencode.json"


def plan(ctx: Context, text: str | None) -> Plan:
    path = settings_path(ctx.home, ctx.env)
    doc = load_object(path, text)
    if not doc:
        doc["$schema"] = "https://opencode.ai/config.json"
    providers = doc.setdefault("provider", {})
    if not isinstance(providers, dict):
        raise ConnectError(f"{path}: `provider` is not an object")
    providers[PROVIDER] = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Blazar",
        "options": {"baseURL": ctx.v1, "apiKey": ctx.key},
        "models": {name: {"name": name} for name in ctx.models},
    }
    summary = [
        f'provider.{PROVIDER}: npm "@ai-sdk/openai-compatible", baseURL "{ctx.v1}"',
        "models: " + ", ".join(ctx.models),
    ]
    if "model" not in doc:
        doc["model"] = f"{PROVIDER}/{ctx.model}"
        summary.append(f'model = "{PROVIDER}/{ctx.model}" (the default)')
    else:
        summary.append(f"model kept as {doc['model']!r}: pick {PROVIDER}/{ctx.model} with /models")
    return Plan(
        tool="opencode",
        path=path,
        old_text=text,
        new_text=dump(doc),
        summary=summary,
        probes=[_probes.chat_completions(ctx, user_agent="opencode ai-sdk/openai-compatible")],
        models=list(ctx.models),
    )


TOOL = Tool(
    name="opencode",
    title="opencode",
    binaries=("opencode",),
    markers=(".config/opencode",),
    path=settings_path,
    plan=plan,
    # opencode 1.18.33's first turn through the provider above (its system prompt and tool
    # schemas): 7,238 tokens for SmolLM2's tokenizer (docs/clients.md).
    first_turn_tokens=7_240,
)
