"""OpenAI's audio routes, served by the speech lanes: transcription, translation, speech.

``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` (multipart) go to the
model's whisper engine, ``POST /v1/audio/speech`` (JSON) to its piper engine. The gateway
reads only the ``model`` field, claims that model's engine through admission like any text
request (slots, queue, priorities, cancellation, keep-alive) and relays the engine's
answer as it comes: a transcript's SSE deltas, audio chunks while synthesis runs. The
engines speak OpenAI's shapes themselves (``actors/engines/whisper_host.py``,
``piper_host.py``), so nothing is translated; an engine's refusal keeps its status and
body, with ``blazar_code`` added. ``GET /v1/audio/voices`` lists the installed voices
from their manifests and starts nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import trio

from actors.engines.multipart import FormError, Part, parse_form
from actors.runtime import Runtime
from blazar.errors import BlazarError
from blazar.serve.passthrough import relay_call
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.call import Call, Reply, Routes
from blazar.web.asgi.replies import app_runtime, json_response
from blazar.web.routes.openai import audio_jobs

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

__all__ = ["register", "register_routes"]

STT = frozenset({"stt"})
TTS = frozenset({"tts"})


class _Model(msgspec.Struct):
    model: str | None = None


def _form(call: Call) -> tuple[str, dict[str, list[Part]]]:
    """The form's ``model`` and its parts."""
    content_type = call.headers.get("content-type", "")
    try:
        form = parse_form(call.body, content_type)
    except FormError as exc:
        raise BlazarError("BAD_REQUEST", f"the body is not a multipart form: {exc}") from None
    parts = form.get("model") or []
    model = parts[0].data.decode("utf-8", "replace").strip() if parts else ""
    if not model:
        raise BlazarError("BAD_REQUEST", "missing required field `model`: name a speech-to-text model")
    return model, form


def _json_model(call: Call) -> str:
    try:
        model = msgspec.json.decode(call.body, type=_Model).model
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BlazarError("BAD_REQUEST", f"the body is not a JSON object with `model`: {exc}") from None
    if not model:
        raise BlazarError("BAD_REQUEST", "missing required field `model`: name a text-to-speech voice")
    return model


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """The audio routes, served by the gateway layer itself."""

    def transcribing(path: str) -> Any:
        async def handler(call: Call) -> Reply:
            model, form = _form(call)
            call.set_model(model)
            engine = await runtime.engine_for(model, kinds=STT)
            if audio_jobs.wants_async(form):
                return await audio_jobs.submit(runtime, call, path, model, form)
            # Audio has no error event: a stream the engine fails midway ends short.
            return await relay_call(
                runtime, call, ask_of(call), engine, path, content_type=call.headers.get("content-type", "")
            )

        return handler

    async def speech(call: Call) -> Reply:
        model = _json_model(call)
        call.set_model(model)
        engine = await runtime.engine_for(model, kinds=TTS)
        return await relay_call(runtime, call, ask_of(call), engine, "/v1/audio/speech")

    for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        routes.add(path, transcribing(path))
    routes.add("/v1/audio/speech", speech)


async def voices() -> Response:
    """The installed voices (text-to-speech models), from their manifests: no engine starts."""
    store = app_runtime().store
    records = await trio.to_thread.run_sync(store.list)
    data = []
    for r in records:
        if r.kind != "tts":
            continue
        facts = r.speech
        data.append(
            {
                "object": "voice",
                "id": r.name,
                "name": r.name,
                "model": r.name,
                "language": facts.language if facts is not None else None,
                "sample_rate": facts.sample_rate if facts is not None else None,
                "speakers": facts.speakers if facts is not None else None,
            }
        )
    return json_response({"object": "list", "data": data})


def register(app: QuartTrio) -> None:
    app.get("/v1/audio/voices")(voices)
