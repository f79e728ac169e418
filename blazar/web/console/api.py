"""``GET /api/console/snapshot`` and ``GET /api/console/events``: the console's read model
(``console_model``) as one JSON object, or as a server-sent-events stream of them.

The stream sends ``event: snapshot`` at once, then one every ``interval_ms`` (default
1000, at least 250) when something changed and a ``: ping`` comment when nothing did.
Subscribers share one snapshot per tick: ``ConsoleHub`` builds at most one every
``_SHARE_S`` whatever the number of open tabs, off the request path (it reads
statistics the actors keep, and the disk in a worker thread). A stream ends when
its client goes away and when the daemon shuts down, so an open console never
holds up the drain of ``blazar stop``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import msgspec
import trio
from quart import Response, current_app, request
from quart_trio import QuartTrio

from actors.runtime import Runtime
from blazar.auth.keys import Key
from blazar.serve.cards import Cards
from blazar.telemetry.observer import Telemetry
from blazar.web.asgi.call import current_or_none
from blazar.web.asgi.replies import CARDS_KEY, JSON, app_runtime, stream_response
from blazar.web.console.model import Shared, gather, view_for
from blazar.web.routes.admin.telemetry import TELEMETRY_KEY
from registry.gguf import ModelInfo

__all__ = ["ConsoleHub", "register", "sse_event"]

HUB_KEY = "blazar.console"
DEFAULT_INTERVAL_MS = 1000
MIN_INTERVAL_MS = 250
_SHARE_S = 0.2
"""A snapshot younger than this is handed to the next subscriber as it is (below the
shortest interval, so a tab never sees the same one twice in a row)."""
_SHUTDOWN_KEY = "BLAZAR_SHUTDOWN"


def sse_event(doc: Any) -> bytes:
    """One ``snapshot`` event (the JSON has no newline in it, so one ``data:`` line)."""
    return b"event: snapshot\ndata: " + msgspec.json.encode(doc) + b"\n\n"


PING = b": ping\n\n"


class ConsoleHub:
    """Builds the shared part of the snapshots, at most once per ``_SHARE_S``."""

    def __init__(self, runtime: Runtime, telemetry: Telemetry, cards: Cards) -> None:
        self.runtime = runtime
        self.telemetry = telemetry
        self.cards = cards
        self.builds = 0
        self._infos: dict[str, ModelInfo | None] = {}
        self._last: Shared | None = None
        self._lock = trio.Lock()

    async def shared(self) -> Shared:
        async with self._lock:
            last = self._last
            if last is not None and trio.current_time() - last.built_s < _SHARE_S:
                return last
            self._last = await gather(self.runtime, self.telemetry, self.cards, self._infos)
            self.builds += 1
            return self._last


def _hub() -> ConsoleHub:
    hub = cast(ConsoleHub | None, current_app.extensions.get(HUB_KEY))
    if hub is None:
        telemetry = cast(Telemetry, current_app.extensions[TELEMETRY_KEY])
        cards = cast(Cards, current_app.extensions[CARDS_KEY])
        hub = current_app.extensions[HUB_KEY] = ConsoleHub(app_runtime(), telemetry, cards)
    return hub


def _viewer() -> tuple[str | None, Key | None]:
    call = current_or_none()
    return (call.key, call.grant) if call is not None else (None, None)


async def snapshot() -> Response:
    key, grant = _viewer()
    doc = view_for(await _hub().shared(), key=key, grant=grant)
    return Response(msgspec.json.encode(doc), content_type=JSON)


def _interval_s() -> float:
    raw = request.args.get("interval_ms")
    try:
        ms = int(raw) if raw is not None else DEFAULT_INTERVAL_MS
    except ValueError:
        ms = DEFAULT_INTERVAL_MS
    return max(ms, MIN_INTERVAL_MS) / 1000


async def events() -> Response:
    hub, (key, grant), interval_s = _hub(), _viewer(), _interval_s()
    stopping = cast(trio.Event | None, current_app.config.get(_SHUTDOWN_KEY))
    if stopping is None:  # an app served without the daemon around it
        stopping = trio.Event()
    return stream_response(
        stream(hub, key=key, grant=grant, interval_s=interval_s, stopping=stopping),
        content_type="text/event-stream",
        headers={"X-Accel-Buffering": "no"},
    )


async def stream(
    hub: ConsoleHub, *, key: str | None, grant: Key | None, interval_s: float, stopping: trio.Event
) -> AsyncIterator[bytes]:
    """Snapshots until ``stopping`` is set (the daemon shuts down); the framework cancels it
    when the client disconnects."""
    last: dict[str, Any] | None = None
    while not stopping.is_set():
        doc = view_for(await hub.shared(), key=key, grant=grant)
        same = last is not None and {**doc, "time": None} == last
        yield PING if same else sse_event(doc)
        last = {**doc, "time": None}
        with trio.move_on_after(interval_s):
            await stopping.wait()


def register(app: QuartTrio) -> None:
    app.get("/api/console/snapshot")(snapshot)
    app.get("/api/console/events")(events)
