"""``blazar peers``, ``route``, ``warm`` and ``replicate``: the federation as the running
daemon sees it, and the operator verbs on its peers.

All ask the daemon (``GET /api/peers``, ``GET /api/route/MODEL``, ``POST /admin/peers/PEER/…``):
the peers' states, snapshots and keys live in it. ``peers`` polls every peer first, so what it
prints is current.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from cyclopts import Parameter
from rich.table import Table

from blazar.cli import app
from blazar.cli._common import Json, human_size, listing, out, print_json
from blazar.config import resolve_paths
from blazar.daemon.client import CliError, Daemon, error_message, find_daemon

__all__ = ["peers", "replicate", "route", "warm"]


def _daemon() -> Daemon:
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
    rows = []
    for p in doc["peers"]:
        snap = p["snapshot"] or {}
        warm = {m["model"] for m in snap.get("loaded", [])}
        models = ", ".join(m["name"] + ("*" if m["name"] in warm else "") for m in snap.get("installed", []))
        state = p["state"] if p["state"] != "down" else f"down ({p['last_error']})"
        kind = {"openai": "pass-through", "blazar": "blazar"}.get(p["kind"] or "", "-")
        if p.get("pool"):
            kind = f"pool ({p['pool']})"
            healthy = sum(1 for w in snap.get("workers") or [] if w.get("healthy"))
            models += f" [{healthy}/{len(snap.get('workers') or [])} workers healthy]"
        rows.append((
            p["name"], p["url"], state, kind, _age(p["snapshot_age_s"]),
            _size(snap.get("free_bytes")), models or "-",
        ))  # fmt: skip
    headers = ("PEER", "URL", "STATE", "KIND", "SNAPSHOT AGE", "FREE", "MODELS")
    drop = ("KIND", "SNAPSHOT AGE", "URL")
    out.print(listing(headers, rows, whole=("PEER",), wrap=("STATE", "MODELS"), drop=drop))
    for pool in doc.get("pools", []):
        _print_pool(pool, next((p for p in doc["peers"] if p["name"] == pool["name"]), None))


def _print_pool(pool: dict[str, Any], peer: dict[str, Any] | None) -> None:
    """A pool's router and workers: as the router lists them, and what this daemon registered."""
    started = pool.get("started")
    where = (
        f"started here ({started['state']}, pid {started['pid'] or '-'})" if started else "reached at its url"
    )
    out.print(
        f"\npool {pool['name']}: {pool['router']} router {where}; models {', '.join(pool['models']) or '-'}"
    )
    if started and started.get("last_error"):
        out.print(f"  last error: {started['last_error']}")
    listed = {w["url"]: w for w in ((peer or {}).get("snapshot") or {}).get("workers") or []}
    mine = {r["url"]: r for r in pool["registrations"] if r["url"]}
    rows = []
    for url in sorted(listed.keys() | mine.keys()):
        w, r = listed.get(url, {}), mine.get(url, {})
        health = {True: "healthy", False: "unhealthy"}.get(w.get("healthy"), "-")
        rows.append(
            (
                url,
                r.get("worker", "-"),
                health,
                w.get("status") or "-",
                str(w.get("load", "-")),
                w.get("model") or "-",
            )
        )
    for r in pool["registrations"]:
        if not r["url"]:
            rows.append(("-", r["worker"], "-", r["state"], "-", r.get("error") or "-"))
    headers = ("WORKER", "NAMED", "HEALTH", "STATUS", "LOAD", "MODEL")
    out.print(listing(headers, rows, whole=("WORKER",), wrap=("MODEL",), drop=("NAMED", "LOAD")))


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


@app.command
def warm(
    model: str,
    /,
    *,
    on: Annotated[str, Parameter(help="The peer to load it on (a name from `blazar peers`).")],
    keep_alive: Annotated[str | None, Parameter(help="How long it stays loaded there (`10m`, `-1`).")] = None,
    json_: Json = False,
) -> None:
    """Load MODEL on peer ON now (with this daemon's key for it); its next snapshot shows it warm."""
    body: dict[str, Any] = {"model": model}
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    daemon = _daemon()
    failed: dict[str, str] = {}
    for peer in _members(daemon, [on]):
        try:
            doc = daemon.post(f"/admin/peers/{peer}/warm", body)
        except CliError as exc:
            failed[peer] = str(exc)
            out.print(f"{peer}: failed: {exc}", markup=False)
            continue
        if json_:
            out.print(json.dumps(doc), markup=False)
            continue
        state = doc["state"] or "not listed yet"
        out.print(f"{peer}: {model} loaded in {doc['load_s']:.1f} s (state there: {state})", markup=False)
    if failed:
        raise CliError("not loaded on " + "; ".join(f"{p} ({why})" for p, why in failed.items()))


def _members(daemon: Daemon, names: list[str]) -> list[str]:
    """Each of ``names`` as peers: a peer's own name, or a ``dns`` remote's name standing for
    every peer it found (this daemon itself left out)."""
    peers = daemon.get("/api/peers")["peers"]
    known = {p["name"] for p in peers}
    out: list[str] = []
    for name in names:
        group = [p["name"] for p in peers if p["remote"] == name != p["name"] and p["state"] != "self"]
        out += [name] if name in known or not group else group
    return list(dict.fromkeys(out))


def _progress(doc: dict[str, Any]) -> str:
    status = doc["status"]
    if status == "success":
        how = {"pull": "the peer pulled it itself", "stream": "streamed from here"}.get(
            doc.get("via", ""), "already there with the same files"
        )
        return f"success: {how}, {doc['digest'][:19]}"
    if "digest" in doc and "total" in doc:
        done = doc.get("completed", 0)
        return f"{status} {doc['digest'][:19]} {human_size(done)} / {human_size(doc['total'])}"
    if "digest" in doc:
        return f"{status} {doc['digest'][:19]}"
    return status + (f": {doc['message']}" if doc.get("message") else "")


@app.command
def replicate(
    model: str,
    /,
    *,
    to: Annotated[str, Parameter(help="The peers to copy it to, comma-separated.")],
    from_here: Annotated[
        bool,
        Parameter(negative="", help="Stream it from this machine's store; do not ask the peer to pull."),
    ] = False,
    json_: Json = False,
) -> None:
    """Put MODEL on each peer of TO: the peer pulls it from its own sources, or (when that fails,
    or with --from-here) this daemon streams it from its store and the peer verifies each
    file's sha256 before installing it. Needs a key with the admin scope on each peer."""
    daemon = _daemon()
    failed: dict[str, str] = {}
    for peer in _members(daemon, [p.strip() for p in to.split(",") if p.strip()]):
        last: dict[str, Any] = {}
        body = {"model": model, "from_here": from_here}
        with daemon.http.stream("POST", f"/admin/peers/{peer}/replicate", json=body) as resp:
            if resp.status_code >= 400:
                resp.read()
                failed[peer] = error_message(resp)
                out.print(f"{peer}: failed: {failed[peer]}", markup=False)
                continue
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                last = json.loads(line)
                if json_:
                    out.print(line, markup=False)
                else:
                    out.print(f"{peer}: {_progress(last)}", markup=False)
        if last.get("status") != "success":
            failed[peer] = last.get("error") or "the answer broke off before it said success"
            if not json_:
                out.print(f"{peer}: failed: {failed[peer]}", markup=False)
    if failed:
        raise CliError("not replicated to " + "; ".join(f"{p} ({why})" for p, why in failed.items()))
