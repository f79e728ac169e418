"""``blazar doctor`` (what is wrong with this install, and the safe repairs) and
``blazar explain`` (the settings a model runs with, and where each came from)."""

from __future__ import annotations

from typing import Any

import msgspec
from rich.table import Table

from blazar.cli import app
from blazar.cli._common import Json, out, print_json


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, dict)):
        return msgspec.json.encode(value).decode() if value else "-"
    return str(value)


@app.command
def explain(model: str, *, json_: Json = False) -> None:
    """Show the settings MODEL runs with (context, slots, engine, template, …) and where each came
    from: a built-in default, config.toml, the model itself, its [models."NAME"] table, or a request.

    With a daemon running, the daemon answers (a loaded engine shows what it runs with now);
    without one, the same resolution runs here."""
    from blazar.cli._common import load_setup
    from blazar.client import find_daemon

    paths, config = load_setup()
    daemon = find_daemon(paths)
    if daemon is not None:
        doc = daemon.get(f"/api/explain/{model}")
    else:
        import trio

        from actors.runtime import explain_offline

        doc = msgspec.to_builtins(trio.run(explain_offline, config.runtime(paths), model))
    if json_:
        print_json(doc)
        return
    state = "loaded" if doc["loaded"] else ("not loaded" if daemon else "no daemon running")
    out.print(f"[bold]{doc['model']}[/]  [dim]({state}; {doc['path']})[/]")
    table = Table("SETTING", "VALUE", "SOURCE", "WHERE", box=None)
    for s in doc["settings"]:
        where = " — ".join(p for p in (s.get("key"), s.get("note")) if p)
        table.add_row(s["name"], _show(s["value"]), s["source"], f"[dim]{where}[/]")
    out.print(table)
