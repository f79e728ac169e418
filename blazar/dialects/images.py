"""OpenAI's Images API and stable-diffusion.cpp's server (``sd-server``): pure functions between them.

The requests: ``decode_generation`` (JSON), ``decode_edit``, ``decode_variation`` and
``decode_upscale`` (multipart forms, already split into parts by the caller) check a
request the way OpenAI does and more (the limits sd-server has), so that a bad one is
refused before any engine starts. Each raises ``DecodeError`` naming the field; an
upload that is no PNG, JPEG or WebP, or a mask of another size than its image, carries
the code ``IMAGE_INVALID``.

sd-server's bodies: a generation is relayed to its ``POST /v1/images/generations`` with
only the fields it reads (``generation_body``); an edit is sent to its
``POST /v1/images/edits`` as a new form (``edit_form``). Variations and upscales have no
OpenAI route there: they become jobs of its native API, ``POST /sdcpp/v1/img_gen``
(``variation_job``, ``upscale_job``), polled at ``GET /sdcpp/v1/jobs/{id}``
(``decode_job``). Its answers carry base64 images only (``decode_images``); the reply
to the client is OpenAI's ``{created, data: [{b64_json | url}], …}`` (``encode_images``).
Its errors are ``{"error": "text"}``, or ``{"error": "server_error", "message": …}``
(``engine_error_message``).
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

import msgspec
from msgspec import Meta

from blazar.dialects import params
from blazar.dialects._wire import refuse_huge_integers
from blazar.dialects.neutral import DecodeError

__all__ = [
    "MAX_N",
    "MAX_SIDE",
    "MIN_SIDE",
    "Edit",
    "Generation",
    "ImageInfo",
    "Images",
    "Job",
    "Upload",
    "Upscale",
    "Variation",
    "decode_b64",
    "decode_edit",
    "decode_generation",
    "decode_images",
    "decode_job",
    "decode_upscale",
    "decode_variation",
    "edit_form",
    "encode_images",
    "engine_error_message",
    "form_files",
    "form_int",
    "form_text",
    "generation_body",
    "image_info",
    "parse_size",
    "require_model",
    "require_prompt",
    "screen_form",
    "upscale_job",
    "variation_job",
]

MAX_N = 8
"""sd-server makes at most 8 images per request (it clamps ``batch_count`` to 1..8)."""
MIN_SIDE, MAX_SIDE = 64, 4096
"""The side lengths sd-server's capabilities allow."""
MAX_SCALE = 4.0
IMAGE_CODE = "IMAGE_INVALID"

_GENERATION_FORMATS = ("png", "jpeg", "webp")
_EDIT_FORMATS = ("png", "jpeg")  # sd-server's edits route encodes no WebP
_RESPONSE_FORMATS = ("b64_json", "url")
_SIZE = re.compile(r"(\d{1,5})x(\d{1,5})")
_AT = re.compile(r"at `\$\.(\w+)`")
_MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


class Upload(Protocol):
    """One part of a multipart form (``actors.engines.multipart.Part`` is one)."""

    @property
    def data(self) -> bytes: ...

    @property
    def filename(self) -> str | None: ...


Form = Mapping[str, Sequence[Upload]]


# -- checks shared by every verb ------------------------------------------------------------


def parse_size(value: str | None, *, param: str = "size") -> tuple[int, int] | None:
    """``"512x768"`` → ``(512, 768)``; None or ``"auto"`` → None (the model's default)."""
    if value is None or value == "auto":
        return None
    m = _SIZE.fullmatch(value.strip())
    if m is None:
        raise DecodeError(
            f"invalid `{param}` {value!r}: send WIDTHxHEIGHT in pixels (e.g. 1024x1024), or auto", param=param
        )
    width, height = int(m.group(1)), int(m.group(2))
    if not (MIN_SIDE <= width <= MAX_SIDE and MIN_SIDE <= height <= MAX_SIDE):
        raise DecodeError(
            f"invalid `{param}` {value!r}: each side must be from {MIN_SIDE} to {MAX_SIDE} pixels",
            param=param,
        )
    return width, height


def _check_n(n: int | None) -> int:
    if n is None:
        return 1
    if not 1 <= n <= MAX_N:
        raise DecodeError(
            f"invalid `n` {n}: from 1 to {MAX_N} images per request here (stable-diffusion.cpp's limit) "
            "— send several requests for more",
            param="n",
        )
    return n


def _check_choice(value: str | None, choices: Sequence[str], param: str) -> str | None:
    if value is not None and value not in choices:
        raise DecodeError(f"invalid `{param}` {value!r}: one of {', '.join(choices)}", param=param)
    return value


def _check_compression(value: int | None) -> int | None:
    if value is not None and not 0 <= value <= 100:
        raise DecodeError(f"invalid `output_compression` {value}: from 0 to 100", param="output_compression")
    return value


def require_prompt(value: str | None) -> str:
    if value is None or not value.strip():
        raise DecodeError("missing required field `prompt`: describe the image to make", param="prompt")
    return value


def require_model(value: str | None) -> str:
    if not value:
        raise DecodeError(
            "missing required field `model`: name an image model (see `blazar list`)", param="model"
        )
    return value


# -- the images themselves -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ImageInfo:
    format: str
    """``png``, ``jpeg`` or ``webp``."""
    width: int
    height: int


def _invalid(what: str, detail: str) -> DecodeError:
    return DecodeError(
        f"`{what}` is not a readable PNG, JPEG or WebP image ({detail}) — upload one of those",
        code=IMAGE_CODE,
        param=what,
    )


def image_info(data: bytes, *, param: str = "image") -> ImageInfo:
    """The format and size of an image from its header alone; ``DecodeError``
    (``IMAGE_INVALID``) for anything else."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise _invalid(param, "a PNG without its IHDR header")
        width, height = struct.unpack(">II", data[16:24])
        return ImageInfo("png", width, height)
    if data.startswith(b"\xff\xd8\xff"):
        return _jpeg_info(data, param)
    if len(data) >= 30 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_info(data, param)
    if not data:
        raise _invalid(param, "an empty file")
    raise _invalid(param, "unknown file type")


def _jpeg_info(data: bytes, param: str) -> ImageInfo:
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            break
        marker = data[pos + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        # SOF0..SOF15 carry the frame size, except DHT (C4), JPG (C8) and DAC (CC)
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if pos + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return ImageInfo("jpeg", width, height)
        pos += 2 + length
    raise _invalid(param, "a JPEG without a frame header")


def _webp_info(data: bytes, param: str) -> ImageInfo:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return ImageInfo("webp", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return ImageInfo("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return ImageInfo("webp", width, height)
    raise _invalid(param, "a WebP without a frame header")


# -- form fields -----------------------------------------------------------------------------


def form_text(form: Form, name: str) -> str | None:
    parts = form.get(name) or ()
    return parts[0].data.decode("utf-8", "replace").strip() if parts else None


def form_int(form: Form, name: str) -> int | None:
    raw = form_text(form, name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise DecodeError(f"invalid `{name}` {raw!r}: send an integer", param=name) from None


def _float(form: Form, name: str) -> float | None:
    raw = form_text(form, name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise DecodeError(f"invalid `{name}` {raw!r}: send a number", param=name) from None


def form_files(form: Form, *names: str) -> list[bytes]:
    out = []
    for name in names:
        out += [p.data for p in form.get(name) or ()]
    return out


def screen_form(table: params.Table, form: Form) -> list[str]:
    """The ignored fields a form sets (values as text), raising for a refused one."""
    values = {("image" if k == "image[]" else k): form_text(form, k) for k in form}
    ignored = table.screen(values)
    return ignored + table.unlisted({"": list(values)})


# -- generations -----------------------------------------------------------------------------


class _WireGeneration(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    n: int | None = None
    size: str | None = None
    response_format: str | None = None
    output_format: str | None = None
    output_compression: int | None = None
    quality: str | None = None
    style: str | None = None
    background: str | None = None
    moderation: str | None = None
    partial_images: Annotated[int, Meta(ge=0, le=3)] | None = None
    stream: bool | None = None
    user: str | None = None


@dataclass(slots=True, kw_only=True)
class Generation:
    """``POST /v1/images/generations``, checked."""

    model: str
    prompt: str
    n: int
    size: tuple[int, int] | None
    response_format: str | None
    output_format: str | None
    output_compression: int | None
    ignored: list[str] = field(default_factory=list)
    """What the request set without effect (``X-Blazar-Ignored``)."""


def decode_generation(body: bytes) -> Generation:
    try:
        wire = msgspec.json.decode(body, type=_WireGeneration)
        refuse_huge_integers(wire)
    except msgspec.ValidationError as exc:
        at = _AT.search(str(exc))
        raise DecodeError(f"invalid request body: {exc}", param=at.group(1) if at else None) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(f"the body is not a JSON object: {exc}", code="INVALID_JSON") from None
    req = Generation(
        model=require_model(wire.model),
        prompt=require_prompt(wire.prompt),
        n=_check_n(wire.n),
        size=parse_size(wire.size),
        response_format=_check_choice(wire.response_format, _RESPONSE_FORMATS, "response_format"),
        output_format=_check_choice(wire.output_format, _GENERATION_FORMATS, "output_format"),
        output_compression=_check_compression(wire.output_compression),
    )
    table = params.IMAGE_GENERATIONS
    req.ignored = table.screen(wire) + table.unlisted(params.keys_of(body, ("",)))
    return req


def generation_body(req: Generation) -> bytes:
    """sd-server's ``/v1/images/generations`` body: only what it reads."""
    out: dict[str, Any] = {"prompt": req.prompt, "n": req.n}
    if req.size is not None:
        out["size"] = f"{req.size[0]}x{req.size[1]}"
    if req.output_format is not None:
        out["output_format"] = req.output_format
    if req.output_compression is not None:
        out["output_compression"] = req.output_compression
    return msgspec.json.encode(out)


# -- edits -----------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Edit:
    model: str
    prompt: str
    images: list[bytes]
    mask: bytes | None
    n: int
    size: tuple[int, int] | None
    response_format: str | None
    output_format: str | None
    output_compression: int | None
    ignored: list[str] = field(default_factory=list)


def decode_edit(form: Form) -> Edit:
    """``POST /v1/images/edits``: ``image`` (or ``image[]``, one or more), an optional ``mask``
    of the first image's size, ``prompt`` and the output fields."""
    model = require_model(form_text(form, "model"))
    prompt = require_prompt(form_text(form, "prompt"))
    images = form_files(form, "image", "image[]")
    if not images:
        raise DecodeError("missing required file `image`: upload the image to edit", param="image")
    infos = [image_info(data, param="image") for data in images]
    mask = form_files(form, "mask")
    if mask:
        shape = image_info(mask[0], param="mask")
        if shape.format != "png":
            raise DecodeError("`mask` must be a PNG image (white areas are redrawn, black ones kept)",
                              code=IMAGE_CODE, param="mask")  # fmt: skip
        first = infos[0]
        if (shape.width, shape.height) != (first.width, first.height):
            raise DecodeError(
                f"`mask` is {shape.width}x{shape.height} but the image is {first.width}x{first.height}: "
                "the mask must be the size of the image",
                code=IMAGE_CODE,
                param="mask",
            )
    edit = Edit(
        model=model,
        prompt=prompt,
        images=images,
        mask=mask[0] if mask else None,
        n=_check_n(form_int(form, "n")),
        size=parse_size(form_text(form, "size")),
        response_format=_check_choice(
            form_text(form, "response_format"), _RESPONSE_FORMATS, "response_format"
        ),
        output_format=_check_choice(form_text(form, "output_format"), _EDIT_FORMATS, "output_format"),
        output_compression=_check_compression(form_int(form, "output_compression")),
    )
    edit.ignored = screen_form(params.IMAGE_EDITS, form)
    return edit


def _part(boundary: str, name: str, data: bytes, stem: str | None = None) -> bytes:
    """One form part; ``stem`` makes it a file (named and typed after its format)."""
    disposition = f'form-data; name="{name}"'
    kind = ""
    if stem is not None:
        fmt = image_info(data).format
        disposition += f'; filename="{stem}.{fmt}"'
        kind = f"Content-Type: {_MIME[fmt]}\r\n"
    return f"--{boundary}\r\nContent-Disposition: {disposition}\r\n{kind}\r\n".encode() + data + b"\r\n"


def edit_form(edit: Edit, boundary: str) -> bytes:
    """sd-server's ``/v1/images/edits`` form (``multipart/form-data; boundary=…``): the
    images as ``image[]``, the mask, and the fields it reads."""
    parts = [_part(boundary, "prompt", edit.prompt.encode())]
    parts += [_part(boundary, "image[]", data, f"image{i}") for i, data in enumerate(edit.images)]
    if edit.mask is not None:
        parts.append(_part(boundary, "mask", edit.mask, "mask"))
    parts.append(_part(boundary, "n", str(edit.n).encode()))
    if edit.size is not None:
        parts.append(_part(boundary, "size", f"{edit.size[0]}x{edit.size[1]}".encode()))
    if edit.output_format is not None:
        parts.append(_part(boundary, "output_format", edit.output_format.encode()))
    if edit.output_compression is not None:
        parts.append(_part(boundary, "output_compression", str(edit.output_compression).encode()))
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


# -- variations and upscales: jobs of sd-server's native API --------------------------------


@dataclass(slots=True, kw_only=True)
class Variation:
    model: str
    image: bytes
    n: int
    size: tuple[int, int] | None
    response_format: str | None
    ignored: list[str] = field(default_factory=list)


def _one_image(form: Form) -> bytes:
    images = form_files(form, "image", "image[]")
    if len(images) != 1:
        what = "missing required file `image`" if not images else f"{len(images)} images were sent"
        raise DecodeError(f"{what}: upload exactly one image", param="image")
    image_info(images[0])
    return images[0]


def decode_variation(form: Form) -> Variation:
    """``POST /v1/images/variations``: one ``image``; no prompt, no mask."""
    model = require_model(form_text(form, "model"))
    if form.get("mask"):
        raise DecodeError("variations take no `mask`: send it to /v1/images/edits", param="mask")
    variation = Variation(
        model=model,
        image=_one_image(form),
        n=_check_n(form_int(form, "n")),
        size=parse_size(form_text(form, "size")),
        response_format=_check_choice(
            form_text(form, "response_format"), _RESPONSE_FORMATS, "response_format"
        ),
    )
    variation.ignored = screen_form(params.IMAGE_VARIATIONS, form)
    return variation


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def variation_job(v: Variation) -> bytes:
    """An ``img_gen`` job: the image as ``init_image``, an empty prompt (sd-server's
    native API takes one; its WebUI route refuses it), ``n`` as ``batch_count``;
    ``strength`` stays the server's default (0.75): how far a variation may stray."""
    out: dict[str, Any] = {
        "prompt": "",
        "init_image": _b64(v.image),
        "batch_count": v.n,
        "output_format": "png",
    }
    if v.size is not None:
        out["width"], out["height"] = v.size
    return msgspec.json.encode(out)


@dataclass(slots=True, kw_only=True)
class Upscale:
    model: str
    image: bytes
    upscaler: str
    scale: float
    tile_size: int | None
    denoising_strength: float
    output_format: str | None
    response_format: str | None
    ignored: list[str] = field(default_factory=list)


DEFAULT_UPSCALER = "Lanczos"
DEFAULT_SCALE = 2.0
DEFAULT_DENOISING = 0.2
"""A light refining pass: the upscaled image keeps its content."""


def decode_upscale(form: Form) -> Upscale:
    """``POST /v1/images/upscale`` (Blazar's): one ``image``, ``upscaler``, ``scale``, ``tile_size``,
    ``denoising_strength``, ``output_format``, ``response_format``."""
    model = require_model(form_text(form, "model"))
    image = _one_image(form)
    scale = _float(form, "scale")
    if scale is not None and not 1.0 < scale <= MAX_SCALE:
        raise DecodeError(f"invalid `scale` {scale:g}: above 1 and at most {MAX_SCALE:g}", param="scale")
    tile = form_int(form, "tile_size")
    if tile is not None and tile <= 0:
        raise DecodeError(f"invalid `tile_size` {tile}: a positive number of pixels", param="tile_size")
    strength = _float(form, "denoising_strength")
    if strength is not None and not 0.0 < strength <= 1.0:
        raise DecodeError(
            f"invalid `denoising_strength` {strength:g}: above 0 and at most 1", param="denoising_strength"
        )
    upscale = Upscale(
        model=model,
        image=image,
        upscaler=form_text(form, "upscaler") or DEFAULT_UPSCALER,
        scale=scale or DEFAULT_SCALE,
        tile_size=tile,
        denoising_strength=strength or DEFAULT_DENOISING,
        output_format=_check_choice(form_text(form, "output_format"), _GENERATION_FORMATS, "output_format"),
        response_format=_check_choice(
            form_text(form, "response_format"), _RESPONSE_FORMATS, "response_format"
        ),
    )
    upscale.ignored = screen_form(params.IMAGE_UPSCALE, form)
    return upscale


def upscale_job(u: Upscale) -> bytes:
    """An ``img_gen`` job whose hires pass is the upscale: the image as ``init_image``,
    lightly redrawn (``strength``), upscaled by ``hires.upscaler`` and refined at
    ``hires.denoising_strength``."""
    hires: dict[str, Any] = {
        "enabled": True,
        "upscaler": u.upscaler,
        "scale": u.scale,
        "denoising_strength": u.denoising_strength,
    }
    if u.tile_size is not None:
        hires["upscale_tile_size"] = u.tile_size
    out = {
        "prompt": "",
        "init_image": _b64(u.image),
        "strength": u.denoising_strength,
        "batch_count": 1,
        "hires": hires,
        "output_format": u.output_format or "png",
    }
    return msgspec.json.encode(out)


# -- sd-server's answers ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Images:
    images: list[str]
    """Each image as base64 text, as the engine sent it."""
    output_format: str


class _Item(msgspec.Struct):
    b64_json: str


class _Reply(msgspec.Struct):
    data: list[_Item]
    output_format: str = "png"


def decode_images(body: bytes) -> Images:
    """sd-server's ``{created, output_format, data: [{b64_json}]}``; ``ValueError`` when it is not."""
    try:
        reply = msgspec.json.decode(body, type=_Reply)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"stable-diffusion.cpp answered an unexpected body: {exc}") from None
    if not reply.data:
        raise ValueError("stable-diffusion.cpp answered no image")
    return Images([item.b64_json for item in reply.data], reply.output_format)


class _JobImages(msgspec.Struct):
    images: list[_Item] = []
    output_format: str = "png"


class _JobError(msgspec.Struct):
    code: str = ""
    message: str = ""


class Job(msgspec.Struct):
    """A job of sd-server's native API, as ``POST /sdcpp/v1/img_gen`` (202) and
    ``GET /sdcpp/v1/jobs/{id}`` answer it."""

    id: str
    status: str
    """``queued``, ``generating``, ``completed``, ``failed`` or ``cancelled``."""
    result: _JobImages | None = None
    error: _JobError | None = None

    @property
    def done(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")

    def images(self) -> Images:
        if self.result is None or not self.result.images:
            raise ValueError(f"stable-diffusion.cpp's job {self.id} completed without an image")
        return Images([i.b64_json for i in self.result.images], self.result.output_format)

    def failure(self) -> str:
        e = self.error
        return f"{e.message} ({e.code})" if e is not None and e.message else self.status


def decode_job(body: bytes) -> Job:
    try:
        return msgspec.json.decode(body, type=Job)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"stable-diffusion.cpp answered an unexpected job: {exc}") from None


def engine_error_message(body: bytes) -> str:
    """The text of an sd-server error body (``{"error": "prompt required"}``, or
    ``{"error": "server_error", "message": …}``), else the body itself, cut short."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        doc = None
    if isinstance(doc, dict):
        error, message = doc.get("error"), doc.get("message")
        if isinstance(error, dict):
            error, message = error.get("message"), None
        text = ": ".join(str(x) for x in (error, message) if x)
        if text:
            return text
    return body[:300].decode("utf-8", "replace") or "no detail"


# -- the answer ------------------------------------------------------------------------------


def decode_b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"stable-diffusion.cpp answered an image that is not base64: {exc}") from None


def encode_images(
    created: int, images: Images, *, urls: Sequence[str] | None = None, size: ImageInfo | None = None
) -> bytes:
    """OpenAI's image response: ``data[i]`` is ``{"url"}`` when ``urls`` are given, else
    ``{"b64_json"}``; ``size`` (of the first image) and ``output_format`` as gpt-image
    models answer them."""
    data: list[dict[str, str]]
    if urls is not None:
        data = [{"url": u} for u in urls]
    else:
        data = [{"b64_json": b} for b in images.images]
    out: dict[str, Any] = {"created": created, "data": data, "output_format": images.output_format}
    if size is not None:
        out["size"] = f"{size.width}x{size.height}"
    return msgspec.json.encode(out)
