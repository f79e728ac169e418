"""``blazar peers`` and ``blazar route``: the federation as the running daemon sees it.

Both ask the daemon (``GET /api/peers``, ``GET /api/route/MODEL``): the peers' states and
snapshots live in it. ``peers`` polls every peer first, so what it prints is current.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from blazar.cli import app
from blazar.cli._common import Json, human_size, out, print_json
from blazar.client import CliError, find_daemon
from blazar.config import resolve_paths

__all__ = ["peers", "route"]


def _daemon() -> Any:
    daemon = find_daemon(resolve_paths())
    if daemon is None:
        raise CliError("no daemon is running — start one with `blazar serve` (peers live in the daemon)")
    return daemon


def _size(n: int | None) -> str:
    return human_size(n) if n is not None else "-"


def _age(s: float | None) -> str:
    return f"{s:.1f} s" if s is not None else "never"


@app.command
def peers(*, json_: Json = False) -> None:
    """The [[remotes]] peers: state, age of the last snapshot, models (warm ones marked *), free memory."""
    doc = _daemon().get("/api/peers")
    if json_:
        print_json(doc)
        return
    if not doc["peers"]:
        out.print("no peers: add [[remotes]] entries to config.toml (docs/federation.md)")
        return
    table = Table("PEER", "URL", "STATE", "KIND", "SNAPSHOT AGE", "FREE", "MODELS", box=None)
    for p in doc["peers"]:
        snap = p["snapshot"] or {}
        warm = {m["model"] for m in snap.get("loaded", [])}
        models = ", ".join(m["name"] + ("*" if m["name"] in warm else "") for m in snap.get("installed", []))
        state = p["state"] if p["state"] != "down" else f"down ({p['last_error']})"
        kind = {"openai": "pass-through", "blazar": "blazar"}.get(p["kind"] or "", "-")
        table.add_row(
            p["name"], p["url"], state, kind, _age(p["snapshot_age_s"]),
            _size(snap.get("free_bytes")), models or "-",
        )  # fmt: skip
    out.print(table)


@app.command
def route(model: str, /, *, json_: Json = False) -> None:
    """Where a request for MODEL would go now: every candidate, its numbers, and why the winner won."""
    doc = _daemon().get(f"/api/route/{model}")
    if json_:
        print_json(doc)
        return
    table = Table("RANK", "WHERE", "WARM", "WAIT", "FREE", "MODEL NEEDS", "LEFT", "NOTE", box=None)
    for c in doc["candidates"]:
        wait = c["expected_wait_s"]
        note = c["skipped"] or ("pass-through" if c["pass_through"] else "")
        table.add_row(
            str(c["rank"]) if c["rank"] is not None else "-", c["where"], "yes" if c["warm"] else "no",
            f"{wait:.1f} s" if wait is not None else "-", _size(c["free_bytes"]), _size(c["fit_bytes"]),
            _size(c["headroom_bytes"]), note,
        )  # fmt: skip
    out.print(table)
    if doc["winner"] is None:
        out.print(f"nowhere: {doc['why']}")
    else:
        out.print(f"→ {doc['winner']}: {doc['why']}")
