"""``blazar upgrade``: upgrade the install this command runs from."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

import blazar
from blazar.cli._app import app
from blazar.cli._common import out
from blazar.daemon.client import CliError


@app.command
def upgrade(
    *,
    version: Annotated[str | None, Parameter(help="Install this version (default: the newest).")] = None,
    dry_run: Annotated[bool, Parameter(negative="", help="Say the command; run nothing.")] = False,
) -> None:
    """Upgrade blazar where it is installed (pipx, uv tool or a virtual environment).

    A running daemon keeps its version until it is restarted (`blazar stop`, then start it)."""
    from blazar.ops.upgrade import Install, plan_upgrade

    install = Install(
        package_dir=str(Path(blazar.__file__).resolve().parent),
        prefix=sys.prefix,
        base_prefix=sys.base_prefix,
        executable=sys.executable,
        home=str(Path.home()),
        env=dict(os.environ),
        has_pip=importlib.util.find_spec("pip") is not None,
    )
    plan = plan_upgrade(install, version)
    if plan.argv is None:
        raise CliError(plan.refusal or "this install cannot upgrade itself")
    shown = " ".join(plan.argv)
    if dry_run:
        out.print(f"would run ({plan.how}): {shown}", markup=False)
        return
    out.print(f"upgrading ({plan.how}): {shown}", markup=False)
    try:
        done = subprocess.run(plan.argv, check=False)
    except FileNotFoundError:
        raise CliError(f"{plan.argv[0]} is not on PATH: run `{shown}` where it is") from None
    if done.returncode != 0:
        raise CliError(f"the upgrade failed (exit {done.returncode}): `{shown}` says why above")
    out.print("upgraded; restart a running daemon to use the new version (`blazar stop`)", markup=False)
