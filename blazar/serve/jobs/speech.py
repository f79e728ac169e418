"""Transcription jobs: run a stored ``/v1/audio/transcriptions`` (or ``/translations``) form.

The job runs the stored form through the daemon's own ASGI application, as the batch
runner runs its items, at the low admission tier and as the key that made it: admission,
the engine's claim, the ledger record are those of the same request sent over HTTP. Its
answer, in the ``response_format`` asked for, is the job's result (``GET
/v1/jobs/{id}/result``); a cancel through the jobs API cancels that request, which closes
the engine's connection, and whisper stops at its next segment. ``async=true`` on the
route submits it (``blazar/web/routes/openai/audio_jobs.py``), with the upload written under the data
dir (``jobs/<id>/upload``).

A job cut by a crash runs again from the start on the next daemon start (a transcription
has no side effects). The upload is removed once the job has ended; the job's folder
goes when the job is pruned.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import httpx
import msgspec
import trio

from actors.jobs import JobContext, JobOutcome, Runner
from actors.runtime import Runtime
from blazar.auth.keys import LOCAL_NAME
from blazar.serve.context import ACT_AS
from blazar.serve.jobs.in_process import ASGIApp, asgi_client
from registry.errors import disk_full_as
from registry.files import atomic_write, shown_folder

__all__ = ["KIND", "UPLOAD", "TranscriptionJob", "job_folder", "runner", "store_upload"]

KIND = "transcription"
UPLOAD = "upload"
"""The stored form's file name in the job's folder."""


class TranscriptionJob(msgspec.Struct, frozen=True, kw_only=True):
    """What a transcription job carries beside its upload: enough to send it again after a
    restart (the key's name, never a secret)."""

    path: str
    content_type: str
    response_format: str
    key: str | None = None


def job_folder(runtime: Runtime, job_id: str) -> Path:
    """The job's folder under the data dir, where its upload waits until the job has ended."""
    return runtime.jobs.data_dir / "jobs" / job_id


async def store_upload(runtime: Runtime, job_id: str, body: bytes) -> None:
    """Write the job's upload; on a full disk ``DiskFull`` names it, and the job's folder goes."""
    folder = job_folder(runtime, job_id)
    where = shown_folder(folder.parent, runtime.jobs.data_dir)
    try:
        with disk_full_as("the audio upload", where=where, needed_bytes=len(body)):
            await trio.to_thread.run_sync(atomic_write, folder / UPLOAD, body)
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(shutil.rmtree, folder, True)
        raise


def runner(runtime: Runtime, app: ASGIApp, *, headers: Mapping[str, str] | None = None) -> Runner:
    """Run transcription jobs through ``app``, the daemon's ASGI application; ``headers`` go
    with each (the local token, so that the job may act as the key that made it)."""
    client = asgi_client(app, headers)

    async def run(ctx: JobContext) -> JobOutcome:
        return await _run(runtime, client, ctx)

    return run


async def _run(runtime: Runtime, client: httpx.AsyncClient, ctx: JobContext) -> JobOutcome:
    job = msgspec.json.decode(ctx.job.request, type=TranscriptionJob)
    upload = job_folder(runtime, ctx.job.id) / UPLOAD
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
