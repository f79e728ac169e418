"""OpenAI Files and Batches: ``/v1/files`` and ``/v1/batches``.

A batch input file is validated line by line when it is uploaded, and again
against the batch's endpoint and the installed models when a batch is created
from it, so a batch that starts can run. The batch, its items and its job are
committed together; ``blazar.serve.jobs.batch_runner`` runs it.
"""

from __future__ import annotations

import io
import secrets
import time
from typing import Any

import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.formparser import MultiPartParser
from werkzeug.http import parse_options_header

from actors.errors import JobNotRunnable
from actors.runtime import Runtime
from blazar.dialects import batches
from blazar.dialects.neutral import DecodeError
from blazar.errors import BlazarError
from blazar.serve.jobs.batch_runner import KIND, finish, store_of
from blazar.serve.stores.batches import BatchRow, BatchStore, FileRow
from blazar.web.asgi.auth import model_visible
from blazar.web.asgi.call import current
from blazar.web.asgi.replies import app_runtime, json_response, query_int, query_order, read_body

__all__ = ["batch_record", "check_models", "creator", "register"]

_WINDOW_S = 24 * 3600.0


def _file_record(row: FileRow) -> batches.FileRecord:
    return batches.FileRecord(
        id=row.id,
        bytes=row.bytes,
        created_at=int(row.created_at),
        filename=row.filename,
        purpose=row.purpose,  # type: ignore[arg-type]
        expires_at=int(row.expires_at) if row.expires_at is not None else None,
    )


def _stall_code(why: str) -> str:
    return "disk_full" if "the disk is full" in why else "paused"


def _int(value: float | None) -> int | None:
    return int(value) if value is not None else None


async def batch_record(
    store: BatchStore, row: BatchRow, *, stalled: str | None = None
) -> batches.BatchRecord:
    """The OpenAI view of a batch: its status worked out from its items and flags; ``stalled``
    (why it is paused: a full disk) is its one ``errors`` entry while it is."""
    t = await store.tally(row.id)
    ended = row.ended_at is not None
    expired = row.ended_at is not None and row.ended_at >= row.expires_at and t.expired > 0
    status = batches.openai_status(
        t, cancel_requested=row.cancel_requested, expired=expired, files_written=ended
    )
    return batches.BatchRecord(
        id=row.id,
        endpoint=row.endpoint,
        input_file_id=row.input_file_id or "",
        status=status,
        created_at=int(row.created_at),
        request_counts=batches.openai_counts(t),
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        metadata=row.metadata,
        errors=[batches.BatchErrorEntry(code=_stall_code(stalled), message=stalled)] if stalled else [],
        in_progress_at=_int(row.in_progress_at),
        expires_at=_int(row.expires_at),
        finalizing_at=_int(row.finalizing_at),
        completed_at=_int(row.ended_at) if status == "completed" else None,
        expired_at=_int(row.ended_at) if status == "expired" else None,
        cancelling_at=_int(row.cancelling_at),
        cancelled_at=_int(row.ended_at) if status == "cancelled" else None,
    )


async def check_models(runtime: Runtime, models: set[str]) -> None:
    """Every model a batch names is installed (``ModelNotFound`` names the first that is not).

    A model outside the key's ``models:`` scopes is not looked up (its answer would tell
    whether it exists): its items fail one by one with ``MODEL_NOT_IN_SCOPE``."""
    for model in sorted(models):
        if model_visible(model):
            await trio.to_thread.run_sync(runtime.store.get, model)


def creator() -> str | None:
    """The name of the key the batch is made with, which its items run as (None: no key)."""
    return current().key


def _page_args(default: int, high: int) -> tuple[str | None, int]:
    return request.args.get("after"), query_int("limit", default, high)


# -- files ----------------------------------------------------------------------


async def upload_file() -> Response:
    runtime = app_runtime()
    body = await read_body()
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    if kind != "multipart/form-data" or "boundary" not in options:
        raise DecodeError("upload the file as multipart/form-data with fields `file` and `purpose`")
    form, parts = MultiPartParser().parse(io.BytesIO(body), options["boundary"].encode(), len(body))
    upload = batches.decode_file_form(form)
    part = parts.get("file")
    if part is None:
        raise DecodeError("missing required field `file`: attach the file to upload", param="file")
    data = part.read()
    if upload.purpose == "batch":
        batches.validate_batch_jsonl(data)
    row = await store_of(runtime).put_file(
        f"file-{secrets.token_hex(12)}",
        part.filename or "upload",
        upload.purpose,
        data,
        expires_at=time.time() + upload.expires_after_s if upload.expires_after_s else None,
    )
    return json_response(batches.encode_file(_file_record(row)))


async def _file(file_id: str) -> FileRow:
    row = await store_of(app_runtime()).file(file_id)
    if row is None:
        raise BlazarError("NOT_FOUND", f"no file '{file_id}' — upload one with POST /v1/files")
    return row


async def list_files() -> Response:
    after, limit = _page_args(10000, 10000)
    order = query_order()
    rows = await store_of(app_runtime()).files(
        purpose=request.args.get("purpose"), after=after, limit=limit + 1, order=order
    )
    data = [batches.encode_file(_file_record(r)) for r in rows[:limit]]
    return json_response(batches.encode_openai_page(data, has_more=len(rows) > limit))


async def get_file(file_id: str) -> Response:
    return json_response(batches.encode_file(_file_record(await _file(file_id))))


async def file_content(file_id: str) -> Response:
    row = await _file(file_id)
    data = await store_of(app_runtime()).file_bytes(row)
    return Response(data, 200, content_type="application/octet-stream")


async def delete_file(file_id: str) -> Response:
    row = await _file(file_id)
    await store_of(app_runtime()).delete_file(row)
    return json_response(batches.encode_file_deleted(file_id))


# -- batches --------------------------------------------------------------------


async def create_batch() -> Response:
    runtime = app_runtime()
    store = store_of(runtime)
    create = batches.decode_batch_create(await read_body())
    source = await store.file(create.input_file_id)
    if source is None:
        raise BlazarError(
            "NOT_FOUND", f"no file '{create.input_file_id}' — upload the input with POST /v1/files first"
        )
    if source.purpose != "batch":
        raise DecodeError(
            f"file '{source.id}' was uploaded with purpose '{source.purpose}': a batch reads "
            "only files uploaded with purpose 'batch'",
            param="input_file_id",
        )
    lines = batches.validate_batch_jsonl(await store.file_bytes(source))
    batches.check_batch_endpoint(lines, create.endpoint)
    await check_models(runtime, {line.model for line in lines})
    now = time.time()
    row = BatchRow(
        id=f"batch_{secrets.token_hex(12)}",
        dialect="openai",
        endpoint=create.endpoint,
        input_file_id=create.input_file_id,
        metadata=create.metadata,
        cancel_requested=False,
        created_at=now,
        expires_at=now + _WINDOW_S,
        key=creator(),
    )
    items = [(line.custom_id, line.url, _body(line.body)) for line in lines]
    await runtime.jobs.submit(
        KIND, row.id.encode(), job_id=row.id, statements=tuple(BatchStore.create_statements(row, items))
    )
    return json_response(batches.encode_batch(await batch_record(store, row)))


def _body(body: dict[str, Any]) -> bytes:
    # a batch request never streams: its answer is recorded whole
    return msgspec.json.encode({**body, "stream": False})


async def _batch(batch_id: str) -> BatchRow:
    row = await store_of(app_runtime()).batch(batch_id, dialect="openai")
    if row is None:
        raise BlazarError("NOT_FOUND", f"no batch '{batch_id}' — see GET /v1/batches")
    return row


async def list_batches() -> Response:
    after, limit = _page_args(20, 100)
    store = store_of(app_runtime())
    rows = await store.batches("openai", after=after, before=None, limit=limit + 1)
    jobs = app_runtime().jobs
    data = [
        batches.encode_batch(await batch_record(store, r, stalled=jobs.stalled(r.id))) for r in rows[:limit]
    ]
    return json_response(batches.encode_openai_page(data, has_more=len(rows) > limit))


async def get_batch(batch_id: str) -> Response:
    runtime = app_runtime()
    row = await _batch(batch_id)
    record = await batch_record(store_of(runtime), row, stalled=runtime.jobs.stalled(row.id))
    return json_response(batches.encode_batch(record))


async def cancel_batch(batch_id: str) -> Response:
    runtime = app_runtime()
    store = store_of(runtime)
    row = await cancel(runtime, store, await _batch(batch_id))
    return json_response(batches.encode_batch(await batch_record(store, row)))


async def cancel(runtime: Runtime, store: BatchStore, row: BatchRow) -> BatchRow:
    """Cancel a batch: what has not run is cancelled, what has run is kept; returns it ended."""
    if row.ended_at is not None:
        raise JobNotRunnable(f"batch '{row.id}' has already ended: nothing to cancel")
    await store.set_times(row.id, cancel_requested=1, cancelling_at=time.time())
    try:
        await runtime.jobs.cancel(row.id)
    except JobNotRunnable:
        pass  # it ended on its own meanwhile
    ended = await store.batch(row.id)
    assert ended is not None
    if ended.ended_at is None:  # it never started: nothing ran, so end it here
        await finish(store, ended, settle="cancelled")
        ended = await store.batch(row.id)
        assert ended is not None
    return ended


def register(app: QuartTrio) -> None:
    app.post("/v1/files")(upload_file)
    app.get("/v1/files")(list_files)
    app.get("/v1/files/<file_id>")(get_file)
    app.get("/v1/files/<file_id>/content")(file_content)
    app.delete("/v1/files/<file_id>")(delete_file)
    app.post("/v1/batches")(create_batch)
    app.get("/v1/batches")(list_batches)
    app.get("/v1/batches/<batch_id>")(get_batch)
    app.post("/v1/batches/<batch_id>/cancel")(cancel_batch)
