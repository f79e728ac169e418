"""Helpers every command module of the ``blazar`` CLI shares: consoles, config, the store, formatting."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import msgspec
from cyclopts import Parameter
from rich.console import Console

from blazar.client import Daemon, find_daemon
from blazar.config import Config, Paths, load_config, resolve_paths

__all__ = [
    "Json",
    "daemon_or_here",
    "err",
    "forget",
    "human_params",
    "human_size",
    "load_setup",
    "open_store",
    "out",
    "print_json",
    "remove_model",
    "run_offline",
    "time_ago",
]

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

Json = Annotated[bool, Parameter(name="--json", negative="", help="Print JSON instead of a table.")]


def load_setup() -> tuple[Paths, Config]:
    paths = resolve_paths()
    return paths, load_config(paths)


def open_store(paths: Paths) -> Any:
    from registry.store import Store

    return Store(Path(paths.models_dir))


def forget(paths: Paths, name: str) -> None:
    """Make a running daemon drop its engine for ``name`` (the file behind the name changed)."""
    daemon = find_daemon(paths)
    if daemon is not None:
        daemon.post(f"/admin/models/{name}/forget")


def remove_model(paths: Paths, name: str) -> Any:
    """Delete ``name`` from the store, through the daemon when one runs (it owns the engines)."""
    store = open_store(paths)
    record = store.get(name)
    daemon = find_daemon(paths)
    if daemon is not None:
        # The daemon owns running engines: it refuses while the model serves, else stops it first.
        daemon.delete("/api/delete", {"model": record.name})
    else:
        store.remove(record.name)
    return record


def daemon_or_here(paths: Paths, route: str, here: Callable[[], Any]) -> tuple[Any, Daemon | None]:
    """A running daemon's answer at ``route`` (it knows what only memory holds), else what
    ``here`` works out locally, as plain JSON values; and the daemon, if one answered."""
    daemon = find_daemon(paths)
    if daemon is not None:
        return daemon.get(route), daemon
    return msgspec.to_builtins(here()), None


def run_offline(name: str, *args: Any) -> Any:
    """``actors.offline``'s twin of a daemon route (``plan_offline``, ``explain_offline``)
    run here; Trio and the runtime are imported only then, not by every command."""
    import trio

    from actors import offline

    return trio.run(getattr(offline, name), *args)


def print_json(obj: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(obj), indent=2).decode() + "\n")


def human_size(n: int | float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def human_params(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n < 1e9 else f"{n / 1e9:.2f}B"


def time_ago(ts: float) -> str:
    delta = max(0.0, time.time() - ts)
    for secs, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if delta >= secs:
            n = int(delta // secs)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"
