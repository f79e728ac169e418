"""OpenAI's video routes (Sora's verbs), served by the stable-diffusion.cpp lane with a video model.

``POST /v1/videos`` (and the original product's ``/v1/videos/generations``) checks the
request (``blazar.dialects.videos``), resolves the model (kind ``image``: a video
diffusion model such as Wan), and queues a durable job of kind ``video``
(``blazar/serve/jobs/video.py`` runs it); it answers at once with OpenAI's ``video``
object, ``queued``.

``GET /v1/videos/{video_id}`` is the object as the job stands; ``/content`` the video
once completed; ``GET /v1/videos`` lists them, newest first. A video is a job of the
daemon's like any other: ``/v1/jobs`` shows it and cancels it, and it is pruned with
the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio

from actors.jobs import JobRecord, read_job, read_jobs
from actors.runtime import Runtime
from blazar.dialects import videos
from blazar.errors import BlazarError
from blazar.serve.jobs.video import KIND, Made, VideoJob
from blazar.serve.policy import honesty
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.call import Call, Reply, Routes
from blazar.web.asgi.replies import app_runtime, json_reply, json_response, query_int
from blazar.web.routes.openai.images import form_of
from registry.kinds import IMAGE_KINDS

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

__all__ = ["register", "register_routes"]


def _seconds(req: videos.VideoRequest) -> str:
    if req.seconds is not None:
        return str(req.seconds)
    if req.video_frames is not None:
        return f"{(req.video_frames - 1) / req.fps:g}"
    return ""


def _object(job: JobRecord) -> dict[str, object]:
    asked = msgspec.json.decode(job.request, type=VideoJob)
    made = msgspec.convert(job.progress, type=Made) if job.progress else None
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


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """``POST /v1/videos`` (and ``/v1/videos/generations``)."""

    async def create(call: Call) -> Reply:
        req = videos.decode_video(form_of(call))
        honesty.refuse_ignored(req.ignored, strict=ask_of(call).is_strict(runtime.config.strict))
        call.set_model(req.model)
        await runtime.engine_for(req.model, kinds=IMAGE_KINDS)  # the kind and the lane, checked now
        size = f"{req.size[0]}x{req.size[1]}" if req.size is not None else ""
        payload = VideoJob(
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
    from quart import request

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
    from quart import Response, request

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
    made = msgspec.convert(job.progress, type=Made) if job.progress else Made()
    return Response(data or b"", 200, content_type=made.content_type)


def register(app: QuartTrio) -> None:
    app.get("/v1/videos")(list_videos)
    app.get("/v1/videos/<video_id>")(get_video)
    app.get("/v1/videos/<video_id>/content")(video_content)
