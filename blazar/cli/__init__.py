"""The ``blazar`` command line.

Every failing command prints one line that says what went wrong and what to
run next, and exits non-zero; tracebacks only with ``BLAZAR_DEBUG=1``.

The commands live by theme in ``serving``, ``models``, ``fit``, ``disk``, ``keys``, ``config`` and
``connect``; each registers itself on ``app`` when imported below. Shared helpers are in ``_common``.
"""

from __future__ import annotations

import os
import sys

import cyclopts

from blazar import __version__
from blazar.cli._common import err
from blazar.config import ConfigError
from blazar.daemon.client import CliError

__all__ = ["app", "main"]

app = cyclopts.App(name="blazar", help="A control plane for local AI inference.", version=__version__)

# Imported for their side effect: each module's @app.command decorators register its commands.
from blazar.cli import (  # noqa: E402, F401
    autopilot,
    certify,
    config,
    connect,
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
    rpc,
    serving,
    sessions,
    snapshot,
    speech,
    tune,
    watch,
    why,
)


def main(argv: list[str] | None = None) -> None:
    try:
        app(argv if argv is not None else sys.argv[1:])
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:
        if os.environ.get("BLAZAR_DEBUG"):
            raise
        sys.stderr.write(f"error: {_one_line(exc)}\n")
        sys.exit(1)


def _one_line(exc: BaseException) -> str:
    from blazar.errors.describe import describe_error

    # A failure inside the daemon's task tree arrives wrapped in exception groups:
    # the line names the failure itself (the first one when several happened at once).
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, (CliError, ConfigError)):
        return str(exc)
    if (described := describe_error(exc)) is not None:
        retry = described.retry_after
        return described.message + (f" (retry in {retry} s)" if retry is not None else "")
    import httpx

    if isinstance(exc, httpx.HTTPError):
        return f"could not reach the daemon ({exc}) — check `blazar ps` and `blazar logs`"
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc} ({exc.filename or ''})".strip()
    return f"{type(exc).__name__}: {exc}"
