"""Tools whose settings have no stable file to edit: Cline (VS Code keeps them in the extension's
own storage) and Open WebUI (environment variables read at its first start, then its database).
Their plans print what to enter; ``--write`` sends their test requests and changes nothing."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from blazar.connect import _probes
from blazar.connect._plan import Context, Plan, Tool

__all__ = ["CLINE", "OPEN_WEBUI"]


def _no_file(home: Path, env: Mapping[str, str]) -> Path | None:
    return None


def cline_plan(ctx: Context, text: str | None) -> Plan:
    summary = [
        "Cline keeps its provider settings in VS Code's extension storage, not in a file to edit:",
        "enter them in Cline's settings panel —",
        "  API Provider: OpenAI Compatible",
        f"  Base URL:     {ctx.v1}",
        f"  API Key:      {ctx.key}",
        f"  Model ID:     {ctx.model}",
    ]
    if len(ctx.models) > 1:
        summary.append("  other models: " + ", ".join(ctx.models[1:]))
    return Plan(
        tool="cline",
        path=None,
        old_text=None,
        new_text=None,
        summary=summary,
        probes=[_probes.chat_completions(ctx, user_agent="Cline OpenAI/JS")],
        models=list(ctx.models),
    )


def open_webui_plan(ctx: Context, text: str | None) -> Plan:
    summary = [
        "Open WebUI reads these at its first start (later, set them under Admin Settings → Connections):",
        f"  OPENAI_API_BASE_URL={ctx.v1}",
        f"  OPENAI_API_KEY={ctx.key}",
        f"  OLLAMA_BASE_URL={ctx.base_url}",
        "  (in Docker, the daemon is at host.docker.internal, and it must listen beyond loopback)",
        "models: " + ", ".join(ctx.models),
    ]
    return Plan(
        tool="open-webui",
        path=None,
        old_text=None,
        new_text=None,
        summary=summary,
        probes=[_probes.list_models(ctx), _probes.ollama_tags(ctx)],
        models=list(ctx.models),
    )


CLINE = Tool(
    name="cline",
    title="Cline",
    binaries=("cline",),
    markers=(
        ".vscode/extensions/saoudrizwan.claude-dev-*",
        ".vscode-server/extensions/saoudrizwan.claude-dev-*",
    ),
    path=_no_file,
    plan=cline_plan,
)

OPEN_WEBUI = Tool(
    name="open-webui",
    title="Open WebUI",
    binaries=("open-webui",),
    markers=(),
    path=_no_file,
    plan=open_webui_plan,
)
