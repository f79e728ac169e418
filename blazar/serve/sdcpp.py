"""Images and videos from stable-diffusion.cpp's server, under an admission claim.

A generation or an edit goes to sd-server's OpenAI routes (``generate``); a variation or an
upscale runs as a job of its native API (``run_image_job``), as the video job does
(``blazar.serve.jobs.video``).

sd-server runs a variation, an upscale or a video as a job of its native API
(``POST /sdcpp/v1/img_gen`` or ``/vid_gen``, polled at ``GET /sdcpp/v1/jobs/{id}``); its
errors are ``{"error": "…"}``.
"""

from __future__ import annotations

import trio

from actors.engine import EngineActor
from actors.runtime import Runtime
from actors.upstream import UpstreamError, UpstreamResponse
from blazar.dialects import images
from blazar.dialects.images import Images
from blazar.errors import BlazarError
from blazar.serve.claim import claim_engine
from blazar.serve.context import Ask
from blazar.serve.relay import crash_error
from blazar.serve.reply import JSON

__all__ = ["CANCEL_GRACE_S", "POLL_S", "exchange", "generate", "refusal", "run_image_job"]

POLL_S = 0.5
"""How often a job of sd-server's is polled: images take seconds to minutes."""
CANCEL_GRACE_S = 5.0


def refusal(status: int, body: bytes) -> BlazarError:
    """sd-server's error (``{"error": "…"}``) as one of ours."""
    detail = images.engine_error_message(body)
    if status == 429:
        return BlazarError("QUEUE_FULL", f"stable-diffusion.cpp's job queue is full ({detail}) — retry later")
    if status < 500:
        return BlazarError("BAD_REQUEST", f"stable-diffusion.cpp refused the request: {detail}")
    return BlazarError("BAD_GATEWAY", f"stable-diffusion.cpp failed ({status}): {detail}")


async def exchange(response: UpstreamResponse) -> tuple[int, bytes]:
    """The status and whole body of an upstream answer, closed either way."""
    try:
        return response.status_code, await response.aread()
    finally:
        await response.aclose()


async def generate(
    runtime: Runtime, engine: EngineActor, ask: Ask, path: str, body: bytes, content_type: str
) -> Images:
    """One synchronous request to sd-server (its OpenAI routes), under a claim."""
    with await claim_engine(runtime, engine, ask) as claim:
        handle = claim.handle
        try:
            status, content = await exchange(
                await handle.upstream.request("POST", path, body=body, headers={"content-type": content_type})
            )
        except UpstreamError as exc:
            raise await crash_error(engine, handle, exc) from exc
    if status != 200:
        raise refusal(status, content)
    try:
        return images.decode_images(content)
    except ValueError as exc:
        raise BlazarError("BAD_GATEWAY", str(exc)) from None


async def run_image_job(runtime: Runtime, engine: EngineActor, ask: Ask, body: bytes) -> Images:
    """A job of sd-server's native API, submitted and polled under one claim."""
    with await claim_engine(runtime, engine, ask) as claim:
        handle = claim.handle
        upstream = handle.upstream
        try:
            status, content = await exchange(
                await upstream.request("POST", "/sdcpp/v1/img_gen", body=body, headers={"content-type": JSON})
            )
            if status != 202:
                raise refusal(status, content)
            job = images.decode_job(content)
            try:
                while not job.done:
                    await trio.sleep(POLL_S)
                    status, content = await exchange(
                        await upstream.request("GET", f"/sdcpp/v1/jobs/{job.id}")
                    )
                    if status != 200:
                        raise refusal(status, content)
                    job = images.decode_job(content)
            finally:
                if not job.done:  # the client went away: a job still queued can be taken back
                    with trio.move_on_after(CANCEL_GRACE_S, shield=True):
                        await exchange(await upstream.request("POST", f"/sdcpp/v1/jobs/{job.id}/cancel"))
        except UpstreamError as exc:
            raise await crash_error(engine, handle, exc) from exc
        except ValueError as exc:
            raise BlazarError("BAD_GATEWAY", str(exc)) from None
    if job.status != "completed":
        raise BlazarError("BAD_GATEWAY", f"stable-diffusion.cpp's job {job.status}: {job.failure()}")
    try:
        return job.images()
    except ValueError as exc:
        raise BlazarError("BAD_GATEWAY", str(exc)) from None
