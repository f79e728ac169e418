"""``GET /api/explain/{model}``: the settings a model runs with and where each came from;
``GET /api/why[/{trace_id}]``: the story of one request (``blazar.telemetry.why``).

The answer is the runtime's own launch resolution (``actors.settings``), the code
that builds the engine's command line, so it cannot drift from what the engine
gets; for a loaded engine, settings a request changed (``num_ctx``) are shown as
the request's.
"""

from __future__ import annotations

import msgspec
import trio
from quart import Response, current_app
from quart_trio import QuartTrio

from actors.engines.degrades import Degrade
from actors.ledger import Flush, RequestRecord, read_requests
from blazar.errors import BlazarError
from blazar.serve.cards import Card, Cards
from blazar.telemetry.why import Extras, pick, tell
from blazar.web.asgi.replies import CARDS_KEY, JSON, app_runtime

__all__ = ["register"]


async def explain(name: str) -> Response:
    return Response(msgspec.json.encode(await app_runtime().explain(name)), content_type=JSON)


_RECENT = 200
"""Without a trace id, the request explained is chosen among this many recent ones."""


def _extras(card: Card | None, parked: str | None, degrades: tuple[Degrade, ...]) -> Extras | None:
    if card is None:
        return Extras(speculation=parked, engine_degrades=degrades) if parked or degrades else None
    return Extras(
        state=str(card.state),
        reason=card.reason,
        queue_ahead=card.queue_ahead,
        evicted=card.evicted,
        failover=tuple(card.failover),
        drafted=card.drafted,
        accepted=card.accepted,
        speculation=parked,
        engine_degrades=degrades,
        cache=card.cache,
    )


async def why(trace_id: str | None = None) -> Response:
    runtime = app_runtime()
    cards: Cards = current_app.extensions[CARDS_KEY]
    with trio.move_on_after(2.0):  # what was recorded a moment ago, committed first
        await runtime.ledger.ask(Flush())
    path = runtime.ledger.path
    records: list[RequestRecord] = await trio.to_thread.run_sync(
        lambda: read_requests(path, limit=1 if trace_id else _RECENT, trace_id=trace_id)
    )
    record = (records[0] if records else None) if trace_id else pick(records)
    if record is None:
        if trace_id is None:
            raise BlazarError("NOT_FOUND", "no request for a model has been recorded yet")
        raise BlazarError(
            "NOT_FOUND",
            f"no request {trace_id} in the ledger — the id is the x-blazar-trace-id header of its "
            "answer; `blazar why` without one explains the last failed or slowest recent request",
        )
    parked = runtime.speculation.parked(record.model) if record.model else None
    engine = runtime.engine_named(record.model) if record.model else None
    degrades = engine.degrades if engine is not None else ()
    story = tell(record, _extras(cards.get(record.trace_id), parked, degrades))
    return Response(msgspec.json.encode(story), content_type=JSON)


def register(app: QuartTrio) -> None:
    app.get("/api/explain/<path:name>")(explain)
    app.get("/api/why")(why)
    app.get("/api/why/<trace_id>")(why)
