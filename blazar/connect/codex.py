"""Codex CLI: a ``[model_providers.blazar]`` in ``$CODEX_HOME/config.toml`` on the Responses API.

The settings are those docs/clients.md found to work with Codex 0.171: ``web_search`` off (the
daemon refuses that tool with a 400) and no sub-agent tools (a smaller prompt)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import tomlkit
from tomlkit.exceptions import TOMLKitError

from blazar.config.toml_edit import put
from blazar.connect import _probes
from blazar.connect._plan import ConnectError, Context, Plan, Tool

__all__ = ["TOOL", "plan", "settings_path"]

PROVIDER = "blazar"
KEY_VARIABLE = "BLAZAR_API_KEY"


def settings_path(home: Path, env: Mapping[str, str]) -> Path:
    codex_home = env.get("CODEX_HOME")
    return (Path(codex_home) if codex_home else home / ".codex") / "config.toml"


def plan(ctx: Context, text: str | None) -> Plan:
    path = settings_path(ctx.home, ctx.env)
    try:
        doc = tomlkit.parse(text or "")
    except TOMLKitError as exc:
        raise ConnectError(f"{path} is not valid TOML ({exc}): fix it, then run connect again") from None
    # Values written in blazar's style, new keys after the user's last one (blazar.config.toml_edit).
    put(doc, "model", ctx.model)
    put(doc, "model_provider", PROVIDER)
    put(doc, "web_search", "disabled")
    providers = doc.get("model_providers")
    if providers is None:
        providers = tomlkit.table(is_super_table=True)
        put(doc, "model_providers", providers)
    provider = tomlkit.table()
    provider["name"] = "Blazar"
    provider["base_url"] = ctx.v1
    if ctx.key_given:
        # Codex reads a provider's key from the environment only, never from this file.
        provider["env_key"] = KEY_VARIABLE
    provider["wire_api"] = "responses"
    put(providers, PROVIDER, provider)
    features = doc.get("features")
    if features is None:
        features = tomlkit.table()
        put(doc, "features", features)
    put(features, "multi_agent", False)
    summary = [
        f'model = "{ctx.model}", model_provider = "{PROVIDER}", web_search = "disabled"',
        f'[model_providers.{PROVIDER}] base_url = "{ctx.v1}", wire_api = "responses"'
        + (f', env_key = "{KEY_VARIABLE}"' if ctx.key_given else ""),
        "[features] multi_agent = false (no sub-agent tools: a smaller prompt)",
    ]
    if ctx.key_given:
        summary.append(f"export {KEY_VARIABLE}=… before running codex (`blazar launch codex` sets it)")
    if len(ctx.models) > 1:
        summary.append("other models: codex -m " + " | ".join(ctx.models[1:]))
    return Plan(
        tool="codex",
        path=path,
        old_text=text,
        new_text=tomlkit.dumps(doc),
        summary=summary,
        probes=[_probes.responses(ctx)],
        models=list(ctx.models),
    )


TOOL = Tool(
    name="codex",
    title="Codex CLI",
    binaries=("codex",),
    markers=(".codex",),
    path=settings_path,
    plan=plan,
    # Codex CLI 0.171.0 with the settings above (web_search off, no sub-agent tools: 7 function
    # tools and its own instructions), counted with POST /v1/responses/input_tokens for SmolLM2's
    # tokenizer: 6,268, and 6,279 in a later run (docs/clients.md). Codex sends no
    # max_output_tokens, but it counts an `incomplete` answer as a failure: a cap would turn a
    # long answer into an error, so none is set for it.
    first_turn_tokens=6_280,
)
