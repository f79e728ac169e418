"""Continue: model entries in ``~/.continue/config.yaml`` with its ``openai`` provider and the
daemon's ``apiBase``. Entries made before for the same daemon are replaced, never doubled."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from blazar.connect import _probes, _yaml
from blazar.connect._plan import ConnectError, Context, Plan, Tool

__all__ = ["TOOL", "plan", "settings_path"]


def settings_path(home: Path, env: Mapping[str, str]) -> Path:
    global_dir = env.get("CONTINUE_GLOBAL_DIR")
    return (Path(global_dir) if global_dir else home / ".continue") / "config.yaml"


def plan(ctx: Context, text: str | None) -> Plan:
    path = settings_path(ctx.home, ctx.env)
    doc = _yaml.load(path, text, _yaml.CommentedMap())
    if not doc:
        doc["name"] = "Local config"
        doc["version"] = "1.0.0"
        doc["schema"] = "v1"
    models = doc.get("models")
    if models is None:
        models = _yaml.CommentedSeq()
        doc["models"] = models
    if not isinstance(models, list):
        raise ConnectError(f"{path}: `models` is not a list")
    ours = [i for i, m in enumerate(models) if isinstance(m, dict) and m.get("apiBase") == ctx.v1]
    for i in reversed(ours):
        del models[i]
    for name in ctx.models:
        entry = _yaml.CommentedMap()
        entry["name"] = f"{name} (Blazar)"
        entry["provider"] = "openai"
        entry["model"] = name
        entry["apiBase"] = ctx.v1
        entry["apiKey"] = ctx.key
        entry["roles"] = _yaml.CommentedSeq(["chat", "edit", "apply"])
        models.append(entry)
    summary = [f'models: + {{provider: openai, model: {n}, apiBase: "{ctx.v1}"}}' for n in ctx.models]
    if ours:
        summary.append(f"replaces {len(ours)} entr{'y' if len(ours) == 1 else 'ies'} for the same daemon")
    if (path.parent / "config.json").exists() and text is None:
        summary.append("note: ~/.continue/config.json is the old format; Continue reads config.yaml first")
    return Plan(
        tool="continue",
        path=path,
        old_text=text,
        new_text=_yaml.dump(doc),
        summary=summary,
        probes=[_probes.chat_completions(ctx, user_agent="Continue openai")],
        models=list(ctx.models),
    )


TOOL = Tool(
    name="continue",
    title="Continue",
    binaries=("cn",),
    markers=(".continue", ".vscode/extensions/continue.continue-*"),
    path=settings_path,
    plan=plan,
)
