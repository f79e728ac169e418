"""The batch job: run each request of a batch through the gateway itself, record each answer.

Each item is sent in-process to the daemon's own ASGI application, so it gets exactly
what the same request sent over HTTP would get (validation, translation, the error
shapes), at the low admission tier: interactive requests are admitted first, and the
batch leaves one slot of each model to them. Each item runs as the API key the batch
was made with (``BatchRow.key``; see ``blazar.web.asgi.auth``): its scopes, its limits.
An answer is committed to the ledger before the next step counts it, so after a
crash the batch goes on at its first unrecorded item: no item is lost, none is
recorded twice, and one whose answer was being written when the crash came simply
runs again.

When every item has an answer, the OpenAI output and error files are written and
named in one transaction; an Anthropic batch's results are read from its items.

A full disk pauses a batch, as a long queue would; it does not fail it. When an answer,
a file or the batch's end cannot be written (or an item itself is answered 507
``DISK_FULL``), the batch stops where it is, says why (``JobContext.stall``: the
batch's ``errors`` and the job's ``stalled``), and tries again after 1, 2, 4 … up to
30 seconds, going on from its first unrecorded item once the space is back. What was
recorded before stays; its window still runs, so a disk that stays full ends it
``expired`` with the answers it has. A cancel ends it at once.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio

from actors.jobs import JobContext, JobOutcome, Runner
from actors.runtime import Runtime
from blazar.dialects import batches
from blazar.serve.context import ACT_AS
from blazar.serve.jobs.in_process import ASGIApp, asgi_client
from blazar.serve.stores.batches import BatchItem, BatchRow, BatchStore, FileRow, Statement
from registry.errors import DiskFull, disk_full_as, find_disk_full

log = logging.getLogger(__name__)

__all__ = ["KIND", "finish", "item_id", "output_file_ids", "runner", "store_of"]

KIND = "batch"
PROGRESS_EVERY_S = 1.0
DISK_RETRY_FIRST_S = 1.0
DISK_RETRY_MAX_S = 30.0


def store_of(runtime: Runtime) -> BatchStore:
    return BatchStore(runtime.ledger, Path(runtime.config.home))


def item_id(batch_id: str, idx: int) -> str:
    """The ``batch_req_…`` id of one request: the same on every run of the batch."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}/{idx}".encode()).hexdigest()[:24]


def output_file_ids(batch_id: str) -> tuple[str, str]:
    """The output and error file ids of a batch: fixed, so finishing twice writes the same rows."""
    tail = batch_id.removeprefix("batch_")
    return f"file-out-{tail}", f"file-err-{tail}"


def runner(runtime: Runtime, app: ASGIApp, *, headers: Mapping[str, str] | None = None) -> Runner:
    """Run batch jobs through ``app``, the daemon's ASGI application; ``headers`` go with
    every item (the local token, so that items pass the auth step; with it, each item
    names the key its batch was made with, whose grant and limits it then runs under)."""
    client = asgi_client(app, headers)

    async def run(ctx: JobContext) -> JobOutcome:
        return await _Batch(runtime, client, ctx).run()

    return run


class _Batch:
    def __init__(self, runtime: Runtime, client: httpx.AsyncClient, ctx: JobContext) -> None:
        self.runtime, self.client, self.ctx = runtime, client, ctx
        self.store = store_of(runtime)
        self.batch_id = ctx.job.request.decode()
        self.done = 0
        self._progress_at = 0.0

    async def run(self) -> JobOutcome:
        """Run the batch; a full disk pauses it (see the module's text) until the space is back."""
        delay, paused = DISK_RETRY_FIRST_S, False
        while True:
            try:
                outcome = await self._run()
            except Exception as exc:
                full = find_disk_full(exc)
                if full is None:
                    raise
                named = full if isinstance(full, DiskFull) else DiskFull("the batch's progress")
                why = f"{named.fact} — free space on the disk holding {named.holder}"
            else:
                if paused:
                    log.warning("batch %s goes on: the disk has space again", self.batch_id)
                    self.ctx.stall(None)
                return outcome
            if not paused:  # once per pause in the daemon's log; the batch itself says it all along
                log.warning("batch %s is paused, retrying with a backoff: %s", self.batch_id, why)
            paused = True
            self.ctx.stall(f"the batch is paused: {why}; it goes on by itself once there is room")
            try:
                await trio.sleep(delay)
            except trio.Cancelled:
                if self.ctx.cancel_requested:
                    self.ctx.stall(None)
                    with trio.CancelScope(shield=True):
                        await self._end_cancelled()
                raise
            delay = min(delay * 2, DISK_RETRY_MAX_S)

    async def _end_cancelled(self) -> None:
        batch = await self.store.batch(self.batch_id)
        if batch is not None and batch.ended_at is None:
            await finish(self.store, batch, settle="cancelled")

    async def _run(self) -> JobOutcome:
        batch = await self.store.batch(self.batch_id)
        if batch is None:
            return JobOutcome(state="failed", error="the batch was deleted before it ran")
        if batch.in_progress_at is None:
            await self.store.set_times(self.batch_id, in_progress_at=time.time())
        items = await self.store.items(self.batch_id, unfinished=True)
        try:
            if not batch.cancel_requested:
                await self._run_items(batch, items)
        except trio.Cancelled:
            if self.ctx.cancel_requested:
                with trio.CancelScope(shield=True):
                    await finish(self.store, batch, settle="cancelled")
            raise
        expired = time.time() >= batch.expires_at
        settle: batches.ItemState | None = (
            "cancelled" if batch.cancel_requested else ("expired" if expired else None)
        )
        await finish(self.store, batch, settle=settle)
        await self.ctx.progress({"recorded_this_run": self.done, "ended": True})
        return JobOutcome(state="cancelled" if batch.cancel_requested else "completed")

    async def _run_items(self, batch: BatchRow, items: list[BatchItem]) -> None:
        limiter = trio.Semaphore(max(1, self.runtime.config.slots - 1))
        async with trio.open_nursery() as nursery:
            for item in items:
                if time.time() >= batch.expires_at:
                    return  # what is left expires when the batch finishes
                await limiter.acquire()
                nursery.start_soon(self._run_item, batch, item, limiter)

    async def _run_item(self, batch: BatchRow, item: BatchItem, limiter: trio.Semaphore) -> None:
        try:
            headers = {
                "content-type": "application/json",
                "x-blazar-priority": "low",
                "x-blazar-client": f"batch:{batch.id}",
            }
            if batch.dialect == "anthropic":
                headers["anthropic-version"] = "2023-06-01"
            if batch.key is not None:
                # Beside the local token, this makes the item run as the batch's key: its
                # scopes and limits, its name in the ledger (blazar.web.asgi.auth).
                headers[ACT_AS] = batch.key
            try:
                resp = await self.client.post(item.url, content=item.body, headers=headers)
            except Exception as exc:  # a bug on our side: this item fails, the batch goes on
                log.error("batch %s: request %s failed", batch.id, item.custom_id, exc_info=exc)
                error = {
                    "error": {
                        "message": f"internal error: {exc}",
                        "code": "INTERNAL",
                        "blazar_code": "INTERNAL",
                    }
                }
                answered = msgspec.structs.replace(
                    item, state="failed", status_code=500, response=msgspec.json.encode(error)
                )
            else:
                if resp.status_code == 507 and _blazar_code(resp.content) == "DISK_FULL":
                    # not this request's failure: the batch pauses, and runs it again later
                    raise DiskFull(f"the answer to request '{item.custom_id}'")
                state: batches.ItemState = "succeeded" if resp.status_code < 400 else "failed"
                answered = msgspec.structs.replace(
                    item,
                    state=state,
                    status_code=resp.status_code,
                    response=resp.content,
                    request_id=resp.headers.get("x-blazar-trace-id"),
                )
            with disk_full_as("the batch's answers", where=f"{self.store.ledger_name} in the data dir"):
                await self.store.write(BatchStore.item_statement(self.batch_id, answered))
            self.done += 1
            now = time.monotonic()
            if now - self._progress_at >= PROGRESS_EVERY_S:
                self._progress_at = now
                await self.ctx.progress({"recorded_this_run": self.done})
        finally:
            limiter.release()


async def finish(store: BatchStore, batch: BatchRow, *, settle: batches.ItemState | None) -> None:
    """End a batch: what did not run becomes ``settle``; an OpenAI batch gets its output and
    error files. One transaction, so a batch is ended with its files or not at all."""
    now = time.time()
    statements: list[Statement] = []
    if settle is not None:
        statements.append(BatchStore.settle_statement(batch.id, settle))
    if batch.dialect == "openai":
        if batch.finalizing_at is None:
            await store.set_times(batch.id, finalizing_at=now)
        rows = await _files(store, batch, await store.items(batch.id), settle)
        statements += [BatchStore.file_statement(row) for row in rows]
        out_id, err_id = output_file_ids(batch.id)
        names = {row.id for row in rows}
        statements.append(
            (
                "UPDATE batches SET output_file_id = ?, error_file_id = ?, ended_at = ? WHERE id = ?",
                (out_id if out_id in names else None, err_id if err_id in names else None, now, batch.id),
            )
        )
    else:
        statements.append(("UPDATE batches SET ended_at = ? WHERE id = ?", (now, batch.id)))
    with disk_full_as("the batch's end", where=f"{store.ledger_name} in the data dir"):
        await store.write(*statements)


async def _files(
    store: BatchStore, batch: BatchRow, items: list[BatchItem], settle: batches.ItemState | None
) -> list[FileRow]:
    """Write the output and error files (whichever has lines); their rows, to commit."""
    outputs, errors = _output_lines(batch.id, items, settle)
    out_id, err_id = output_file_ids(batch.id)
    rows = []
    for file_id, lines, name in ((out_id, outputs, "output"), (err_id, errors, "errors")):
        if not lines:
            continue
        data = batches.to_jsonl(lines)
        path, _ = await store.write_file_bytes(f"the batch's {name} file", data)
        rows.append(
            FileRow(
                id=file_id,
                filename=f"{batch.id}_{name}.jsonl",
                purpose="batch_output",
                bytes=len(data),
                path=str(path),
                created_at=time.time(),
            )
        )
    return rows


def _output_lines(
    batch_id: str, items: list[BatchItem], settle: batches.ItemState | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    outputs: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for item in items:
        rid = item_id(batch_id, item.idx)
        state = settle if item.state in ("pending", "running") and settle is not None else item.state
        if state == "succeeded" and item.response is not None:
            outputs.append(
                batches.encode_output_line(
                    id=rid,
                    custom_id=item.custom_id,
                    status_code=item.status_code or 200,
                    body=msgspec.json.decode(item.response),
                    request_id=item.request_id,
                )
            )
        elif state == "failed" and item.response is not None:
            body = _json_or_text(item.response)
            error = (body.get("error") or {}) if isinstance(body, dict) else {}
            errors.append(
                batches.encode_error_line(
                    id=rid,
                    custom_id=item.custom_id,
                    code=str(error.get("blazar_code") or error.get("code") or "request_failed"),
                    message=str(error.get("message") or body),
                    status_code=item.status_code,
                    body=body,
                    request_id=item.request_id,
                )
            )
        elif state in ("cancelled", "expired"):
            cancelled = state == "cancelled"
            errors.append(
                batches.encode_error_line(
                    id=rid,
                    custom_id=item.custom_id,
                    code=batches.CANCELLED_CODE if cancelled else batches.EXPIRED_CODE,
                    message=batches.CANCELLED_MESSAGE if cancelled else batches.EXPIRED_MESSAGE,
                )
            )
    return outputs, errors


def _blazar_code(raw: bytes) -> str | None:
    body = _json_or_text(raw)
    error = body.get("error") if isinstance(body, dict) else None
    code = (error.get("blazar_code") if isinstance(error, dict) else None) or (
        body.get("blazar_code") if isinstance(body, dict) else None
    )
    return code if isinstance(code, str) else None


def _json_or_text(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return raw.decode("utf-8", "replace")
