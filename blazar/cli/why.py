"""``blazar why``: the story of one request — queue, load, engine, prefill, decode, error."""

from __future__ import annotations

from typing import Annotated

from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import Json, out, print_json
from blazar.daemon.client import CliError


@app.command
def why(
    trace_id: Annotated[str | None, Parameter(help="The request's x-blazar-trace-id.")] = None,
    *,
    json_: Json = False,
) -> None:
    """Tell what happened to one request: its wait for a slot (and how many waited ahead), whether
    its engine was started for it and what was evicted, which engine served it, the prompt and
    generation times and tokens, and the error and its meaning if it failed.

    Without TRACE_ID: the last request that failed, else the slowest recent one. With a daemon
    running it answers (it also knows what only memory holds); without one, the ledger does."""
    from urllib.parse import quote

    from blazar.cli._common import daemon_or_here, load_setup

    paths, _ = load_setup()
    route = f"/api/why/{quote(trace_id, safe='')}" if trace_id else "/api/why"
    doc, _ = daemon_or_here(paths, route, lambda: _offline(paths.data_dir, trace_id))
    if json_:
        print_json(doc)
        return
    for line in doc["lines"]:
        out.print(line, highlight=False)


def _offline(data_dir: str, trace_id: str | None) -> object:
    from pathlib import Path

    from actors.ledger import read_requests
    from blazar.telemetry.why import pick, tell

    ledger = Path(data_dir) / "blazar.db"
    if not ledger.exists():
        raise CliError("no request has been recorded yet: the ledger is made when `blazar serve` first runs")
    records = read_requests(ledger, limit=1 if trace_id else 200, trace_id=trace_id)
    record = (records[0] if records else None) if trace_id else pick(records)
    if record is None:
        raise CliError(
            f"no request {trace_id} in the ledger"
            if trace_id
            else "no request for a model is in the ledger yet"
        )
    return tell(record)
