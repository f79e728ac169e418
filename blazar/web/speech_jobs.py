"""Transcription jobs: ``async=true`` on ``/v1/audio/transcriptions`` or ``/translations``.

The form is checked as the engine would check it (bad input is a 400 before any job
exists), then the upload is written under the data dir (``jobs/<id>/upload``, the form
without its ``async`` field) and the job is committed; the client gets 202 with the
job's id and URLs at once. The job runs the stored form through the daemon's own ASGI
application, as the batch runner runs its items, at the low admission tier and as the
key that made it: admission, the engine's claim, the ledger record are those of the same
request sent over HTTP. Its answer, in the ``response_format`` asked for, is the job's
result (``GET /v1/jobs/{id}/result``); a cancel through the jobs API cancels that
request, which closes the engine's connection, and whisper stops at its next segment.

A job cut by a crash runs again from the start on the next daemon start (a transcription
has no side effects). The upload is removed once the job has ended; the job's folder
goes when the job is pruned.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio

from actors.engines import transcript as tx
from actors.engines.multipart import Part, boundary_of, encode_form
from actors.jobs import JobContext, JobOutcome, JobRecord
from actors.runtime import Runtime
from blazar.auth.keys import LOCAL_NAME
from blazar.errors import BlazarError
from blazar.serve.context import ACT_AS
from blazar.web.asgi.call import Call, Reply
from blazar.web.asgi.replies import json_reply
from blazar.web.jobs import encode_job
from registry.files import atomic_write

__all__ = ["ASYNC", "KIND", "register_runner", "submit", "wants_async"]

KIND = "transcription"
ASYNC = "async"
"""The form field that makes a transcription a job."""
UPLOAD = "upload"
"""The stored form's file name in the job's folder."""


class _Job(msgspec.Struct, frozen=True, kw_only=True):
    """What a transcription job carries beside its upload: enough to send it again after a
    restart (the key's name, never a secret)."""

    path: str
    content_type: str
    response_format: str
    key: str | None = None


def wants_async(form: dict[str, list[Part]]) -> bool:
    """Whether the form asks for a job (``async``: true or false; another value is a 400)."""
    parts = form.get(ASYNC)
    if not parts:
        return False
    try:
        return tx.parse_flag(parts[-1].text, ASYNC)
    except tx.BadRequest as exc:
        raise BlazarError("BAD_REQUEST", exc.message, param=ASYNC) from None


def _check(form: dict[str, list[Part]], path: str) -> tx.TranscriptionRequest:
    """The form as the engine will read it; what the engine would refuse without hearing
    the audio is refused now, before a job exists."""
    upload = form.get("file", [None])[-1]
    texts = {name: [p.text for p in parts] for name, parts in form.items() if name != "file"}
    task: tx.Task = "translate" if path.endswith("/translations") else "transcribe"
    try:
        req = tx.parse_request(
            texts, upload.data if upload else None, filename=upload.filename if upload else None, task=task
        )
        if req.stream:
            raise tx.BadRequest(
                "`stream` and `async` cannot be combined: a job's result is fetched when it has "
                "completed (GET /v1/jobs/{id}/result); leave out one of them",
                "stream",
            )
        if not req.audio:
            raise tx.BadRequest("the upload is empty (zero bytes): send the audio file's contents", "file")
        if problem := tx.wav_problem(req.audio):
            raise tx.BadRequest(f"the upload: {problem}", "file")
    except tx.BadRequest as exc:
        raise BlazarError("BAD_REQUEST", exc.message, param=exc.param) from None
    return req


def _folder(runtime: Runtime, job_id: str) -> Path:
    return runtime.jobs.data_dir / "jobs" / job_id


def job_doc(job: JobRecord) -> dict[str, Any]:
    """The job as the jobs API shows it, with where to poll, fetch and cancel it."""
    base = f"/v1/jobs/{job.id}"
    return {**encode_job(job), "url": base, "result_url": f"{base}/result", "cancel_url": f"{base}/cancel"}


async def submit(runtime: Runtime, call: Call, path: str, model: str, form: dict[str, list[Part]]) -> Reply:
    """Check the form, store it with its job, answer 202 with the job."""
    req = _check(form, path)
    content_type = call.headers.get("content-type", "")
    boundary = boundary_of(content_type)
    body = encode_form([p for name, parts in form.items() if name != ASYNC for p in parts], boundary)
    job_id = f"job_{secrets.token_hex(12)}"
    folder = _folder(runtime, job_id)
    payload = _Job(path=path, content_type=content_type, response_format=req.response_format, key=call.key)
    await trio.to_thread.run_sync(atomic_write, folder / UPLOAD, body)
    try:
        job = await runtime.jobs.submit(KIND, msgspec.json.encode(payload), model=model, job_id=job_id)
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(shutil.rmtree, folder, True)
        raise
    return json_reply(job_doc(job), status=202, headers={"location": f"/v1/jobs/{job.id}"})


def register_runner(
    runtime: Runtime, app: Callable[..., Any], *, headers: dict[str, str] | None = None
) -> None:
    """Run transcription jobs through ``app``, the daemon's ASGI application; ``headers`` go
    with each (the local token, so that the job may act as the key that made it)."""
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", timeout=None, headers=headers
    )

    async def run(ctx: JobContext) -> JobOutcome:
        return await _run(runtime, client, ctx)

    runtime.jobs.register(KIND, run)


async def _run(runtime: Runtime, client: httpx.AsyncClient, ctx: JobContext) -> JobOutcome:
    job = msgspec.json.decode(ctx.job.request, type=_Job)
    upload = _folder(runtime, ctx.job.id) / UPLOAD
    try:
        body = await trio.to_thread.run_sync(upload.read_bytes)
    except FileNotFoundError:
        return JobOutcome(
            state="failed", error=f"the uploaded audio is gone from {upload}: submit the file again"
        )
    headers = {
        "content-type": job.content_type,
        "x-blazar-priority": "low",
        "x-blazar-client": f"job:{ctx.job.id}",
    }
    # its scopes and limits, and the job named as the ledger's client (an open daemon's job: local)
    headers[ACT_AS] = job.key or LOCAL_NAME
    ended = False
    try:
        resp = await client.post(job.path, content=body, headers=headers)
        ended = True
    finally:
        if ended or ctx.cancel_requested:  # the daemon stopping keeps it: the job runs again
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(lambda: upload.unlink(missing_ok=True))
    await ctx.progress(
        {
            "status_code": resp.status_code,
            "content_type": resp.headers.get("content-type"),
            "trace_id": resp.headers.get("x-blazar-trace-id"),
        }
    )
    if resp.status_code != 200:
        return JobOutcome(state="failed", error=_error_of(resp))
    return JobOutcome(result=resp.content)


def _error_of(resp: httpx.Response) -> str:
    """The message of an error answer (the gateway's and the engine's share OpenAI's shape)."""
    try:
        doc = resp.json()
        message = doc["error"]["message"]
        code = doc["error"].get("blazar_code")
    except (ValueError, KeyError, TypeError):
        return f"HTTP {resp.status_code}: {resp.text[:500]}"
    return f"{code}: {message}" if code else str(message)
