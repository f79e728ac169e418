"""``blazar autopilot``: recommendations from observed traffic (``blazar.ops.autopilot``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import msgspec
from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import Json, daemon_or_here, load_setup, out, print_json, run_offline
from blazar.daemon.client import CliError

__all__ = ["autopilot", "write_recommendations"]


def _window_s(text: str) -> float:
    from blazar.dialects.ollama_time import parse_duration_s

    try:
        seconds = parse_duration_s(text)
    except ValueError:
        seconds = None
    if seconds is None or seconds <= 0:
        raise CliError(f"--since {text!r}: give a duration such as 30m, 24h or 7d")
    return seconds


def _current(model: str, paths: Any, config: Any) -> Any:
    """What ``model`` runs with now, from ``blazar explain``'s resolution (the daemon's, if one
    runs); None when it cannot be resolved (no longer installed)."""
    from blazar.ops.autopilot import Current

    try:
        doc, _ = daemon_or_here(
            paths,
            f"/api/explain/{model}",
            lambda: run_offline("explain_offline", config.runtime(paths), model),
        )
    except Exception:
        return None
    values = {s["name"]: s["value"] for s in doc["settings"]}
    try:
        return Current(
            slots=int(values["slots"]),
            ctx=int(values["ctx_per_slot"]),
            keep_alive_s=float(values.get("keep_alive_s", config.keep_alive_s)),
            training_ctx=int(values["ctx_train"]) if values.get("ctx_train") else None,
        )
    except (KeyError, TypeError, ValueError):
        return None


@app.command
def autopilot(
    *,
    since: Annotated[str, Parameter(help="The window of traffic to read (30m, 24h, 7d).")] = "7d",
    apply: Annotated[bool, Parameter(negative="", help="Write the changes as `config set` does.")] = False,
    json_: Json = False,
) -> None:
    """Recommend changes from the traffic in the ledger: more slots for a model that queues, a
    longer context for one whose prompts are refused, a longer keep-alive for one that reloads
    often; each with its evidence and the config key to set. --apply writes those keys as
    `blazar config set` does (checked, comments kept; a running daemon applies what it can)."""
    from actors.ledger import read_requests
    from blazar.ops.autopilot import recommend

    paths, config = load_setup()
    ledger = Path(paths.data_dir) / "blazar.db"
    if not ledger.exists():
        raise CliError("no request has been recorded yet: the ledger is made when `blazar serve` first runs")
    records = read_requests(ledger, limit=1_000_000, since=time.time() - _window_s(since))
    models = sorted({r.model for r in records if r.model is not None})
    current = {m: c for m in models if (c := _current(m, paths, config)) is not None}
    recs = recommend(records, current)
    settable = [r for r in recs if r.key is not None]
    if json_:
        print_json({"window": since, "requests": len(records), "recommendations": recs})
    elif recs:
        # One block per recommendation: the key and the evidence are long, and a table
        # cut them to fit an 80-column (or pipe's) width.
        for r in recs:
            out.print(f"{r.model}: {r.rule}", markup=False)
            if r.key is not None:
                out.print(f"  change    {r.key} = {_toml(r.value)}  (now {_toml(r.now)})", markup=False)
            out.print(f"  evidence  {r.evidence}", markup=False)
    else:
        out.print(
            f"Nothing to change: {len(records)} requests in the last {since} show no queueing, no prompt"
        )
        out.print("refused for its length and no model reloading often.")
    if apply and settable:
        write_recommendations(paths, settable)
    elif settable and not json_:
        out.print("[dim]`blazar autopilot --apply` writes them (as `blazar config set` does).[/]")


def write_recommendations(paths: Any, recs: list[Any]) -> None:
    """--apply: the recommendations' keys written into config.toml as `blazar config set` writes
    them (checked; the file's comments and order kept, blazar.config.toml_edit)."""
    from blazar.cli.config import _change
    from blazar.config.edit import resolve_key

    edits = {resolve_key(str(r.key)): r.value for r in recs}
    _change(paths, edits, "autopilot set " + ", ".join(f"{r.key} = {_toml(r.value)}" for r in recs))


def _toml(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return msgspec.json.encode(value).decode()
