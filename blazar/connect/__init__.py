"""``blazar connect``: point coding tools and chat front-ends at the daemon.

One pure module per tool family turns (home, environment, base URL, key, models, the file's
text now) into a ``Plan``: the file, its new text, what changes, and the request the tool
would send. ``apply`` writes a plan with a backup and undoes it when that request fails;
``launch`` builds the environment ``blazar launch`` runs a tool in."""

from __future__ import annotations

import glob
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec

from blazar.connect import aider, claude, codex, continue_dev, llm_cli, manual, opencode
from blazar.connect._plan import ConnectError, Context, Plan, Probe, Tool

__all__ = [
    "TOOLS",
    "ConnectError",
    "Context",
    "ModelChoice",
    "Plan",
    "Probe",
    "Tool",
    "choose_models",
    "context",
    "find_tool",
    "installed",
    "plan_for",
    "read_text",
]

TOOLS: tuple[Tool, ...] = (
    codex.TOOL,
    claude.TOOL,
    opencode.TOOL,
    continue_dev.TOOL,
    manual.CLINE,
    manual.OPEN_WEBUI,
    aider.TOOL,
    llm_cli.TOOL,
)

_ALIASES = {"claude-code": "claude", "openwebui": "open-webui", "continue.dev": "continue"}


def find_tool(name: str) -> Tool:
    wanted = _ALIASES.get(name.lower(), name.lower())
    for tool in TOOLS:
        if tool.name == wanted:
            return tool
    known = ", ".join(t.name for t in TOOLS)
    raise ConnectError(f"no tool named {name!r} — connect knows {known}")


def installed(tool: Tool, home: Path, path_env: str | None) -> bool:
    """The tool's command is on PATH, or its config directory (or extension) is in the home."""
    if any(shutil.which(binary, path=path_env) for binary in tool.binaries):
        return True
    return any(glob.glob(str(home / marker)) for marker in tool.markers)


class ModelChoice(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    native_tools: bool
    """The chat template takes tools (others get tool calls emulated: slower, less reliable)."""
    params: int = 0
    ctx_train: int | None = None
    """Its training context (GGUF ``context_length``); None: the header does not say."""


def choose_models(candidates: Iterable[ModelChoice], *, all_models: bool = False) -> tuple[str, ...]:
    """Best first: native tool calling, then the larger model; the best alone unless ``all_models``."""
    ranked = sorted(candidates, key=lambda m: (not m.native_tools, -m.params, m.name))
    names = tuple(m.name for m in ranked)
    return names if all_models else names[:1]


def read_text(path: Path | None) -> str | None:
    if path is None or not path.exists():
        return None
    try:
        return path.read_bytes().decode()  # not read_text(): its newline translation loses \r\n
    except UnicodeDecodeError:
        raise ConnectError(f"{path} is not UTF-8 text: connect leaves it alone") from None


def plan_for(tool: Tool, ctx: Context) -> Plan:
    return tool.plan(ctx, read_text(tool.path(ctx.home, ctx.env)))


def context(
    *, home: Path, env: Mapping[str, str], base_url: str, key: str | None, models: tuple[str, ...]
) -> Context:
    return Context(
        home=home,
        env=dict(env),
        base_url=base_url.rstrip("/"),
        key=key or "local",
        key_given=key is not None,
        models=models,
    )
