"""Claude Code: the ``env`` block of its user settings (``~/.claude/settings.json``).

Claude Code applies that block to every session: the base URL, a bearer token (any word while
the daemon has no keys), and the model names it uses for its main and side tasks."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from blazar.connect import _probes
from blazar.connect._plan import ConnectError, Context, Plan, Tool

__all__ = ["TOOL", "env_block", "plan", "settings_path"]


def settings_path(home: Path, env: Mapping[str, str]) -> Path:
    config_dir = env.get("CLAUDE_CONFIG_DIR")
    return (Path(config_dir) if config_dir else home / ".claude") / "settings.json"


def env_block(ctx: Context) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": ctx.base_url,
        "ANTHROPIC_AUTH_TOKEN": ctx.key,
        "ANTHROPIC_MODEL": ctx.model,
        # Side tasks (titles, summaries) go to the same local model, not to names the daemon lacks.
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": ctx.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": ctx.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # Claude Code's per-prompt attribution block would defeat the engine's prompt cache.
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
    }


def load_object(path: Path, text: str | None) -> dict[str, Any]:
    """The JSON object in ``text`` (empty when there is no file), or a ConnectError saying why not."""
    if text is None or not text.strip():
        return {}
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConnectError(
            f"{path} is not plain JSON ({exc}); comments or trailing commas cannot be kept by a "
            "rewrite: remove them, or add the settings shown by `blazar connect` by hand"
        ) from None
    if not isinstance(doc, dict):
        raise ConnectError(f"{path} does not hold a JSON object")
    return doc


def dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def plan(ctx: Context, text: str | None) -> Plan:
    path = settings_path(ctx.home, ctx.env)
    doc = load_object(path, text)
    env = doc.get("env")
    if env is not None and not isinstance(env, dict):
        raise ConnectError(f"{path}: `env` is not an object")
    block = env_block(ctx)
    # Both set, Claude Code warns of a conflict: the token replaces a key set here before.
    merged = {k: v for k, v in (env or {}).items() if k != "ANTHROPIC_API_KEY"} | block
    doc["env"] = merged
    summary = [f"env.{k} = {v!r}" for k, v in block.items()]
    if env and "ANTHROPIC_API_KEY" in env:
        summary.append("env.ANTHROPIC_API_KEY removed (the token above replaces it)")
    if len(ctx.models) > 1:
        summary.append("other models: claude --model " + " | ".join(ctx.models[1:]))
    return Plan(
        tool="claude",
        path=path,
        old_text=text,
        new_text=dump(doc),
        summary=summary,
        probes=[_probes.anthropic_messages(ctx)],
        models=list(ctx.models),
    )


TOOL = Tool(
    name="claude",
    title="Claude Code",
    binaries=("claude",),
    markers=(".claude",),
    path=settings_path,
    plan=plan,
    # Claude Code 2.1.197's first turn with its default tools, as recorded in
    # tests/e2e/replays/claude_code_first.json: 18,958 tokens for SmolLM2's tokenizer, 18,996 in a
    # later run (docs/clients.md). It sends max_tokens (32,000) itself: no cap is set for it.
    first_turn_tokens=19_000,
)
