"""Background responses: ``background: true`` makes a response a job.

The create stores the response (``queued``) and its job in one transaction and
answers at once; the jobs actor runs the job at the low admission tier, so
interactive requests go first. Each event the answer streams is kept in the
job's log, so the response can be streamed again (``GET …?stream=true``,
``starting_after``), live or after the fact. A job cut by a crash runs again
from the start on the next daemon start: generation has no side effects, and
the log restarts with it.

The job runs outside any HTTP request: the request that created it may end (or be
cancelled) at once. The job's own facts (queue wait, load, tokens, engine times)
go on a card of its own and, when it has run, to the ledger and telemetry as one
record (``method`` ``JOB``), its tokens charged to the key that created it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import msgspec
import trio

from actors.jobs import JobContext, JobOutcome, Runner
from actors.ledger import RequestRecord
from actors.runtime import Runtime
from actors.scheduling import Tier
from blazar.auth.keys import LOCAL_NAME, Key
from blazar.dialects import responses
from blazar.dialects.neutral import ChatRequest
from blazar.dialects.responses import ResponsesRequest
from blazar.dialects.responses_stream import StreamEncoder, frame, queued_events
from blazar.errors import CATALOG, Dialect
from blazar.errors.describe import describe_error
from blazar.serve import engine_call, mcp_loop
from blazar.serve.cards import Card
from blazar.serve.context import Ask
from blazar.serve.stores.responses import ResponseRow, ResponseStore, history_of, row_for, store_of
from blazar.telemetry.scrub import scrub

__all__ = ["KIND", "Record", "follow", "runner", "submit"]

KIND = "response"


Record = Callable[[RequestRecord], None]
"""Where a job's facts go when it has run (the gateway's ledger and telemetry)."""


class _Job(msgspec.Struct, frozen=True, kw_only=True):
    """What a background response's job carries beyond the stored request, so that it runs
    the same after a restart: the key that made it (its name, never a secret) and the MCP
    servers the request chose, with the key's MCP rules and the tools it approved then."""

    id: str
    key: str | None = None
    mcp: list[str] = []
    mcp_rules: tuple[str, ...] = ()
    approved: list[str] = []
    mcp_catalog: Literal["full", "compact"] | None = None
    """The request's ``x-blazar-mcp-catalog``, if it sent one."""


def _job_of(payload: bytes) -> _Job:
    if payload.startswith(b"{"):
        return msgspec.json.decode(payload, type=_Job)
    response_id, _, key = payload.decode().partition("\n")  # a job queued by an older daemon
    return _Job(id=response_id, key=key or None)


async def submit(
    runtime: Runtime,
    req: ResponsesRequest,
    body: bytes,
    *,
    key: Key | None = None,
    servers: list[str] | None = None,
    approved: frozenset[str] = frozenset(),
    mcp_catalog: Literal["full", "compact"] | None = None,
) -> dict[str, Any]:
    """Store a queued response with its job; the Response object to answer with. ``key``:
    the API key that created it, which its job's tokens are charged to (and whose MCP scopes
    apply to ``servers``, the MCP servers the request chose)."""
    response_id = responses.new_id("resp")
    planned = ChatRequest(model=req.model, messages=[], temperature=req.temperature, top_p=req.top_p)
    req = responses.sampled(req, *await engine_call.planned_sampling(runtime, planned))
    doc = responses.encode_response(req, response_id=response_id, created_at=time.time(), status="queued")
    row = row_for(req, body, doc)
    job = _Job(
        id=response_id,
        key=key.name if key is not None else None,
        mcp=servers or [],
        mcp_rules=key.mcp if key is not None else (),
        approved=sorted(approved),
        mcp_catalog=mcp_catalog,
    )
    await runtime.jobs.submit(
        KIND,
        msgspec.json.encode(job),
        model=req.model,
        job_id=response_id,
        statements=(ResponseStore.put_statement(row),),
        events=tuple((event["type"], event) for event in queued_events(doc)),
    )
    return doc


def runner(runtime: Runtime, record: Record | None = None) -> Runner:
    """Run background responses as jobs; ``record`` gets the facts of each run, as a
    ``RequestRecord`` (``method`` ``JOB``, its trace id the response's id)."""

    async def run(ctx: JobContext) -> JobOutcome:
        job = _job_of(ctx.job.request)
        card = Card(trace_id=job.id, path="/v1/responses")
        started_at = time.time()
        try:
            return await _run(runtime, ctx, job, card)
        except trio.Cancelled:
            card.note_failure("CLIENT_CLOSED_REQUEST", "the response was cancelled while it ran")
            raise
        finally:
            if record is not None and card.model is not None:
                record(_record_of(card, job.key, started_at))

    return run


def _record_of(card: Card, key: str | None, started_at: float) -> RequestRecord:
    code = card.failed_code
    first = card.first_byte_s
    return RequestRecord(
        trace_id=card.trace_id,
        started_at=started_at,
        method="JOB",
        path=card.path,
        model=card.model,
        status=200 if code is None else CATALOG[code].status if code in CATALOG else 500,
        duration_ms=(time.perf_counter() - card.t0) * 1000,
        ttft_ms=(first - card.t0) * 1000 if first is not None else None,
        blazar_code=code,
        bytes_out=card.bytes_out,
        client=None,
        dialect="openai",
        key=key,
        error=scrub(card.failed_reason) if card.failed_reason else None,
        **card.facts(),
    )


async def _run(runtime: Runtime, ctx: JobContext, job: _Job, card: Card) -> JobOutcome:
    store = store_of(runtime)
    row = await store.get(job.id)
    if row is None:
        return JobOutcome(state="failed", error="the response was deleted before it ran")
    card.model = row.model
    req = responses.decode_request(row.request)
    await ctx.restart_events(keep=len(queued_events(row.response)))  # the submit's, kept
    pending: list[tuple[dict[str, Any], int]] = []
    encoder = StreamEncoder(
        req,
        response_id=row.id,
        created_at=row.created_at,
        clock=time.time,
        on_event=lambda event, seq: pending.append((event, seq)),
        queued=True,
    )
    try:
        chat = msgspec.structs.replace(responses.chat_request(req, await history_of(store, req)), stream=True)
        stream: engine_call.TranslatedStream | mcp_loop.McpStream
        if job.mcp:
            grant = Key(name=job.key or LOCAL_NAME, digest="", hint="", mcp=job.mcp_rules, created_at=0.0)
            ask = Ask.job(tier=Tier.LOW, card=card, grant=grant).but(
                approved=frozenset(job.approved), mcp_catalog=job.mcp_catalog
            )
            items = mcp_loop.ResponsesItems(encoder)
            stream = await mcp_loop.McpStream.open(runtime, chat, job.mcp, encoder, items, ask)
        else:
            call = engine_call.EngineCall(runtime, chat, Ask.job(tier=Tier.LOW, card=card))
            await call.prepare()
            encoder.ran_with(*call.sampling())
            stream = await call.stream(encoder)
        try:
            await store.update(row.id, "in_progress", {**row.response, "status": "in_progress"})
            async for chunk in stream:
                card.first_byte_s = card.first_byte_s or time.perf_counter()
                card.chunks += 1
                card.bytes_out += len(chunk)
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
            card.note_failure("INTERNAL", f"internal error ({type(exc).__name__})")
            raise
        card.note_failure(described.code, described.message)
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
