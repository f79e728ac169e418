"""Transcription jobs: ``async=true`` on ``/v1/audio/transcriptions`` or ``/translations``.

The form is checked as the engine would check it (bad input is a 400 before any job
exists), then the upload is written under the data dir (``jobs/<id>/upload``, the form
without its ``async`` field) and the job is committed; the client gets 202 with the
job's id and URLs at once. ``blazar/serve/jobs/speech.py`` runs the job, through the
daemon's own ASGI application, as the key that made it.
"""

from __future__ import annotations

import secrets
import shutil
from typing import Any

import msgspec
import trio

from actors.engines import transcript as tx
from actors.engines.multipart import Part, boundary_of, encode_form
from actors.jobs import JobRecord
from actors.runtime import Runtime
from blazar.errors import BlazarError
from blazar.serve.jobs.speech import KIND, TranscriptionJob, job_folder, store_upload
from blazar.web.asgi.call import Call, Reply
from blazar.web.asgi.replies import json_reply
from blazar.web.routes.admin.jobs import encode_job

__all__ = ["ASYNC", "submit", "wants_async"]

ASYNC = "async"
"""The form field that makes a transcription a job."""


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
    folder = job_folder(runtime, job_id)
    payload = TranscriptionJob(
        path=path, content_type=content_type, response_format=req.response_format, key=call.key
    )
    await store_upload(runtime, job_id, body)
    try:
        job = await runtime.jobs.submit(KIND, msgspec.json.encode(payload), model=model, job_id=job_id)
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(shutil.rmtree, folder, True)
        raise
    return json_reply(job_doc(job), status=202, headers={"location": f"/v1/jobs/{job.id}"})
