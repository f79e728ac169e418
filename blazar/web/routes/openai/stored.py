"""OpenAI stored chat completions: a ``store: true`` chat completion is kept, and the
routes under ``/v1/chat/completions`` list, read, update (``metadata``) and delete it.

``keep`` wraps the chat route's reply: a whole answer is stored before it is sent; a
stream is assembled from its chunks as they pass and stored before its ``[DONE]`` event
leaves, so a client that saw the end of its answer can read it back. An answer that
failed (an error status, an error event midway) is not stored.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import msgspec

from actors.runtime import Runtime
from blazar.dialects.responses import item_page
from blazar.dialects.stored_chat import (
    StreamAssembler,
    decode_update,
    encode_deleted,
    metadata_filter,
    stored_messages,
)
from blazar.serve.stores.completions import (
    CompletionStore,
    StoredCompletion,
    Viewer,
    completions_of,
    not_found,
)
from blazar.web.asgi.call import Call, Reply, current
from blazar.web.asgi.replies import app_runtime, json_response, query_int, query_order, read_body

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

__all__ = ["keep", "register"]


class _Pending(msgspec.Struct, frozen=True, kw_only=True):
    """What a request to be stored brings, before its answer is known."""

    model: str
    owner: str | None
    metadata: dict[str, str]
    messages: list[Any]

    def row(self, completion: dict[str, Any]) -> StoredCompletion:
        completion_id = str(completion["id"])
        return StoredCompletion(
            id=completion_id,
            created_at=time.time(),
            model=str(completion.get("model") or self.model),
            owner=self.owner,
            metadata=self.metadata,
            messages=stored_messages(completion_id, self.messages),
            completion=completion,
        )


def _pending(call: Call, metadata: dict[str, str]) -> _Pending:
    doc = msgspec.json.decode(call.ran_body or call.body)  # as a policy hook left it
    return _Pending(
        model=str(doc.get("model") or ""),
        owner=call.key,
        metadata=metadata,
        messages=list(doc.get("messages") or []),
    )


class _StoredStream:
    """The reply's stream, unchanged; the assembled completion is stored before the chunk
    that ends the stream goes out."""

    def __init__(self, inner: AsyncIterator[bytes], store: CompletionStore, pending: _Pending) -> None:
        self._inner, self._store, self._pending = inner, store, pending
        self._assembler = StreamAssembler()
        self._kept = False

    def __aiter__(self) -> _StoredStream:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._inner.__anext__()
        asm = self._assembler
        if not self._kept:
            asm.feed(chunk)
            if asm.done and not asm.failed and asm.completion_id is not None:
                self._kept = True
                await self._store.put(self._pending.row(asm.completion()))
        return chunk

    async def aclose(self) -> None:
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()


async def keep(runtime: Runtime, call: Call, reply: Reply, metadata: dict[str, str]) -> Reply:
    """Store the answer ``reply`` carries (see the module's note); the reply itself is unchanged."""
    if reply.status != 200:
        return reply
    store, pending = completions_of(runtime), _pending(call, metadata)
    if isinstance(reply.body, bytes):
        doc = msgspec.json.decode(reply.body)
        if isinstance(doc, dict) and doc.get("id") and doc.get("object") == "chat.completion":
            await store.put(pending.row(doc))
        return reply
    reply.body = _StoredStream(reply.body, store, pending)
    return reply


# -- routes (framework) ------------------------------------------------------------------------


def _viewer() -> Viewer:
    call = current()
    return Viewer.of(call.key, call.grant)


async def _stored(completion_id: str) -> StoredCompletion:
    row = await completions_of(app_runtime()).get(completion_id, _viewer())
    if row is None:
        raise not_found(completion_id)
    return row


async def list_completions() -> Response:
    from quart import request

    after, limit = request.args.get("after"), query_int("limit", 20, 100)
    order = query_order(default="asc")
    rows, more = await completions_of(app_runtime()).page(
        _viewer(),
        model=request.args.get("model"),
        metadata=metadata_filter(request.args.items(multi=True)),
        after=after,
        limit=limit,
        order=order,
    )
    return json_response(
        {
            "object": "list",
            "data": [r.view() for r in rows],
            "first_id": rows[0].id if rows else None,
            "last_id": rows[-1].id if rows else None,
            "has_more": more,
        }
    )


async def get_completion(completion_id: str) -> Response:
    return json_response((await _stored(completion_id)).view())


async def update_completion(completion_id: str) -> Response:
    metadata = decode_update(await read_body())
    row = await _stored(completion_id)
    await completions_of(app_runtime()).update_metadata(row.id, metadata)
    return json_response(msgspec.structs.replace(row, metadata=metadata).view())


async def delete_completion(completion_id: str) -> Response:
    row = await _stored(completion_id)
    await completions_of(app_runtime()).delete(row.id)
    return json_response(encode_deleted(row.id))


async def list_messages(completion_id: str) -> Response:
    from quart import request

    row = await _stored(completion_id)
    after, limit = request.args.get("after"), query_int("limit", 20, 100)
    order = query_order(default="asc")
    return json_response(item_page(row.messages, after=after, limit=limit, order=order))


def register(app: QuartTrio) -> None:
    app.get("/v1/chat/completions")(list_completions)
    app.get("/v1/chat/completions/<completion_id>")(get_completion)
    app.post("/v1/chat/completions/<completion_id>")(update_completion)
    app.delete("/v1/chat/completions/<completion_id>")(delete_completion)
    app.get("/v1/chat/completions/<completion_id>/messages")(list_messages)
