"""Anthropic Message Batches: ``/v1/messages/batches``.

The same durable batch job as OpenAI's (``blazar.serve.jobs.batch_runner``): each request's
``params`` runs through ``POST /v1/messages`` on the gateway itself, and its answer is
recorded before it counts. Only the shapes differ: ``msgbatch_`` ids,
``processing_status``, live ``request_counts``, and results read as JSONL from the
recorded answers once processing has ended.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import msgspec
from quart import Response, request
from quart_trio import QuartTrio

from blazar.dialects import batches
from blazar.errors import BlazarError
from blazar.serve.jobs.batch_runner import KIND, store_of
from blazar.serve.stores.batches import BatchItem, BatchRow, BatchStore
from blazar.web.asgi.replies import app_runtime, json_response, query_int, read_body
from blazar.web.routes.openai.batches import cancel, check_models, creator

__all__ = ["register"]

_WINDOW_S = 24 * 3600.0


async def _record(store: BatchStore, row: BatchRow) -> dict[str, Any]:
    t = await store.tally(row.id)
    record = batches.MessageBatchRecord(
        id=row.id,
        processing_status=batches.anthropic_status(
            t, cancel_requested=row.cancel_requested, ended=row.ended_at is not None
        ),
        created_at=row.created_at,
        expires_at=row.expires_at,
        request_counts=batches.anthropic_counts(t),
        ended_at=row.ended_at,
        cancel_initiated_at=row.cancelling_at,
        archived_at=row.archived_at,
    )
    return batches.encode_message_batch(record, base_url=request.host_url)


async def _batch(batch_id: str) -> BatchRow:
    row = await store_of(app_runtime()).batch(batch_id, dialect="anthropic")
    if row is None or row.archived_at is not None:
        raise BlazarError("NOT_FOUND", f"no message batch '{batch_id}' — see GET /v1/messages/batches")
    return row


async def message_batch_create() -> Response:
    runtime = app_runtime()
    store = store_of(runtime)
    requests = batches.decode_message_batch_create(await read_body())
    await check_models(runtime, {r.model for r in requests})
    now = time.time()
    row = BatchRow(
        id=f"msgbatch_{secrets.token_hex(12)}",
        dialect="anthropic",
        endpoint="/v1/messages",
        input_file_id=None,
        metadata=None,
        cancel_requested=False,
        created_at=now,
        expires_at=now + _WINDOW_S,
        key=creator(),
    )
    items = [(r.custom_id, "/v1/messages", msgspec.json.encode(r.params)) for r in requests]
    await runtime.jobs.submit(
        KIND, row.id.encode(), job_id=row.id, statements=tuple(BatchStore.create_statements(row, items))
    )
    return json_response(await _record(store, row))


async def message_batch_list_batches() -> Response:
    limit = query_int("limit", 20, 1000)
    store = store_of(app_runtime())
    rows = await store.batches(
        "anthropic",
        after=request.args.get("after_id"),
        before=request.args.get("before_id"),
        limit=limit + 1,
    )
    data = [await _record(store, r) for r in rows[:limit]]
    return json_response(batches.encode_anthropic_page(data, has_more=len(rows) > limit))


async def message_batch_retrieve(batch_id: str) -> Response:
    return json_response(await _record(store_of(app_runtime()), await _batch(batch_id)))


async def message_batch_cancel_batch(batch_id: str) -> Response:
    runtime = app_runtime()
    store = store_of(runtime)
    row = await cancel(runtime, store, await _batch(batch_id))
    return json_response(await _record(store, row))


def _result(item: BatchItem) -> dict[str, Any]:
    if item.state == "succeeded" and item.response is not None:
        return batches.encode_result_line(
            item.custom_id, "succeeded", message=msgspec.json.decode(item.response)
        )
    if item.state == "failed" and item.response is not None:
        body = msgspec.json.decode(item.response)
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            error = {"type": "api_error", "message": str(body)}
        return batches.encode_result_line(item.custom_id, "errored", error=error, request_id=item.request_id)
    return batches.encode_result_line(item.custom_id, "canceled" if item.state == "cancelled" else "expired")


async def _ended(batch_id: str, then: str) -> BatchRow:
    """The batch, once its processing has ended; ``then`` says what to do until it has."""
    row = await _batch(batch_id)
    if row.ended_at is None:
        raise BlazarError("BAD_REQUEST", f"message batch '{batch_id}' is still processing: {then}")
    return row


async def message_batch_results(batch_id: str) -> Response:
    store = store_of(app_runtime())
    await _ended(batch_id, "its results are ready once `processing_status` is `ended`")
    lines = [_result(item) for item in await store.items(batch_id)]
    return Response(batches.to_jsonl(lines), 200, content_type="application/binary")


async def message_batch_delete(batch_id: str) -> Response:
    store = store_of(app_runtime())
    await _ended(batch_id, f"cancel it first (POST /v1/messages/batches/{batch_id}/cancel), then delete it")
    await store.delete_batch(batch_id)
    return json_response(batches.encode_message_batch_deleted(batch_id))


def register(app: QuartTrio) -> None:
    app.post("/v1/messages/batches")(message_batch_create)
    app.get("/v1/messages/batches")(message_batch_list_batches)
    app.get("/v1/messages/batches/<batch_id>")(message_batch_retrieve)
    app.post("/v1/messages/batches/<batch_id>/cancel")(message_batch_cancel_batch)
    app.get("/v1/messages/batches/<batch_id>/results")(message_batch_results)
    app.delete("/v1/messages/batches/<batch_id>")(message_batch_delete)
