"""The cyclopts app with every command of the ``blazar`` CLI: each module below registers its
commands on ``app`` when it is imported."""

from __future__ import annotations

import cyclopts

from blazar import __version__

__all__ = ["app"]

app: cyclopts.App = cyclopts.App(
    name="blazar", help="A control plane for local AI inference.", version=__version__
)

# Imported for their side effect: each module's @app.command decorators register its commands.
from blazar.cli import (  # noqa: E402, F401
    autopilot,
    certify,
    config,
    connect,
    control,
    decide,
    disk,
    doctor,
    engine,
    federation,
    fit,
    jobs,
    keys,
    lora,
    mcp,
    models,
    quantize,
    rpc,
    serving,
    sessions,
    shell,
    snapshot,
    speech,
    tune,
    upgrade,
    watch,
    why,
)
