"""``/v1/jobs``: every durable job (background responses, batches, pulls, transcriptions), one shape.

Jobs are read straight from the ledger file; a cancel goes to the jobs actor,
which owns them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from actors.jobs import JobRecord, read_events, read_job, read_jobs
from actors.runtime import Runtime
from blazar.dialects.neutral import DecodeError
from blazar.errors import BlazarError
from blazar.web.asgi.replies import app_runtime, json_response, query_int, stream_response

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

__all__ = ["encode_job", "register"]

_STATES = ("queued", "running", "completed", "failed", "cancelled")


def encode_job(job: JobRecord, *, stalled: str | None = None) -> dict[str, Any]:
    """The job as the jobs API shows it; ``stalled``: why it is not moving now (a full disk),
    shown only while it is."""
    doc: dict[str, Any] = {
        "id": job.id,
        "object": "blazar.job",
        "kind": job.kind,
        "model": job.model,
        "status": job.state,
        "created_at": int(job.created_at),
        "updated_at": int(job.updated_at),
        "attempts": job.attempts,
        "progress": job.progress,
        "error": job.error,
    }
    if stalled is not None:
        doc["stalled"] = stalled
    if job.artifact is not None:
        # where it lies under the data dir, never the machine's own path; read it at its url
        doc["artifact"] = {"path": _in_data_dir(job.artifact), "url": f"/v1/jobs/{job.id}/result"}
    elif job.result is not None:
        doc["result"] = job.result.decode("utf-8", "replace")
    return doc


def _in_data_dir(path: str) -> str:
    try:
        return Path(path).relative_to(app_runtime().config.home).as_posix()
    except ValueError:
        return Path(path).name


async def _job(job_id: str) -> JobRecord:
    job = await trio.to_thread.run_sync(read_job, app_runtime().jobs.path, job_id)
    if job is None:
        raise BlazarError("JOB_NOT_FOUND", f"no job '{job_id}' — see GET /v1/jobs (finished jobs are pruned)")
    return job


async def list_jobs() -> Response:
    from quart import request

    state, kind = request.args.get("state"), request.args.get("kind")
    if state is not None and state not in _STATES:
        raise DecodeError(
            f"invalid query `state`: {state!r} is not one of {', '.join(_STATES)}", param="state"
        )
    limit = query_int("limit", 50, 1000)
    path, after = app_runtime().jobs.path, request.args.get("after")
    rows = await trio.to_thread.run_sync(
        lambda: read_jobs(path, state=state, kind=kind, after=after, limit=limit + 1)
    )
    page, jobs = rows[:limit], app_runtime().jobs
    return json_response(
        {
            "object": "list",
            "data": [encode_job(j, stalled=jobs.stalled(j.id)) for j in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": len(rows) > limit,
        }
    )


async def get_job(job_id: str) -> Response:
    job = await _job(job_id)
    return json_response(encode_job(job, stalled=app_runtime().jobs.stalled(job.id)))


async def job_events(job_id: str) -> Response:
    from quart import request

    await _job(job_id)
    raw = request.args.get("after", "-1")
    if not raw.lstrip("-").isdigit():
        raise DecodeError(f"invalid query `after`: {raw!r} is not a sequence number", param="after")
    runtime = app_runtime()
    if "text/event-stream" in request.headers.get("accept", ""):
        return stream_response(_sse(runtime, job_id, int(raw)), content_type="text/event-stream")
    limit = query_int("limit", 1000, 1000)
    path = runtime.jobs.path
    events = await trio.to_thread.run_sync(lambda: read_events(path, job_id, after=int(raw), limit=limit))
    return json_response(
        {"object": "list", "data": [{"seq": e.seq, "kind": e.kind, "data": e.data} for e in events]}
    )


async def _sse(runtime: Runtime, job_id: str, after: int) -> AsyncIterator[bytes]:
    async for e in runtime.jobs.follow(job_id, after=after):
        # the event's own data, its number as the SSE id: a client resumes with ?after=
        yield b"id: %d\nevent: %s\ndata: %s\n\n" % (e.seq, e.kind.encode(), msgspec.json.encode(e.data))


_ELSEWHERE = {
    "response": "a background response's answer is the response: GET /v1/responses/{id}",
    "batch": "a batch's answers are its output file: GET /v1/batches/{id}",
}


async def job_result(job_id: str) -> Response:
    """A completed job's result as its runner made it (a transcript in the format asked for)."""
    from quart import Response

    job = await _job(job_id)
    if job.state != "completed":
        why = {
            "queued": "it is queued: poll GET /v1/jobs/{id} until its status is completed",
            "running": "it is running: poll GET /v1/jobs/{id} until its status is completed",
            "failed": f"it failed: {job.error or 'no reason was recorded'}",
            "cancelled": "it was cancelled",
        }[job.state]
        raise BlazarError("JOB_NO_RESULT", f"job '{job.id}' has no result: {why.replace('{id}', job.id)}")
    data = job.result
    if job.artifact is not None:
        try:
            data = await trio.to_thread.run_sync(Path(job.artifact).read_bytes)
        except FileNotFoundError:
            raise BlazarError(
                "JOB_NO_RESULT",
                f"job '{job.id}': its result file {_in_data_dir(job.artifact)} is gone from the data dir",
            ) from None
    if data is None:
        elsewhere = _ELSEWHERE.get(job.kind, "this kind of job keeps no result").replace("{id}", job.id)
        raise BlazarError("JOB_NO_RESULT", f"job '{job.id}' has no result: {elsewhere}")
    content_type = job.progress.get("content_type") or "text/plain; charset=utf-8"
    return Response(data, 200, content_type=content_type)


async def cancel_job(job_id: str) -> Response:
    return json_response(encode_job(await app_runtime().jobs.cancel(job_id)))


def register(app: QuartTrio) -> None:
    app.get("/v1/jobs")(list_jobs)
    app.get("/v1/jobs/<job_id>")(get_job)
    app.get("/v1/jobs/<job_id>/events")(job_events)
    app.get("/v1/jobs/<job_id>/result")(job_result)
    app.post("/v1/jobs/<job_id>/cancel")(cancel_job)
