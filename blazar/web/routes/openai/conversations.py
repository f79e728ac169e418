"""OpenAI conversations: ``/v1/conversations`` and their items.

A conversation is a stored thread of items; a response created with
``conversation`` reads it as its history and appends its input and output to it.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from quart import Response
from quart_trio import QuartTrio

from blazar.dialects import responses
from blazar.dialects._wire import decode_json
from blazar.dialects.neutral import DecodeError
from blazar.errors import BlazarError
from blazar.serve.stores.responses import ConversationRow, ResponseStore, store_of
from blazar.web.asgi.replies import app_runtime, json_response, read_body
from blazar.web.routes.openai.responses import page_args

__all__ = ["register"]


class _Create(msgspec.Struct, kw_only=True):
    items: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None


class _Update(msgspec.Struct, kw_only=True):
    metadata: dict[str, str]


class _Items(msgspec.Struct, kw_only=True):
    items: list[dict[str, Any]]


def _doc(row: ConversationRow) -> dict[str, Any]:
    created = int(row.created_at)
    return {"id": row.id, "object": "conversation", "created_at": created, "metadata": row.metadata}


def _items(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not raw:
        return []
    if len(raw) > 20:
        raise DecodeError("invalid field `items`: at most 20 items at a time", param="items")
    return responses.decode_request(msgspec.json.encode({"model": "-", "input": raw})).items


def _metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    metadata = metadata or {}
    if len(metadata) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in metadata.items()):
        raise DecodeError("invalid field `metadata`: at most 16 keys of 64 characters, values of 512")
    return metadata


async def _found(store: ResponseStore, conversation_id: str) -> ConversationRow:
    row = await store.conversation(conversation_id)
    if row is None:
        raise BlazarError(
            "NOT_FOUND", f"no conversation '{conversation_id}' — create it with POST /v1/conversations"
        )
    return row


async def conversation_create() -> Response:
    body = await read_body()
    wire = decode_json(body, _Create) if body.strip() else _Create()
    metadata = _metadata(wire.metadata)
    row = ConversationRow(id=responses.new_id("conv"), created_at=time.time(), metadata=metadata)
    items = _items(wire.items or [])
    await store_of(app_runtime()).create_conversation(row, items)
    return json_response(_doc(row))


async def conversation_retrieve(conversation_id: str) -> Response:
    return json_response(_doc(await _found(store_of(app_runtime()), conversation_id)))


async def conversation_update(conversation_id: str) -> Response:
    store = store_of(app_runtime())
    row = await _found(store, conversation_id)
    wire = decode_json(await read_body(), _Update)
    metadata = _metadata(wire.metadata)
    await store.update_conversation(conversation_id, metadata)
    return json_response(_doc(msgspec.structs.replace(row, metadata=metadata)))


async def conversation_delete(conversation_id: str) -> Response:
    if not await store_of(app_runtime()).delete_conversation(conversation_id):
        raise BlazarError("NOT_FOUND", f"no conversation '{conversation_id}'")
    return json_response({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def conversation_list_items(conversation_id: str) -> Response:
    store = store_of(app_runtime())
    await _found(store, conversation_id)
    after, limit, order = page_args()
    items = await store.conversation_items(conversation_id)
    return json_response(responses.item_page(items, after=after, limit=limit, order=order))


async def conversation_add_items(conversation_id: str) -> Response:
    store = store_of(app_runtime())
    await _found(store, conversation_id)
    items = _items(decode_json(await read_body(), _Items).items)
    await store.append_items(conversation_id, items)
    return json_response(responses.item_page(items, after=None, limit=len(items) or 1, order="asc"))


async def conversation_get_item(conversation_id: str, item_id: str) -> Response:
    store = store_of(app_runtime())
    await _found(store, conversation_id)
    for item in await store.conversation_items(conversation_id):
        if item.get("id") == item_id:
            return json_response(item)
    raise BlazarError("NOT_FOUND", f"no item '{item_id}' in conversation '{conversation_id}'")


async def conversation_delete_item(conversation_id: str, item_id: str) -> Response:
    store = store_of(app_runtime())
    row = await _found(store, conversation_id)
    if not await store.delete_item(conversation_id, item_id):
        raise BlazarError("NOT_FOUND", f"no item '{item_id}' in conversation '{conversation_id}'")
    return json_response(_doc(row))


def register(app: QuartTrio) -> None:
    app.post("/v1/conversations")(conversation_create)
    app.get("/v1/conversations/<conversation_id>")(conversation_retrieve)
    app.post("/v1/conversations/<conversation_id>")(conversation_update)
    app.delete("/v1/conversations/<conversation_id>")(conversation_delete)
    app.get("/v1/conversations/<conversation_id>/items")(conversation_list_items)
    app.post("/v1/conversations/<conversation_id>/items")(conversation_add_items)
    app.get("/v1/conversations/<conversation_id>/items/<item_id>")(conversation_get_item)
    app.delete("/v1/conversations/<conversation_id>/items/<item_id>")(conversation_delete_item)
