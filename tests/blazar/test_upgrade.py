"""``blazar upgrade``: the command for each kind of install, and the refusals that say what
to run instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from blazar.ops.upgrade import Install, plan_upgrade

ROOT = Path(__file__).parents[2]
HOME = "/home/me"


def _install(prefix: str, *, base: str = "/usr", has_pip: bool = True, **env: str) -> Install:
    return Install(
        package_dir=f"{prefix}/lib/python3.11/site-packages/blazar",
        prefix=prefix,
        base_prefix=base,
        executable=f"{prefix}/bin/python",
        home=HOME,
        env=env,
        has_pip=has_pip,
    )


@pytest.mark.parametrize(
    ("install", "version", "how", "argv"),
    [
        (_install(f"{HOME}/.local/share/pipx/venvs/blazar"), None, "pipx", ["pipx", "upgrade", "blazar"]),
        (
            _install(f"{HOME}/.local/share/pipx/venvs/blazar"),
            "0.2.0",
            "pipx",
            ["pipx", "install", "--force", "blazar==0.2.0"],
        ),
        (
            _install("/opt/pipx/venvs/blazar", PIPX_HOME="/opt/pipx"),
            None,
            "pipx",
            ["pipx", "upgrade", "blazar"],
        ),
        (
            _install(f"{HOME}/.local/share/uv/tools/blazar"),
            None,
            "uv tool",
            ["uv", "tool", "upgrade", "blazar"],
        ),
        (
            _install("/data/uv/tools/blazar", XDG_DATA_HOME="/data"),
            "0.2.0",
            "uv tool",
            ["uv", "tool", "install", "--force", "blazar==0.2.0"],
        ),
        (
            _install("/srv/venv"),
            None,
            "venv",
            ["/srv/venv/bin/python", "-m", "pip", "install", "--upgrade", "blazar"],
        ),
        (
            _install("/srv/venv", has_pip=False),
            "0.2.0",
            "venv",
            ["uv", "pip", "install", "--python", "/srv/venv/bin/python", "--upgrade", "blazar==0.2.0"],
        ),
    ],
)
def test_each_install_gets_its_own_command(
    install: Install, version: str | None, how: str, argv: list[str]
) -> None:
    plan = plan_upgrade(install, version)
    assert (plan.how, plan.argv, plan.refusal) == (how, argv, None)


def test_a_system_python_is_refused_with_what_to_run() -> None:
    plan = plan_upgrade(_install("/usr", base="/usr"))
    assert plan.argv is None and plan.how == "system"
    assert plan.refusal is not None and "pipx install blazar" in plan.refusal


def test_this_source_checkout_refuses_and_says_how(tmp_path: Path) -> None:
    """Run for real: the development install is a source checkout, which upgrades with git."""
    done = subprocess.run(
        [sys.executable, "-m", "blazar", "upgrade", "--dry-run"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 1
    assert "source checkout" in done.stderr and "git pull && make install" in done.stderr
