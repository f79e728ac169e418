"""OpenAI's image routes, served by the stable-diffusion.cpp lane (``sd-server``).

``POST /v1/images/generations`` (JSON), ``/v1/images/edits`` and ``/v1/images/variations``
(multipart) are OpenAI's; ``POST /v1/images/upscale`` (multipart) is Blazar's, the
original product's verb. Each checks the whole request first (``blazar.dialects.images``:
prompt, ``n``, ``size``, formats, that an upload is a PNG, JPEG or WebP and a mask the
size of its image), so a bad one is refused before any engine starts; then resolves the
model, which must be of kind ``image``, claims its engine through admission like any other
request, and asks sd-server:

* a generation is relayed to its ``/v1/images/generations`` with the fields it reads;
* an edit goes to its ``/v1/images/edits`` as a fresh form;
* a variation or an upscale becomes a job of its native API (``POST /sdcpp/v1/img_gen``),
  polled at ``GET /sdcpp/v1/jobs/{id}`` while the request holds its claim; a client that
  goes away cancels the job if it has not started.

The answer is OpenAI's shape. sd-server answers base64 only: ``response_format=url``
keeps each image in the daemon (``blazar.serve.stores.image_files``) and answers its URL,
``GET /v1/images/files/{id}``. Fields without effect are named in ``X-Blazar-Ignored``
(strict mode refuses them); a size the model rounded is named in ``X-Blazar-Changed``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from actors.engine import EngineActor
from actors.engines.multipart import FormError, parse_form
from actors.runtime import Runtime
from blazar.dialects import images
from blazar.dialects.images import Form, ImageInfo, Images
from blazar.errors import BlazarError
from blazar.serve import sdcpp
from blazar.serve.policy import honesty
from blazar.serve.stores.image_files import files_of
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.call import Call, Reply, Routes
from blazar.web.asgi.replies import JSON, app_runtime, error_response
from registry.kinds import IMAGE_KINDS

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

__all__ = ["FILES_PATH", "form_of", "register", "register_routes"]

FILES_PATH = "/v1/images/files/"

_MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
_T = TypeVar("_T")
_R = TypeVar("_R", images.Generation, images.Edit, images.Variation, images.Upscale)


def form_of(call: Call) -> Form:
    """The request's multipart form, by field name."""
    try:
        return parse_form(call.body, call.headers.get("content-type", ""))
    except FormError as exc:
        raise BlazarError("BAD_REQUEST", f"the body is not a multipart form: {exc}") from None


def _checked(runtime: Runtime, call: Call, decode: Callable[[_T], _R], raw: _T) -> _R:
    """Decode and check the request, refuse its ignored fields in strict mode, name its model."""
    req = decode(raw)
    honesty.refuse_ignored(req.ignored, strict=ask_of(call).is_strict(runtime.config.strict))
    call.set_model(req.model)
    return req


async def _engine(runtime: Runtime, model: str) -> EngineActor:
    return await runtime.engine_for(model, kinds=IMAGE_KINDS)


def _first_info(result: Images) -> ImageInfo | None:
    try:
        return images.image_info(images.decode_b64(result.images[0]))
    except ValueError:  # DecodeError is one: an image we cannot read is still relayed
        return None


def _answer(
    runtime: Runtime,
    call: Call,
    result: Images,
    *,
    response_format: str | None,
    ignored: list[str],
    asked: tuple[int, int] | None,
) -> Reply:
    info = _first_info(result)
    changed = []
    if asked is not None and info is not None and (info.width, info.height) != asked:
        changed.append(f"size={info.width}x{info.height}")  # the model's sizes are multiples of 8 or 16
    urls = None
    if response_format == "url":
        store = files_of(runtime)
        kind = _MIME.get(result.output_format, "image/png")
        host = call.headers.get("host") or "localhost"
        try:
            urls = [
                f"{call.scheme}://{host}{FILES_PATH}{store.put(images.decode_b64(b), kind)}"
                for b in result.images
            ]
        except ValueError as exc:
            raise BlazarError("BAD_GATEWAY", str(exc)) from None
    headers: dict[str, str] = {}
    honesty.report(headers, ignored=ignored, changed=changed, context=None)
    return Reply(images.encode_images(int(time.time()), result, urls=urls, size=info), headers=headers)


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """The image routes, served by the gateway layer itself."""

    async def generations(call: Call) -> Reply:
        req = _checked(runtime, call, images.decode_generation, call.body)
        engine = await _engine(runtime, req.model)
        result = await sdcpp.generate(
            runtime, engine, ask_of(call), "/v1/images/generations", images.generation_body(req), JSON
        )
        return _answer(
            runtime, call, result, response_format=req.response_format, ignored=req.ignored, asked=req.size
        )

    async def edits(call: Call) -> Reply:
        req = _checked(runtime, call, images.decode_edit, form_of(call))
        engine = await _engine(runtime, req.model)
        boundary = uuid.uuid4().hex
        body = images.edit_form(req, boundary)
        result = await sdcpp.generate(
            runtime,
            engine,
            ask_of(call),
            "/v1/images/edits",
            body,
            f"multipart/form-data; boundary={boundary}",
        )
        return _answer(
            runtime, call, result, response_format=req.response_format, ignored=req.ignored, asked=req.size
        )

    async def variations(call: Call) -> Reply:
        req = _checked(runtime, call, images.decode_variation, form_of(call))
        engine = await _engine(runtime, req.model)
        result = await sdcpp.run_image_job(runtime, engine, ask_of(call), images.variation_job(req))
        return _answer(
            runtime, call, result, response_format=req.response_format, ignored=req.ignored, asked=req.size
        )

    async def upscale(call: Call) -> Reply:
        req = _checked(runtime, call, images.decode_upscale, form_of(call))
        engine = await _engine(runtime, req.model)
        result = await sdcpp.run_image_job(runtime, engine, ask_of(call), images.upscale_job(req))
        return _answer(
            runtime, call, result, response_format=req.response_format, ignored=req.ignored, asked=None
        )

    routes.add("/v1/images/generations", generations)
    routes.add("/v1/images/edits", edits)
    routes.add("/v1/images/variations", variations)
    routes.add("/v1/images/upscale", upscale)


async def image_file(file_id: str) -> Response:
    """An image answered earlier with ``response_format=url``."""
    from quart import Response

    found = files_of(app_runtime()).get(file_id)
    if found is None:
        return error_response(
            "IMAGE_FILE_NOT_FOUND",
            f"no image {file_id!r} here: image URLs last an hour and end when the daemon restarts "
            "— ask again, or use response_format=b64_json",
        )
    data, kind = found
    return Response(data, 200, content_type=kind, headers={"Cache-Control": "private, max-age=3600"})


def register(app: QuartTrio) -> None:
    app.get(FILES_PATH + "<file_id>")(image_file)
