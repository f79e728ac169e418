"""OpenAI's Videos API (Sora's verbs) and stable-diffusion.cpp's video jobs: pure functions.

``POST /v1/videos`` (multipart, as OpenAI's SDK sends it) is checked by ``decode_video``
before any engine starts and becomes the body of sd-server's native video job,
``POST /sdcpp/v1/vid_gen`` (``vid_gen_body``): the prompt, the size, the frame count
(``seconds`` at ``fps``, or Blazar's ``video_frames``; sd-server keeps the largest
``4n + 1`` frames not above it), ``input_reference`` as the first frame (``init_image``)
and the container (``webm``, ``webp`` or ``avi``). A finished job carries that container
whole, as base64 (``decode_video_job``). ``video_object`` is OpenAI's ``video`` object
for a job of the daemon's.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import msgspec

from blazar.dialects import params
from blazar.dialects.images import (
    Form,
    form_files,
    form_int,
    form_text,
    image_info,
    parse_size,
    require_model,
    require_prompt,
    screen_form,
)
from blazar.dialects.neutral import DecodeError

__all__ = [
    "CONTAINERS",
    "DEFAULT_FPS",
    "VideoRequest",
    "VideoResult",
    "decode_video",
    "decode_video_job",
    "frames_for",
    "vid_gen_body",
    "video_object",
]

DEFAULT_FPS = 16
"""Wan's own frame rate."""
MAX_SECONDS = 20
MAX_FRAMES = 1025
CONTAINERS = {"webm": "video/webm", "webp": "image/webp", "avi": "video/x-msvideo"}
"""sd-server's containers and their types (``webm`` needs a server built with WebM)."""


@dataclass(slots=True, kw_only=True)
class VideoRequest:
    model: str
    prompt: str
    seconds: int | None
    video_frames: int | None
    fps: int
    size: tuple[int, int] | None
    reference: bytes | None
    output_format: str
    ignored: list[str] = field(default_factory=list)


def frames_for(seconds: int, fps: int) -> int:
    """The frames of ``seconds`` at ``fps`` as sd-server makes them: ``4n + 1``, one frame
    more than the seconds' worth (the first), never more."""
    total = seconds * fps + 1
    return total - (total - 1) % 4


def _positive(value: int | None, name: str, high: int) -> int | None:
    if value is not None and not 1 <= value <= high:
        raise DecodeError(f"invalid `{name}` {value}: from 1 to {high}", param=name)
    return value


def decode_video(form: Form) -> VideoRequest:
    """``POST /v1/videos``: ``model``, ``prompt``, ``seconds``, ``size``, ``input_reference``,
    and Blazar's ``fps``, ``video_frames`` and ``output_format``."""
    model = require_model(form_text(form, "model"))
    prompt = require_prompt(form_text(form, "prompt"))
    for remix in ("remix_video_id", "remixed_from_video_id"):
        if form_text(form, remix):
            raise DecodeError(
                f"`{remix}`: remixing a video is not served here — describe it anew", param=remix
            )
    seconds = _positive(form_int(form, "seconds"), "seconds", MAX_SECONDS)
    frames = _positive(form_int(form, "video_frames"), "video_frames", MAX_FRAMES)
    if seconds is not None and frames is not None:
        raise DecodeError("send `seconds` or `video_frames`, not both", param="video_frames")
    fps = _positive(form_int(form, "fps"), "fps", 60) or DEFAULT_FPS
    references = form_files(form, "input_reference")
    if len(references) > 1:
        raise DecodeError("one `input_reference` image at most", param="input_reference")
    if references:
        image_info(references[0], param="input_reference")
    container = form_text(form, "output_format") or "webm"
    if container not in CONTAINERS:
        raise DecodeError(
            f"invalid `output_format` {container!r}: one of {', '.join(CONTAINERS)}", param="output_format"
        )
    request = VideoRequest(
        model=model,
        prompt=prompt,
        seconds=seconds,
        video_frames=frames,
        fps=fps,
        size=parse_size(form_text(form, "size")),
        reference=references[0] if references else None,
        output_format=container,
    )
    request.ignored = screen_form(params.VIDEOS, form)
    return request


def vid_gen_body(req: VideoRequest) -> bytes:
    """sd-server's ``/sdcpp/v1/vid_gen`` body."""
    out: dict[str, Any] = {"prompt": req.prompt, "fps": req.fps, "output_format": req.output_format}
    if req.size is not None:
        out["width"], out["height"] = req.size
    frames = req.video_frames or (frames_for(req.seconds, req.fps) if req.seconds else None)
    if frames is not None:
        out["video_frames"] = frames
    if req.reference is not None:
        out["init_image"] = base64.b64encode(req.reference).decode("ascii")
    return msgspec.json.encode(out)


class _VideoResult(msgspec.Struct):
    b64_json: str
    output_format: str = "webm"
    mime_type: str = ""
    fps: int = 0
    frame_count: int = 0


class _JobError(msgspec.Struct):
    code: str = ""
    message: str = ""


class _VideoJob(msgspec.Struct):
    id: str
    status: str
    result: _VideoResult | None = None
    error: _JobError | None = None


@dataclass(frozen=True, slots=True)
class VideoResult:
    data: bytes
    content_type: str
    frames: int
    fps: int


def decode_video_job(body: bytes) -> tuple[str, str, VideoResult | None, str | None]:
    """``(id, status, result, error)`` of a ``GET /sdcpp/v1/jobs/{id}`` answer for a video
    job; ``ValueError`` when it is not one."""
    try:
        job = msgspec.json.decode(body, type=_VideoJob)
        result = None
        if job.result is not None:
            kind = job.result.mime_type or CONTAINERS.get(
                job.result.output_format, "application/octet-stream"
            )
            data = base64.b64decode(job.result.b64_json, validate=True)
            result = VideoResult(data, kind, job.result.frame_count, job.result.fps)
    except (msgspec.MsgspecError, ValueError) as exc:
        raise ValueError(f"stable-diffusion.cpp answered an unexpected video job: {exc}") from None
    error = None
    if job.error is not None and job.error.message:
        error = f"{job.error.message} ({job.error.code})"
    return job.id, job.status, result, error


_STATUS = {"queued": "queued", "running": "in_progress", "completed": "completed"}


def video_object(
    *,
    video_id: str,
    model: str | None,
    state: str,
    created_at: float,
    updated_at: float,
    seconds: str,
    size: str,
    prompt: str | None,
    error: str | None,
) -> dict[str, Any]:
    """OpenAI's ``video`` object for a job in ``state`` (the jobs' states: queued, running,
    completed, failed, cancelled; ``cancelled`` is Blazar's, OpenAI has none)."""
    done = state in ("completed", "failed", "cancelled")
    doc: dict[str, Any] = {
        "id": video_id,
        "object": "video",
        "model": model,
        "status": _STATUS.get(state, state),
        "progress": 100 if state == "completed" else 0,
        "created_at": int(created_at),
        "completed_at": int(updated_at) if done else None,
        "expires_at": None,
        "seconds": seconds,
        "size": size,
        "prompt": prompt,
        "remixed_from_video_id": None,
        "error": None,
    }
    if error is not None or state in ("failed", "cancelled"):
        doc["error"] = {
            "code": "cancelled" if state == "cancelled" else "generation_failed",
            "message": error or state,
        }
    return doc
