"""``blazar session``: save a model's prompt cache under a name and restore it later.

Save and restore go through the running daemon (it owns the engines); list and rm
also work without one, on the files under ``sessions/`` in the data dir.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import cyclopts
from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import Json, daemon_or_here, err, human_size, listing, out, print_json, time_ago
from blazar.config import resolve_paths
from blazar.daemon.client import CliError, Daemon, find_daemon

__all__ = ["session"]

session = cyclopts.App(
    name="session",
    help="Save a model's prompt cache (a llama.cpp slot) under a name, restore, list and remove it.",
)
app.command(session)

Slot = Annotated[
    int | None, Parameter(help="The slot to use (default: the warmest on save, its own on restore).")
]


def _daemon() -> Daemon:
    daemon = find_daemon(resolve_paths())
    if daemon is None:
        raise CliError("no daemon is running — start one with `blazar serve`, then load the model")
    return daemon


def _body(model: str, name: str, slot: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "name": name}
    if slot is not None:
        body["slot"] = slot
    return body


@session.command
def save(model: str, name: str, *, slot: Slot = None, json_: Json = False) -> None:
    """Save MODEL's prompt cache as NAME (the slot holding the longest prompt, or --slot)."""
    doc = _daemon().post("/admin/sessions/save", _body(model, name, slot))
    if json_:
        print_json(doc)
        return
    info = doc["session"]
    out.print(
        f"saved session {info['name']} of {info['model']}: {info['tokens']} tokens from slot "
        f"{info['slot']} ({human_size(info['bytes'])})"
    )


@session.command
def restore(model: str, name: str, *, slot: Slot = None, json_: Json = False) -> None:
    """Read the session NAME back into a slot of MODEL (loading it if need be)."""
    doc = _daemon().post("/admin/sessions/restore", _body(model, name, slot))
    if json_:
        print_json(doc)
        return
    out.print(f"restored session {name} into slot {doc['slot']} of {model}: {doc['tokens_restored']} tokens")


@session.command(name="list")
def list_(*, model: str | None = None, json_: Json = False) -> None:
    """The saved sessions, with the bank a graceful stop wrote (names starting with _auto-)."""
    from actors.sessions import list_sessions

    paths = resolve_paths()
    route = "/admin/sessions" + (f"?model={quote(model, safe='')}" if model else "")
    doc, _ = daemon_or_here(paths, route, lambda: {"sessions": list_sessions(paths.data_dir, model)})
    rows = doc["sessions"]
    if json_:
        print_json(rows)
        return
    if not rows:
        err.print("no saved sessions — `blazar session save MODEL NAME` saves one")
        return
    table = [
        (
            s["name"], s["model"], str(s["tokens"]), str(s["ctx_per_slot"]), human_size(s["bytes"]),
            time_ago(s["created_at"]),
        )
        for s in rows
    ]  # fmt: skip
    headers = ("NAME", "MODEL", "TOKENS", "CTX", "SIZE", "SAVED")
    out.print(listing(headers, table, whole=("NAME", "MODEL"), drop=("CTX", "TOKENS")))


@session.command
def rm(name: str, *, model: str | None = None) -> None:
    """Delete the session NAME (--model when several models have one of that name)."""
    from actors.errors import SessionError
    from actors.sessions import remove_session

    paths = resolve_paths()
    daemon = find_daemon(paths)
    if daemon is not None:
        route = f"/admin/sessions/{quote(name, safe='')}" + (
            f"?model={quote(model, safe='')}" if model else ""
        )
        resp = daemon.http.request("DELETE", route)
        if resp.status_code >= 400:
            from blazar.daemon.client import error_message

            raise CliError(error_message(resp))
        removed = resp.json()["removed"]
    else:
        try:
            removed = remove_session(paths.data_dir, name, model)
        except SessionError as exc:
            raise CliError(exc.message) from None
        removed = {"name": removed.name, "model": removed.model}
    out.print(f"removed session {removed['name']} of {removed['model']}")
