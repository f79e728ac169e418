"""aider: ``~/.aider.conf.yml``. Without a key, the route docs/clients.md verified: litellm's
``ollama_chat/`` models with ``OLLAMA_API_BASE`` (set through aider's ``set-env``); with one,
its OpenAI route (``openai/NAME``, ``openai-api-base``, ``openai-api-key``), which sends it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from blazar.connect import _probes, _yaml
from blazar.connect._plan import ConnectError, Context, Plan, Tool

__all__ = ["TOOL", "plan", "settings_path"]

_VARIABLE = "OLLAMA_API_BASE"


def settings_path(home: Path, env: Mapping[str, str]) -> Path:
    return home / ".aider.conf.yml"


def plan(ctx: Context, text: str | None) -> Plan:
    path = settings_path(ctx.home, ctx.env)
    doc = _yaml.load(path, text, _yaml.CommentedMap())
    set_env = doc.get("set-env")
    if set_env is not None and not isinstance(set_env, list):
        set_env = _yaml.CommentedSeq([set_env])  # one value written as a scalar
    set_env = set_env if set_env is not None else _yaml.CommentedSeq()
    for i in reversed(range(len(set_env))):
        if str(set_env[i]).startswith(f"{_VARIABLE}="):
            del set_env[i]
    if ctx.key_given:
        doc["model"] = f"openai/{ctx.model}"
        doc["openai-api-base"] = ctx.v1
        doc["openai-api-key"] = ctx.key
        summary = [f"model: openai/{ctx.model}", f"openai-api-base: {ctx.v1}", "openai-api-key: (the key)"]
        probes = [_probes.chat_completions(ctx, user_agent="litellm aider", include_usage=False)]
    else:
        doc["model"] = f"ollama_chat/{ctx.model}"
        set_env.append(f"{_VARIABLE}={ctx.base_url}")
        summary = [f"model: ollama_chat/{ctx.model}", f"set-env: {_VARIABLE}={ctx.base_url}"]
        # litellm asks /api/show for the context length and tools before each turn.
        probes = [_probes.ollama_show(ctx), _probes.ollama_chat(ctx)]
    if set_env:
        doc["set-env"] = set_env
    elif "set-env" in doc:
        del doc["set-env"]
    if not isinstance(doc.get("model"), str):
        raise ConnectError(f"{path}: `model` could not be set")
    if len(ctx.models) > 1:
        prefix = "openai/" if ctx.key_given else "ollama_chat/"
        summary.append("other models: aider --model " + " | ".join(prefix + m for m in ctx.models[1:]))
    return Plan(
        tool="aider",
        path=path,
        old_text=text,
        new_text=_yaml.dump(doc),
        summary=summary,
        probes=probes,
        models=list(ctx.models),
    )


TOOL = Tool(
    name="aider",
    title="aider",
    binaries=("aider",),
    markers=(".aider.conf.yml",),
    path=settings_path,
    plan=plan,
    # aider 0.86.2's first /api/chat turn in tests/e2e/replays/aider_two_turns.json (no git
    # repository, no files added): 669 tokens sent (docs/clients.md). In a git repository its
    # repo map adds up to --map-tokens (1,024 by default) to it.
    first_turn_tokens=670,
    # litellm sends neither num_predict (/api/chat) nor max_tokens (openai/ route).
    output_cap=2048,
)
