"""The video job: one video of stable-diffusion.cpp's native video API, as a durable job.

The job claims the engine at the low admission tier (interactive requests go first), runs
sd-server's native video job (``POST /sdcpp/v1/vid_gen``, polled at ``GET
/sdcpp/v1/jobs/{id}``) and keeps the container it answers as the job's result (a large one
in a file under the data dir). ``POST /v1/videos`` submits it (``blazar/web/routes/openai/videos.py``).
"""

from __future__ import annotations

import msgspec
import trio

from actors.jobs import JobContext, JobOutcome, Runner
from actors.runtime import Runtime
from actors.scheduling import Tier
from actors.upstream import UpstreamError
from blazar.dialects import videos
from blazar.errors import BlazarError
from blazar.serve.claim import claim_engine
from blazar.serve.context import Ask
from blazar.serve.relay import crash_error
from blazar.serve.reply import JSON
from blazar.serve.sdcpp import CANCEL_GRACE_S, POLL_S, exchange, refusal
from registry.kinds import IMAGE_KINDS

__all__ = ["KIND", "Made", "VideoJob", "runner"]

KIND = "video"
_DONE = ("completed", "failed", "cancelled")


class VideoJob(msgspec.Struct, frozen=True, kw_only=True):
    """What a video job carries: what its object shows, and sd-server's body."""

    model: str
    prompt: str
    seconds: str
    size: str
    body: msgspec.Raw


class Made(msgspec.Struct, frozen=True, kw_only=True):
    """The job's progress once done: what its result is."""

    content_type: str = "application/octet-stream"
    frames: int = 0
    fps: int = 0


def runner(runtime: Runtime) -> Runner:
    """Run video jobs on ``runtime``'s stable-diffusion.cpp engines."""

    async def run(ctx: JobContext) -> JobOutcome:
        return await _run(runtime, ctx)

    return run


async def _run(runtime: Runtime, ctx: JobContext) -> JobOutcome:
    job = msgspec.json.decode(ctx.job.request, type=VideoJob)
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
        msgspec.to_builtins(Made(content_type=result.content_type, frames=result.frames, fps=result.fps))
    )
    return JobOutcome(result=result.data)
