"""The embeddings and reranking routes: OpenAI's and Ollama's two embeddings routes, and the
reranking routes under every name clients use. They decode, run ``blazar.serve.vectors``
and encode; the federation can relay them to a peer as it does chat.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from actors.runtime import Runtime
from blazar.dialects import ollama, ollama_embed, openai, rerank
from blazar.dialects.neutral import EmbedRequest, RerankRequest
from blazar.serve.policy.honesty import truthy
from blazar.serve.vectors import embed, run_rerank
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.call import Call, Handler, Reply, Routes

__all__ = ["LATE_CHUNKING_HEADER", "RERANK_ROUTES", "late_chunking_asked", "register_routes"]

LATE_CHUNKING_HEADER = "x-blazar-late-chunking"
RERANK_ROUTES = ("/v1/rerank", "/v1/reranking", "/rerank", "/reranking")
"""Jina's and Cohere's path, and llama.cpp's other names for it; all answer the same."""


def late_chunking_asked(req: EmbedRequest, call: Call) -> EmbedRequest:
    """``req`` with ``late_chunking`` on when the body or ``X-Blazar-Late-Chunking: 1``
    (``true``, ``yes``, ``on``) asks for it."""
    if req.late_chunking or not truthy(call.headers.get(LATE_CHUNKING_HEADER)):
        return req
    return msgspec.structs.replace(req, late_chunking=True)


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """Embeddings (OpenAI's and Ollama's two) and reranking, served by the gateway layer
    itself, where the federation can relay them to a peer as it does chat."""

    async def openai_embeddings(call: Call) -> Reply:
        req, fmt = openai.decode_embeddings_request(call.body)
        call.set_model(req.model)
        resp, engine_call = await embed(runtime, late_chunking_asked(req, call), ask_of(call))
        return Reply(openai.encode_embeddings(resp, encoding_format=fmt), headers=engine_call.headers())

    async def ollama_embed_route(call: Call) -> Reply:
        req = ollama.decode_embed_request(call.body)
        call.set_model(req.model)
        resp, engine_call = await embed(runtime, late_chunking_asked(req, call), ask_of(call))
        t = engine_call.timings
        body = ollama_embed.encode_embed_response(
            resp, total_ns=t.total_ns, load_ns=t.load_ns if t.loaded else 0
        )
        return Reply(body, headers=engine_call.headers())

    async def ollama_embeddings_legacy(call: Call) -> Reply:
        req = ollama.decode_legacy_embeddings_request(call.body)
        call.set_model(req.model)
        if not req.inputs:
            return Reply(ollama_embed.encode_legacy_embedding([]))
        resp, engine_call = await embed(runtime, late_chunking_asked(req, call), ask_of(call))
        vector = ollama_embed.encode_legacy_embedding(resp.embeddings[0])
        return Reply(vector, headers=engine_call.headers())

    def reranking(decode: Callable[[bytes], RerankRequest]) -> Handler:
        async def serve(call: Call) -> Reply:
            req = decode(call.body)
            call.set_model(req.model)
            body, engine_call = await run_rerank(runtime, req, ask_of(call))
            return Reply(body, headers=engine_call.headers())

        return serve

    routes.add("/v1/embeddings", openai_embeddings)
    routes.add("/api/embed", ollama_embed_route)
    routes.add("/api/embeddings", ollama_embeddings_legacy)
    for path in RERANK_ROUTES:
        routes.add(path, reranking(rerank.decode_request))
    routes.add("/api/rerank", reranking(rerank.decode_ollama_request))
