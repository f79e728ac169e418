"""Background responses: ``background: true`` makes a response a job.

The create stores the response (``queued``) and its job in one transaction and
answers at once; the jobs actor runs the job at the low admission tier, so
interactive requests go first. Each event the answer streams is kept in the
job's log, so the response can be streamed again (``GET …?stream=true``,
``starting_after``), live or after the fact. A job cut by a crash runs again
from the start on the next daemon start: generation has no side effects, and
the log restarts with it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import trio

from actors.jobs import JobContext, JobOutcome
from actors.runtime import Runtime
from actors.scheduling import Tier
from blazar.dialects import responses
from blazar.dialects.responses import ResponsesRequest
from blazar.dialects.responses_stream import StreamEncoder, frame
from blazar.error_reply import describe_error
from blazar.errors import Dialect
from blazar.response_store import ResponseRow, ResponseStore, history_of, row_for, store_of
from blazar.web import translate

__all__ = ["KIND", "follow", "register_runner", "submit"]

KIND = "response"


async def submit(runtime: Runtime, req: ResponsesRequest, body: bytes) -> dict[str, Any]:
    """Store a queued response with its job; the Response object to answer with."""
    response_id = responses.new_id("resp")
    doc = responses.encode_response(req, response_id=response_id, created_at=time.time(), status="queued")
    row = row_for(req, body, doc)
    await runtime.jobs.submit(
        KIND,
        response_id.encode(),
        model=req.model,
        job_id=response_id,
        statements=(ResponseStore.put_statement(row),),
    )
    return doc


def register_runner(runtime: Runtime) -> None:
    async def run(ctx: JobContext) -> JobOutcome:
        return await _run(runtime, ctx)

    runtime.jobs.register(KIND, run)


async def _run(runtime: Runtime, ctx: JobContext) -> JobOutcome:
    store = store_of(runtime)
    row = await store.get(ctx.job.request.decode())
    if row is None:
        return JobOutcome(state="failed", error="the response was deleted before it ran")
    req = responses.decode_request(row.request)
    await ctx.restart_events()
    pending: list[tuple[dict[str, Any], int]] = []
    encoder = StreamEncoder(
        req,
        response_id=row.id,
        created_at=row.created_at,
        clock=time.time,
        on_event=lambda event, seq: pending.append((event, seq)),
    )
    try:
        chat = responses.chat_request(req, await history_of(store, req))
        call = translate.EngineCall(runtime, msgspec.structs.replace(chat, stream=True), tier=Tier.LOW)
        await call.prepare()
        stream = await call.stream(encoder)
        try:
            await store.update(row.id, "in_progress", {**row.response, "status": "in_progress"})
            async for _ in stream:
                for event, _seq in pending:
                    await ctx.event(event["type"], event)
                pending.clear()
        finally:
            await stream.aclose()
    except trio.Cancelled:
        if ctx.cancel_requested:
            with trio.CancelScope(shield=True):
                await _end(store, ctx, row, {**row.response, "status": "cancelled"})
        raise
    except Exception as exc:
        described = describe_error(exc, Dialect.OPENAI)
        if described is None:
            raise
        doc = {
            **row.response,
            "status": "failed",
            "error": {"code": "server_error", "message": described.message},
        }
        await _end(store, ctx, row, doc)
        return JobOutcome(state="failed", error=described.message)
    final = encoder.final
    assert final is not None
    await _end(store, ctx, row, final, conversation=[*req.items, *final["output"]])
    return JobOutcome(
        state="failed" if final["status"] == "failed" else "completed",
        error=(final.get("error") or {}).get("message"),
    )


async def _end(
    store: ResponseStore,
    ctx: JobContext,
    row: ResponseRow,
    doc: dict[str, Any],
    *,
    conversation: list[dict[str, Any]] | None = None,
) -> None:
    done = msgspec.structs.replace(row, status=doc["status"], response=doc)
    await store.put(done, conversation_items=conversation)
    if doc["status"] in ("cancelled", "failed") and not doc.get("output"):
        # a follower of the stream learns how it ended
        kind = "response.failed"
        await ctx.event(kind, {"type": kind, "response": doc})


async def follow(runtime: Runtime, job_id: str, *, after: int = -1) -> AsyncIterator[bytes]:
    """A background response's events as SSE, from ``after`` on, until it has ended."""
    async for event in runtime.jobs.follow(job_id, after=after):
        yield frame(event.data, event.seq)
