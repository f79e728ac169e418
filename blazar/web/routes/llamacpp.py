"""llama.cpp's utility routes through the gateway: ``POST /tokenize``, ``/detokenize``,
``/apply-template`` and ``/infill``, with the gateway's auth, admission and model routing.

The body is the engine's own, plus ``model`` naming the model (which the engine ignores).
The engine must serve the route (its lane's capabilities: ``tokenize`` for the first three,
``infill`` for the last); another lane's model is refused with the lane named. ``/infill``
(fill-in-the-middle) needs a model whose vocabulary has the prefix, suffix and middle
tokens: without them llama.cpp answers 501, which the gateway words as a 400
``MODEL_CANNOT_INFILL`` that says so.
"""

from __future__ import annotations

import msgspec

from actors.runtime import Runtime
from blazar.dialects import openai
from blazar.dialects.llamacpp import infill_refusal
from blazar.errors import BlazarError
from blazar.serve.passthrough import relay_call
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.call import Call, Reply, Routes

__all__ = ["ROUTES", "register_routes"]

ROUTES = {
    "/tokenize": "tokenize",
    "/detokenize": "tokenize",
    "/apply-template": "tokenize",
    "/infill": "infill",
}
"""Each route and the lane capability it needs."""

_decoder = msgspec.json.Decoder(dict[str, object])


def _model_of(call: Call) -> str:
    try:
        doc = _decoder.decode(call.body)
    except msgspec.DecodeError as exc:
        raise BlazarError("INVALID_JSON", f"the body is not a JSON object: {exc}") from None
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise BlazarError(
            "BAD_REQUEST", "missing required field `model`: name the model whose engine should answer"
        )
    return model


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """The utility routes, served by the gateway layer itself."""

    def handler(path: str, needs: str) -> object:
        async def serve(call: Call) -> Reply:
            model = _model_of(call)
            call.set_model(model)
            engine = await runtime.engine_for(model)
            if needs not in engine.lane.capabilities:
                raise BlazarError(
                    "MODEL_UNSUPPORTED_ENGINE",
                    f"model '{model}' runs on {engine.lane.name}, which does not serve {path}; "
                    "only llama.cpp engines do (pin the model to llamacpp to use it)",
                )
            return await relay_call(
                runtime,
                call,
                ask_of(call),
                engine,
                path,
                stream_error=lambda err: openai.encode_stream_error(err.code, err.message),
                refusal=infill_refusal if path == "/infill" else None,
            )

        return serve

    for path, needs in ROUTES.items():
        routes.add(path, handler(path, needs))  # type: ignore[arg-type]
