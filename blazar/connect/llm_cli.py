"""The ``llm`` CLI: entries in ``extra-openai-models.yaml`` in its user directory
(``$LLM_USER_PATH``, else ``io.datasette.llm`` under the config directory), one per model,
named ``blazar/NAME``. Entries for the same daemon are replaced, never doubled."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from blazar.connect import _probes, _yaml
from blazar.connect._plan import Context, Plan, Tool, config_home

__all__ = ["TOOL", "plan", "settings_path"]

KEY_NAME = "blazar"


def user_dir(home: Path, env: Mapping[str, str]) -> Path:
    if user_path := env.get("LLM_USER_PATH"):
        return Path(user_path)
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "io.datasette.llm"
    return config_home(home, env) / "io.datasette.llm"


def settings_path(home: Path, env: Mapping[str, str]) -> Path:
    return user_dir(home, env) / "extra-openai-models.yaml"


def plan(ctx: Context, text: str | None) -> Plan:
    path = settings_path(ctx.home, ctx.env)
    doc = _yaml.load(path, text, _yaml.CommentedSeq())
    ours = [i for i, m in enumerate(doc) if isinstance(m, dict) and m.get("api_base") == ctx.v1]
    for i in reversed(ours):
        del doc[i]
    for name in ctx.models:
        entry = _yaml.CommentedMap()
        entry["model_id"] = f"blazar/{name}"
        entry["model_name"] = name
        entry["api_base"] = ctx.v1
        if ctx.key_given:
            entry["api_key_name"] = KEY_NAME
        entry["can_stream"] = True
        entry["supports_tools"] = True
        doc.append(entry)
    summary = [f'- model_id: blazar/{n}, model_name: {n}, api_base: "{ctx.v1}"' for n in ctx.models]
    if ctx.key_given:
        summary.append(f"api_key_name: {KEY_NAME} — store the key once with `llm keys set {KEY_NAME}`")
    summary.append(f"use: llm -m blazar/{ctx.model} 'Say hello'")
    return Plan(
        tool="llm",
        path=path,
        old_text=text,
        new_text=_yaml.dump(doc),
        summary=summary,
        probes=[_probes.chat_completions(ctx, user_agent="llm OpenAI/Python")],
        models=list(ctx.models),
    )


TOOL = Tool(
    name="llm",
    title="llm (Simon Willison's CLI)",
    binaries=("llm",),
    markers=(),
    path=settings_path,
    plan=plan,
    # Not recorded: an estimate. llm sends the prompt alone (no system prompt unless -s, tools
    # only with -T), so a first turn is the user's words and the chat template's few tokens.
    first_turn_tokens=50,
    # Neither its OpenAI route nor llm-ollama sends max_tokens / num_predict unless asked (-o).
    output_cap=2048,
)
