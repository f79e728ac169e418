"""Vectors from an engine: embeddings (batched, shortened, late-chunked) and reranking.

Both go through ``EngineCall`` like chat: admission, loading, leases and a restart when
the engine must run differently (embeddings on; a vector per token for late chunking).
A reranker (a GGUF whose pooling type is rank) starts with ``--reranking`` and serves
``/v1/rerank`` only. The rules and shapes are in docs/api.md (Embeddings, Reranking); the
routes are ``blazar.web.routes.vectors``.
"""

from __future__ import annotations

import secrets
from typing import Any

from actors.runtime import Runtime
from blazar.dialects import engine_usage, rerank
from blazar.dialects.neutral import ChatRequest, EmbedRequest, EmbedResponse, RerankRequest
from blazar.dialects.pooling import LateChunks, fit_dimensions, late_chunks, mean_pool
from blazar.errors import BlazarError
from blazar.serve.context import Ask
from blazar.serve.engine_call import EngineCall, Purpose

__all__ = ["embed", "run_rerank"]


def _call(
    runtime: Runtime, model: str, keep_alive_s: float | None, ignored: list[str], ask: Ask
) -> EngineCall:
    chat = ChatRequest(model=model, messages=[], keep_alive_s=keep_alive_s, ignored=ignored)
    return EngineCall(runtime, chat, ask)


def _note_usage(call: EngineCall, prompt_tokens: int) -> None:
    if call.card is not None:
        call.card.note_usage(engine_usage.EngineUsage(prompt_tokens=prompt_tokens))


async def embed(runtime: Runtime, req: EmbedRequest, ask: Ask) -> tuple[EmbedResponse, EngineCall]:
    """Embeddings of every input in one engine call, restarting the engine with a pooling
    type if needed; the call says how it ran (``timings``, ``headers()``)."""
    late = req.late_chunking
    purpose: Purpose = "embed_tokens" if late else "embed"
    call = _call(runtime, req.model, req.keep_alive_s, req.ignored, ask)
    await call.prepare(purpose=purpose)
    try:
        assert call.engine is not None
        if late:
            vectors, tokens = await _late_chunked(call, req)
        elif call.engine.spec.token_embeddings:
            vectors, tokens = await _pooled_here(call, req.inputs)
        else:
            doc = await call.post("/v1/embeddings", {"input": req.inputs, "encoding_format": "float"})
            rows = sorted(doc.get("data") or [], key=lambda d: d.get("index", 0))
            vectors = [list(d["embedding"]) for d in rows]
            tokens = int((doc.get("usage") or {}).get("prompt_tokens") or 0)
    finally:
        call.release()
    if len(vectors) != len(req.inputs):
        raise BlazarError(
            "BAD_GATEWAY", f"the engine gave {len(vectors)} embeddings for {len(req.inputs)} inputs"
        )
    vectors = [fit_dimensions(v, req.dimensions, model=req.model) for v in vectors]
    _note_usage(call, tokens)
    return EmbedResponse(model=req.model, embeddings=vectors, prompt_tokens=tokens), call


async def _token_vectors(call: EngineCall, inputs: list[Any]) -> list[list[list[float]]]:
    """A vector per token of each input, from an engine that pools nothing."""
    doc = await call.post("/embeddings", {"content": inputs})
    rows = doc if isinstance(doc, list) else []
    rows = sorted(rows, key=lambda d: d.get("index", 0))
    return [d["embedding"] for d in rows]


async def _pooled_here(call: EngineCall, inputs: list[Any]) -> tuple[list[list[float]], int]:
    """Ordinary embeddings on an engine restarted for late chunking (it pools nothing now):
    the mean of each input's token vectors, normalised, as llama.cpp's mean pooling gives."""
    per_input = await _token_vectors(call, inputs)
    return [mean_pool(t) for t in per_input], sum(len(t) for t in per_input)


async def _tokens_of(call: EngineCall, text: str, *, special: bool) -> list[int]:
    doc = await call.post("/tokenize", {"content": text, "add_special": special})
    return [int(t) for t in doc["tokens"]]


async def _specials(call: EngineCall, sample: str, plain: list[int]) -> tuple[list[int], list[int]]:
    """The special tokens the model puts around a text (BOS, or ``[CLS]`` … ``[SEP]``)."""
    framed = await _tokens_of(call, sample, special=True)
    for start in range(len(framed) - len(plain) + 1):
        if framed[start : start + len(plain)] == plain:
            return framed[:start], framed[start + len(plain) :]
    return [], []


async def _late_chunked(call: EngineCall, req: EmbedRequest) -> tuple[list[list[float]], int]:
    assert call.engine is not None
    inputs = req.inputs
    if inputs and isinstance(inputs[0], str):
        texts = [str(x) for x in inputs]
        chunks = [await _tokens_of(call, t, special=False) for t in texts]
        prefix, suffix = await _specials(call, texts[0], chunks[0])
    else:  # token arrays: the caller's tokens, as they are
        chunks, prefix, suffix = [list(map(int, x)) for x in inputs], [], []
    config = call.runtime.config
    over = config.models.get(call.engine.spec.alias or call.engine.spec.model)
    limit = config.late_chunking_max_tokens
    if over is not None and over.late_chunking_max_tokens is not None:
        limit = over.late_chunking_max_tokens
    plan: LateChunks = late_chunks(chunks, prefix=prefix, suffix=suffix, max_tokens=limit)
    ctx = call.context or call.engine.spec.ctx_per_slot
    if len(plan.tokens) > ctx:
        raise BlazarError(
            "PROMPT_TOO_LONG",
            f"the late-chunked input has {len(plan.tokens)} tokens, more than the {ctx} a slot of "
            f"'{req.model}' holds: send fewer chunks, or raise the model's ctx in config.toml",
        )
    (vectors,) = await _token_vectors(call, [plan.tokens])
    try:
        return plan.pool(vectors), len(plan.tokens)
    except ValueError as exc:
        raise BlazarError("BAD_GATEWAY", f"late chunking: {exc}") from exc


async def run_rerank(runtime: Runtime, req: RerankRequest, ask: Ask) -> tuple[bytes, EngineCall]:
    """Score every document on the reranker's engine; the gateway sorts and cuts."""
    call = _call(runtime, req.model, req.keep_alive_s, req.ignored, ask)
    await call.prepare(purpose="rerank")
    try:
        doc = await call.post("/v1/rerank", rerank.engine_body(req))
    finally:
        call.release()
    try:
        scores, tokens = rerank.decode_engine_scores(doc, len(req.documents))
    except ValueError as exc:
        raise BlazarError("BAD_GATEWAY", f"the engine for '{req.model}' failed: {exc}") from exc
    _note_usage(call, tokens)
    resp = rerank.rank(req, scores, prompt_tokens=tokens)
    return rerank.encode_response(resp, req, response_id=f"rerank-{secrets.token_hex(12)}"), call
