"""OpenAI's video routes (Sora's verbs), served by the stable-diffusion.cpp lane with a video model.

``POST /v1/videos`` (and the original product's ``/v1/videos/generations``) checks the
request (``blazar.dialects.videos``), resolves the model (kind ``image``: a video
diffusion model such as Wan), and queues a durable job of kind ``video``; it answers at
once with OpenAI's ``video`` object, ``queued``. The job claims the engine at the low
admission tier (interactive requests go first), runs sd-server's native video job
(``POST /sdcpp/v1/vid_gen``, polled at ``GET /sdcpp/v1/jobs/{id}``) and keeps the
container it answers as the job's result (a large one in a file under the data dir).

``GET /v1/videos/{video_id}`` is the object as the job stands; ``/content`` the video
once completed; ``GET /v1/videos`` lists them, newest first. A video is a job of the
daemon's like any other: ``/v1/jobs`` shows it and cancels it, and it is pruned with
the others.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio

from actors.jobs import JobContext, JobOutcome, JobRecord, read_job, read_jobs
from actors.runtime import Runtime
from actors.scheduling import Tier
from actors.upstream import UpstreamError
from blazar.dialects import videos
from blazar.errors import BlazarError
from blazar.serve.claim import claim_engine
from blazar.serve.context import Ask
from blazar.serve.policy import honesty
from blazar.serve.relay import crash_error
from blazar.serve.sdcpp import CANCEL_GRACE_S, POLL_S, exchange, refusal
from blazar.web.ask import ask_of
from blazar.web.call import Call, Reply, Routes
from blazar.web.common import JSON, app_runtime, json_reply, json_response, query_int
from blazar.web.images import form_of
from registry.kinds import IMAGE_KINDS

__all__ = ["KIND", "register", "register_routes"]

KIND = "video"
_DONE = ("completed", "failed", "cancelled")


class _Job(msgspec.Struct, frozen=True, kw_only=True):
    """What a video job carries: what its object shows, and sd-server's body."""

    model: str
    prompt: str
    seconds: str
    size: str
    body: msgspec.Raw


class _Made(msgspec.Struct, frozen=True, kw_only=True):
    """The job's progress once done: what its result is."""

    content_type: str = "application/octet-stream"
    frames: int = 0
    fps: int = 0


def _seconds(req: videos.VideoRequest) -> str:
    if req.seconds is not None:
        return str(req.seconds)
    if req.video_frames is not None:
        return f"{(req.video_frames - 1) / req.fps:g}"
    return ""


def _object(job: JobRecord) -> dict[str, object]:
    asked = msgspec.json.decode(job.request, type=_Job)
    made = msgspec.convert(job.progress, type=_Made) if job.progress else None
    seconds = asked.seconds
    if not seconds and made is not None and made.fps:
        seconds = f"{max(made.frames - 1, 0) / made.fps:g}"
    return videos.video_object(
        video_id=job.id,
        model=job.model,
        state=job.state,
        created_at=job.created_at,
        updated_at=job.updated_at,
        seconds=seconds,
        size=asked.size,
        prompt=asked.prompt,
        error=job.error,
    )


async def _run(runtime: Runtime, ctx: JobContext) -> JobOutcome:
    job = msgspec.json.decode(ctx.job.request, type=_Job)
    engine = await runtime.engine_for(job.model, kinds=IMAGE_KINDS)
    with await claim_engine(runtime, engine, Ask.job(tier=Tier.LOW)) as claim:
        handle = claim.handle
        upstream = handle.upstream
        try:
            status, content = await exchange(
                await upstream.request(
                    "POST", "/sdcpp/v1/vid_gen", body=job.body, headers={"content-type": JSON}
                )
            )
            if status != 202:
                raise refusal(status, content)
            job_id, state, result, error = videos.decode_video_job(content)
            try:
                while state not in _DONE:
                    await trio.sleep(POLL_S)
                    status, content = await exchange(
                        await upstream.request("GET", f"/sdcpp/v1/jobs/{job_id}")
                    )
                    if status != 200:
                        raise refusal(status, content)
                    _, state, result, error = videos.decode_video_job(content)
            finally:
                if state not in _DONE:  # cancelled, or the daemon stops: take back a job still queued
                    with trio.move_on_after(CANCEL_GRACE_S, shield=True):
                        await exchange(await upstream.request("POST", f"/sdcpp/v1/jobs/{job_id}/cancel"))
        except UpstreamError as exc:
            raise await crash_error(engine, handle, exc) from exc
        except ValueError as exc:
            raise BlazarError("BAD_GATEWAY", str(exc)) from None
    if state != "completed" or result is None:
        return JobOutcome(
            state="failed", error=f"stable-diffusion.cpp's video job {state}: {error or 'no video'}"
        )
    await ctx.progress(
        msgspec.to_builtins(_Made(content_type=result.content_type, frames=result.frames, fps=result.fps))
    )
    return JobOutcome(result=result.data)


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """``POST /v1/videos`` (and ``/v1/videos/generations``) and the runner of their jobs."""

    async def create(call: Call) -> Reply:
        req = videos.decode_video(form_of(call))
        honesty.refuse_ignored(req.ignored, strict=ask_of(call).is_strict(runtime.config.strict))
        call.set_model(req.model)
        await runtime.engine_for(req.model, kinds=IMAGE_KINDS)  # the kind and the lane, checked now
        size = f"{req.size[0]}x{req.size[1]}" if req.size is not None else ""
        payload = _Job(
            model=req.model,
            prompt=req.prompt,
            seconds=_seconds(req),
            size=size,
            body=msgspec.Raw(videos.vid_gen_body(req)),
        )
        job = await runtime.jobs.submit(KIND, msgspec.json.encode(payload), model=req.model)
        headers: dict[str, str] = {}
        honesty.report(headers, ignored=req.ignored, changed=[], context=None)
        return json_reply(_object(job), headers=headers)

    routes.add("/v1/videos", create, shared=True)  # GET /v1/videos lists them (the app's)
    routes.add("/v1/videos/generations", create)

    async def run(ctx: JobContext) -> JobOutcome:
        return await _run(runtime, ctx)

    runtime.jobs.register(KIND, run)


async def _video(video_id: str) -> JobRecord:
    runtime = app_runtime()
    job = await trio.to_thread.run_sync(read_job, runtime.jobs.path, video_id)
    if job is None or job.kind != KIND:
        raise BlazarError(
            "JOB_NOT_FOUND", f"no video {video_id!r}: see GET /v1/videos (finished videos are pruned in time)"
        )
    return job


async def list_videos() -> Response:
    """The videos, newest first: ``limit`` (default 10, at most 100) and ``after`` (an id)."""
    limit = query_int("limit", 10, high=100)
    if request.args.get("order", "desc") != "desc":
        raise BlazarError("BAD_REQUEST", "only order=desc (newest first) is served", param="order")
    after = request.args.get("after")
    jobs = await trio.to_thread.run_sync(
        lambda: read_jobs(app_runtime().jobs.path, kind=KIND, after=after, limit=limit + 1)
    )
    page = [_object(j) for j in jobs[:limit]]
    return json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(jobs) > limit,
        }
    )


async def get_video(video_id: str) -> Response:
    return json_response(_object(await _video(video_id)))


async def video_content(video_id: str) -> Response:
    """The video of a completed job, in the container sd-server made."""
    variant = request.args.get("variant", "video")
    if variant != "video":
        raise BlazarError(
            "BAD_REQUEST", f"variant {variant!r} is not made here: only the video itself", param="variant"
        )
    job = await _video(video_id)
    if job.state != "completed":
        why = f"it is {job.state}" + (f": {job.error}" if job.error else "")
        raise BlazarError(
            "NOT_FOUND", f"video {video_id!r} has no content: {why} — see GET /v1/videos/{video_id}"
        )
    data = job.result
    if data is None and job.artifact is not None:
        data = await trio.to_thread.run_sync(Path(job.artifact).read_bytes)
    made = msgspec.convert(job.progress, type=_Made) if job.progress else _Made()
    return Response(data or b"", 200, content_type=made.content_type)


def register(app: QuartTrio) -> None:
    app.get("/v1/videos")(list_videos)
    app.get("/v1/videos/<video_id>")(get_video)
    app.get("/v1/videos/<video_id>/content")(video_content)
