"""What the image routes and the video job share about stable-diffusion.cpp's own API.

sd-server runs a variation, an upscale or a video as a job of its native API
(``POST /sdcpp/v1/img_gen`` or ``/vid_gen``, polled at ``GET /sdcpp/v1/jobs/{id}``); its
errors are ``{"error": "…"}``.
"""

from __future__ import annotations

from actors.upstream import UpstreamResponse
from blazar.dialects import images
from blazar.errors import BlazarError

__all__ = ["CANCEL_GRACE_S", "POLL_S", "exchange", "refusal"]

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
