"""Resumable streams: ``GET /v1/stream`` (replay what was missed, then follow),
``DELETE /v1/stream`` and ``POST /v1/streams/lookup``, and ``resumable``, which a streaming
route calls to hand an opted-in answer to the store (``blazar.serve.stores.streams``).

Every route answers only for the calling key's own streams: another key's is not found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import msgspec

from actors.runtime import Runtime
from blazar.dialects._wire import decode_json
from blazar.errors import BlazarError
from blazar.serve.stores.streams import (
    RESUMABLE_HEADER,
    STREAM_ID_HEADER,
    Ender,
    StreamState,
    StreamStore,
    event_number,
    streams_of,
)
from blazar.web.asgi.call import Call, Handler, Reply, current
from blazar.web.asgi.replies import app_runtime, json_response, read_body, stream_response

if TYPE_CHECKING:  # the framework is imported once the daemon listens (blazar/web/front.py)
    from quart import Response
    from quart_trio import QuartTrio

__all__ = ["register", "resumable"]

_LAST_EVENT_ID = "last-event-id"


def resumable(runtime: Runtime, ender: Ender, handler: Handler) -> Handler:
    """``handler`` (a streaming route), whose streamed answers become resumable when their
    request opts in: the answer's stream is handed to the store, with the cleanups the
    handler registered for it (they now run when the stream ends, not when this request
    does), and the request reads it like any resume. A request that does not opt in costs
    one header lookup."""

    store = streams_of(runtime)
    if store is None:  # a gateway built without one (``open_streams`` comes first)
        return handler

    async def run(call: Call) -> Reply:
        assert store is not None
        if not store.wants(call.headers.get(RESUMABLE_HEADER)):
            return await handler(call)
        call.handoff = None  # the store keeps the stream, so the runtime relays it, never a worker
        since = len(call.cleanups)
        reply = await handler(call)
        if isinstance(reply.body, bytes) or reply.status != 200:
            return reply
        owned = call.cleanups[since:]
        del call.cleanups[since:]
        try:
            stream_id, reader = store.adopt(
                reply.body, owner=call.key, model=call.model, ender=ender, cleanups=owned
            )
        except BlazarError:
            call.cleanups.extend(owned)  # not adopted: closed with the request, as ever
            raise
        call.on_cleanup(reader.aclose)
        call.on_cleanup(lambda: _after(call, store, stream_id))
        reply.body = reader
        reply.headers = {**(reply.headers or {}), STREAM_ID_HEADER: stream_id}
        return reply

    return run


async def _after(call: Call, store: StreamStore, stream_id: str) -> None:
    """A request cancelled or interrupted from another connection ends its generation too:
    only a dropped connection leaves it running for a resume."""
    card = call.card
    if card is not None and card.ended_by is not None:
        store.cancel(stream_id, f"its request was {card.ended_by}")


def _store() -> StreamStore:
    store = streams_of(app_runtime())
    if store is None:
        raise BlazarError("STREAM_NOT_FOUND", "this server keeps no resumable streams")
    return store


def _args() -> dict[str, str]:
    from quart import request

    return request.args


def _stream_id() -> str:
    stream_id = _args().get("id")
    if not stream_id:
        raise BlazarError("BAD_REQUEST", "missing query `id`: the stream's X-Blazar-Stream-Id", param="id")
    return stream_id


async def follow_stream() -> Response:
    """The events after ``Last-Event-ID`` (or ``last_event_id``; none: all), then live ones."""
    call = current()
    stream_id = _stream_id()
    after = 0
    if (raw := call.headers.get(_LAST_EVENT_ID)) is not None:
        after = event_number(raw, "Last-Event-ID")
    elif (raw := _args().get("last_event_id")) is not None:
        after = event_number(raw, "last_event_id")
    store = _store()
    reader = store.read(stream_id, call.key, after)
    call.on_cleanup(reader.aclose)
    return stream_response(reader, content_type="text/event-stream", headers={STREAM_ID_HEADER: stream_id})


async def delete_stream() -> Response:
    info = _store().delete(_stream_id(), current().key)
    return json_response({"id": info.id, "object": "blazar.stream.deleted", "deleted": True, "was": info})


class _Lookup(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    ids: list[str] | None = None
    state: StreamState | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100


async def lookup_streams() -> Response:
    body = await read_body()
    query = decode_json(body, _Lookup) if body.strip() else _Lookup()
    found = _store().lookup(current().key, ids=query.ids, state=query.state, limit=query.limit)
    return json_response({"object": "list", "data": found})


def register(app: QuartTrio) -> None:
    app.get("/v1/stream")(follow_stream)
    app.delete("/v1/stream")(delete_stream)
    app.post("/v1/streams/lookup")(lookup_streams)
