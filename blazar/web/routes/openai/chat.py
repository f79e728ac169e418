"""OpenAI routes: ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions``.

The routes decode the request, name its model, and call the service
(``blazar.serve.openai_chat``); a stored chat completion is kept once answered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from actors.runtime import Runtime
from blazar.dialects import ollama_models, openai
from blazar.dialects.stored_chat import store_fields
from blazar.errors import BlazarError
from blazar.serve import openai_chat
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.auth import model_visible, require_model
from blazar.web.asgi.call import Call, Reply, Routes
from blazar.web.asgi.replies import app_runtime, json_response
from blazar.web.routes import streams
from blazar.web.routes.federation import remote_models
from blazar.web.routes.openai import stored
from registry.store import ModelRecord

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

__all__ = ["register", "register_routes"]


async def list_models() -> Response:
    from quart import request

    runtime = app_runtime()
    records = await trio.to_thread.run_sync(runtime.store.list)
    chains = runtime.failover.chains
    data = [
        openai.encode_model(r.name, created=int(r.created_at), blazar_capabilities=_capabilities(r))
        for r in records
        if model_visible(r.name) and r.name not in chains  # a chain of that name wins
    ]
    data += [openai.encode_model(name, created=0) for name in chains if model_visible(name)]
    include = request.args.get("include")
    if include == "remote":
        data += [m for m in remote_models(runtime) if model_visible(str(m["id"]))]
    elif include is not None:
        raise BlazarError(
            "BAD_REQUEST", f"include={include!r} is not known: write include=remote", param="include"
        )
    return json_response(openai.encode_model_list(data))


async def get_model(name: str) -> Response:
    require_model(name)
    runtime = app_runtime()
    if name in runtime.failover.chains:  # a failover chain answers as a model of its own
        return json_response(openai.encode_model(name, created=0))
    record = await trio.to_thread.run_sync(runtime.store.get, name)
    require_model(record.name)
    body = openai.encode_model(
        record.name, created=int(record.created_at), blazar_capabilities=_capabilities(record)
    )
    return json_response(body)


def _capabilities(record: ModelRecord) -> list[str]:
    """What a model is built for, as ``/api/show`` words it (from the store's record alone):
    ``completion`` (with ``tools``, emulated where its template has none, and ``vision`` with
    a projector), ``embedding``, ``rerank``, or a speech model's kind."""
    if record.kind not in ("chat", "embedding", "rerank"):
        return [record.kind]
    return ollama_models.model_capabilities(
        embedding=record.kind == "embedding",
        rerank=record.kind == "rerank",
        tools=True,
        vision=record.projector is not None,
    )


def register(app: QuartTrio) -> None:
    """The model listings, served by the framework (embeddings: ``blazar.web.routes.vectors``)."""
    app.get("/v1/models")(list_models)
    app.get("/v1/models/<path:name>")(get_model)


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """Chat and completions, served by the gateway layer itself (no framework on this path)."""

    async def chat_completions(call: Call) -> Reply:
        store, metadata = store_fields(call.body)
        req = openai.decode_chat_request(call.body)
        call.set_model(req.model)
        reply = await openai_chat.answer_chat(runtime, call, ask_of(call), req)
        return await stored.keep(runtime, call, reply, metadata) if store else reply

    async def completions(call: Call) -> Reply:
        req = openai.decode_completion_request(call.body)
        call.set_model(req.model)
        return await openai_chat.complete_text(runtime, call, ask_of(call), req)

    # an opted-in stream is resumable (GET /v1/stream)
    ender = openai.encode_stream_error
    routes.add(
        "/v1/chat/completions", streams.resumable(runtime, ender, chat_completions), shared=True
    )  # GET lists the stored ones
    routes.add("/v1/completions", streams.resumable(runtime, ender, completions))
