"""How ``blazar upgrade`` upgrades the install it runs from: a pure decision over where the
package lies and what installed it (pipx, ``uv tool``, a virtual environment), and the
command that does it; or a refusal that says what to run instead (a source checkout, a
system Python)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec

__all__ = ["Install", "UpgradePlan", "plan_upgrade"]

PACKAGE = "blazar"


class Install(msgspec.Struct, frozen=True, kw_only=True):
    """Where the running program is installed."""

    package_dir: str
    """The ``blazar`` package's folder (``blazar.__file__``'s parent)."""
    prefix: str
    """``sys.prefix``: the environment it runs in."""
    base_prefix: str
    """``sys.base_prefix``: differs from ``prefix`` in a virtual environment."""
    executable: str
    home: str
    env: Mapping[str, str] = {}
    has_pip: bool = True


class UpgradePlan(msgspec.Struct, frozen=True, kw_only=True):
    how: str
    """``pipx``, ``uv tool``, ``venv``, or ``source``/``system`` (refused)."""
    argv: list[str] | None
    """The command that upgrades; None when refused."""
    refusal: str | None = None
    """Why it cannot upgrade itself, and the command to run instead."""


def _under(path: str, root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def plan_upgrade(install: Install, version: str | None = None) -> UpgradePlan:
    """The command that upgrades ``install`` (to ``version``; None: the newest release)."""
    spec = f"{PACKAGE}=={version}" if version else PACKAGE
    env, home = install.env, Path(install.home)
    if "site-packages" not in Path(install.package_dir).parts:
        return UpgradePlan(
            how="source",
            argv=None,
            refusal=f"this blazar runs from a source checkout ({Path(install.package_dir).parent.name}/): "
            "upgrade it there with `git pull && make install`",
        )
    pipx_roots = [Path(env["PIPX_HOME"]) / "venvs"] if env.get("PIPX_HOME") else []
    pipx_roots += [home / ".local/share/pipx/venvs", home / ".local/pipx/venvs"]
    if any(_under(install.prefix, root) for root in pipx_roots):
        argv = ["pipx", "install", "--force", spec] if version else ["pipx", "upgrade", PACKAGE]
        return UpgradePlan(how="pipx", argv=argv)
    uv_roots = [Path(env["UV_TOOL_DIR"])] if env.get("UV_TOOL_DIR") else []
    data = Path(env["XDG_DATA_HOME"]) if env.get("XDG_DATA_HOME") else home / ".local/share"
    uv_roots.append(data / "uv/tools")
    if any(_under(install.prefix, root) for root in uv_roots):
        argv = ["uv", "tool", "install", "--force", spec] if version else ["uv", "tool", "upgrade", PACKAGE]
        return UpgradePlan(how="uv tool", argv=argv)
    if install.prefix != install.base_prefix:
        if install.has_pip:
            return UpgradePlan(
                how="venv", argv=[install.executable, "-m", "pip", "install", "--upgrade", spec]
            )
        return UpgradePlan(
            how="venv", argv=["uv", "pip", "install", "--python", install.executable, "--upgrade", spec]
        )
    return UpgradePlan(
        how="system",
        argv=None,
        refusal="this blazar is installed in the system's Python, which it will not change itself: "
        f"install it with `pipx install {PACKAGE}` (or `uv tool install {PACKAGE}`), or run "
        f"`{install.executable} -m pip install --user --upgrade {spec}` yourself",
    )
