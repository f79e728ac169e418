"""Helpers every command module of the ``blazar`` CLI shares: consoles, config, the store, formatting."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any

import msgspec
from cyclopts import Parameter
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from blazar.config import Config, Paths, load_config, resolve_paths
from blazar.daemon.client import Daemon, find_daemon

__all__ = [
    "Json",
    "daemon_or_here",
    "err",
    "forget",
    "human_params",
    "human_size",
    "listing",
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


def refresh(paths: Paths, name: str) -> None:
    """Make a running daemon's engine for ``name`` restart with what the store now says, once
    its requests have finished."""
    daemon = find_daemon(paths)
    if daemon is not None:
        daemon.post(f"/admin/models/{name}/refresh")


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


def listing(
    headers: Sequence[str],
    rows: Iterable[Sequence[str | Text]],
    *,
    whole: Collection[str] = ("NAME",),
    wrap: Collection[str] = (),
    drop: Sequence[str] = (),
) -> Table:
    """A borderless table (print it with ``out``) whose ``whole`` columns are never cut or
    wrapped: they hold the names a user types next. Where the terminal is too narrow, the
    ``drop`` columns go (in that order) until the rest fits with the ``wrap`` columns (free
    text) wrapped at spaces, 20 cells wide at least; the other columns stay on one line. Only
    where even that is too wide do the columns but ``whole`` wrap and fold their long words,
    down to 8 cells (never cut short with '…'). Output to a pipe or a file (no terminal, no
    ``$COLUMNS``) is printed whole, for grep and awk.

    A ``str`` cell is plain text, never markup (names and paths may hold ``[``); give a
    ``rich.text.Text`` for style."""
    cells = [[cell if isinstance(cell, Text) else Text(cell) for cell in row] for row in rows]
    columns = [[Text(h), *(row[i] for row in cells)] for i, h in enumerate(headers)]
    full = [max(cell_len(line) for t in col for line in t.plain.splitlines() or [""]) for col in columns]
    word = [max((cell_len(w) for t in col for w in t.plain.split()), default=1) for col in columns]
    shown = list(range(len(headers)))
    widths = [max(f, 1) for f in full]
    room = _listing_width()
    if room is not None:
        pad = 2  # rich's cell padding: a space either side
        # a wrap column fits when it gets 20 cells (or its longest word): narrower text is
        # harder to read than a column fewer
        need = [
            min(widths[i], max(word[i], 20)) if h in wrap and h not in whole else widths[i]
            for i, h in enumerate(headers)
        ]
        for name in drop:
            if sum(need[i] + pad for i in shown) <= room:
                break
            if name in headers:
                shown.remove(headers.index(name))
        excess = sum(widths[i] + pad for i in shown) - room
        # narrow the widest column that may narrow, a cell at a time: first the wrap columns
        # down to their longest word, then, as a last resort, every column but the whole ones
        # down to 8 cells or their longest word
        for narrowable, floor in (
            ([i for i in shown if headers[i] in wrap and headers[i] not in whole], word),
            ([i for i in shown if headers[i] not in whole], [min(w, 8) for w in word]),
        ):
            while excess > 0:
                wide = [i for i in narrowable if widths[i] > floor[i]]
                if not wide:
                    break
                widest = max(wide, key=lambda i: widths[i])
                widths[widest] -= 1
                excess -= 1
    table = Table(box=None, width=sum(widths[i] + 2 for i in shown))
    for i in shown:
        name = headers[i]
        table.add_column(name, width=widths[i], no_wrap=name in whole, overflow="fold")
    for row in cells:
        table.add_row(*(row[i] for i in shown))
    return table


def _listing_width() -> int | None:
    """The cells a listing's line must fit in: ``$COLUMNS``, else the terminal's width; None
    when the output goes to a pipe or a file."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return out.width if out.is_terminal else None
