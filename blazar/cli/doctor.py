"""``blazar doctor`` (what is wrong with this install, and the safe repairs) and
``blazar explain`` (the settings a model runs with, and where each came from)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import msgspec
from cyclopts import Parameter
from rich.table import Table

from blazar.cli import app
from blazar.cli._common import Json, out, print_json

_MARK = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "error": "[red]error[/]"}


@app.command
def doctor(
    *,
    fix: Annotated[bool, Parameter(negative="", help="Repair the safe findings (marked fixable).")] = False,
    deep: Annotated[bool, Parameter(negative="", help="Hash every model file (sha256); slow.")] = False,
    json_: Json = False,
) -> None:
    """Check this install: the machine, engines, models and their files, config, port, pid files,
    orphan engines, ledger and disk. Each finding says what to do next.

    --fix repairs only what loses nothing (stale pid files, orphan engines, unfinished downloads)
    and says what it did; it never deletes a complete model file or the ledger. Exits 1 while an
    error remains."""
    from blazar.config import resolve_paths
    from blazar.diagnose import diagnose

    result = diagnose(resolve_paths(), fix=fix, deep=deep)
    if json_:
        print_json(result)
    else:
        for done in result.fixed:
            out.print(
                f"[bold]fixed[/] {done.code}: {done.done}"
                if done.ok
                else f"[bold]not fixed[/] {done.code}: {done.done}"
            )
        table = Table("", "CODE", "FINDING", box=None)
        for f in result.findings:
            text = f.message + (f"\n[dim]→ {f.hint}[/]" if f.hint and f.severity != "ok" else "")
            if f.fixable:
                text += " [dim](fixable: --fix)[/]"
            table.add_row(_MARK[f.severity], f.code, text)
        out.print(table)
        out.print(f"{result.errors} error(s), {result.warnings} warning(s)")
    if not result.ok:
        sys.exit(1)


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
    from blazar.cli._common import daemon_or_here, load_setup, run_offline

    paths, config = load_setup()
    doc, daemon = daemon_or_here(
        paths, f"/api/explain/{model}", lambda: run_offline("explain_offline", config.runtime(paths), model)
    )
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
