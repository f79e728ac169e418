"""Reranking on the wire: ``/v1/rerank`` (Jina's and Cohere's shape) and Ollama's ``/api/rerank``.

Jina and Cohere agree on the core: ``model``, ``query``, ``documents`` (strings, or objects
whose ``text`` is ranked), ``top_n`` and ``return_documents`` in; ``results`` of
``{index, relevance_score, document?}``, best first, out. Where they differ Blazar
answers with both: ``id`` (Cohere) beside ``model``, ``object`` and ``usage`` (Jina,
llama.cpp); ``return_documents`` defaults to true as in Jina's API (Cohere's v1 defaults to
false and v2 never returns them: a client of theirs reads past the extra field).

The engine (llama.cpp started with ``--reranking``) scores every document; sorting,
``top_n`` and the returned documents are the gateway's, so the answer is the same
whichever llama.cpp build runs it. Sans-io: bytes in, bytes out.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from blazar.dialects import params
from blazar.dialects._wire import decode_json
from blazar.dialects.neutral import DecodeError, RerankRequest, RerankResponse, RerankResult
from blazar.dialects.ollama_time import parse_duration_s

__all__ = [
    "decode_engine_scores",
    "decode_ollama_request",
    "decode_request",
    "encode_response",
    "engine_body",
    "rank",
]

_Document = str | dict[str, Any]


class _Body(msgspec.Struct, kw_only=True):
    model: str
    query: str
    documents: list[_Document]
    top_n: Annotated[int, Meta(ge=1)] | None = None
    return_documents: bool | None = None
    rank_fields: list[str] | None = None
    max_chunks_per_doc: Annotated[int, Meta(ge=1)] | None = None
    max_tokens_per_doc: Annotated[int, Meta(ge=1)] | None = None
    user: Any = None


class _OllamaBody(msgspec.Struct, kw_only=True):
    model: str
    query: str
    documents: list[_Document]
    top_n: Annotated[int, Meta(ge=1)] | None = None
    return_documents: bool | None = None
    keep_alive: str | int | float | None = None
    options: dict[str, Any] | None = None


def _texts(documents: list[_Document]) -> list[str]:
    out: list[str] = []
    for i, doc in enumerate(documents):
        if isinstance(doc, str):
            out.append(doc)
            continue
        text = doc.get("text")
        if not isinstance(text, str):
            raise DecodeError(
                f"invalid field `documents[{i}]`: an object needs a string `text` "
                "(images and other fields are not ranked)",
                param=f"documents[{i}]",
            )
        out.append(text)
    return out


def _checked(model: str, query: str, documents: list[_Document]) -> list[str]:
    if not model.strip():
        raise DecodeError("field `model` is empty: name an installed reranker (see `blazar list`)")
    if not query.strip():
        raise DecodeError("field `query` is empty: send the text to rank the documents against")
    if not documents:
        raise DecodeError("field `documents` is empty: send at least one document to rank")
    return _texts(documents)


def decode_request(body: bytes) -> RerankRequest:
    """``POST /v1/rerank`` (and ``/v1/reranking``, ``/rerank``, ``/reranking``)."""
    wire = decode_json(body, _Body)
    docs = _checked(wire.model, wire.query, wire.documents)
    return RerankRequest(
        model=wire.model,
        query=wire.query,
        documents=docs,
        top_n=wire.top_n,
        return_documents=wire.return_documents is not False,
        ignored=params.RERANK.screen(wire),
    )


def decode_ollama_request(body: bytes) -> RerankRequest:
    """``POST /api/rerank``: the same fields, with Ollama's ``keep_alive`` (and ``options``, unused)."""
    wire = decode_json(body, _OllamaBody)
    docs = _checked(wire.model, wire.query, wire.documents)
    table = params.OLLAMA_RERANK
    return RerankRequest(
        model=wire.model,
        query=wire.query,
        documents=docs,
        top_n=wire.top_n,
        return_documents=wire.return_documents is not False,
        keep_alive_s=parse_duration_s(wire.keep_alive),
        ignored=table.screen(wire) + table.unlisted(params.keys_of(body, table.open)),
    )


def engine_body(req: RerankRequest) -> dict[str, Any]:
    """What llama.cpp's ``/v1/rerank`` is sent: every document, scored, in any order."""
    return {"query": req.query, "documents": req.documents, "top_n": len(req.documents)}


def decode_engine_scores(doc: Any, n_documents: int) -> tuple[list[float], int]:
    """llama.cpp's answer → a score per document (in the request's order) and the prompt
    tokens; ``ValueError`` when it does not score each document once."""
    rows = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise ValueError("the engine's rerank answer has no `results`")
    scores: list[float | None] = [None] * n_documents
    for row in rows:
        index, score = row.get("index"), row.get("relevance_score", row.get("score"))
        if not isinstance(index, int) or not 0 <= index < n_documents or not isinstance(score, int | float):
            raise ValueError(f"the engine's rerank answer has a bad result: {row!r}")
        scores[index] = float(score)
    missing = [i for i, s in enumerate(scores) if s is None]
    if missing:
        raise ValueError(f"the engine did not score documents {missing}")
    usage = doc.get("usage") or {}
    tokens = usage.get("prompt_tokens", usage.get("total_tokens", 0))
    return [s for s in scores if s is not None], int(tokens or 0)


def rank(req: RerankRequest, scores: list[float], *, prompt_tokens: int = 0) -> RerankResponse:
    """Best score first (ties keep the documents' order), cut to ``top_n``."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if req.top_n is not None:
        order = order[: req.top_n]
    results = [RerankResult(index=i, score=scores[i]) for i in order]
    return RerankResponse(model=req.model, results=results, prompt_tokens=prompt_tokens)


def encode_response(resp: RerankResponse, req: RerankRequest, *, response_id: str) -> bytes:
    """The answer both families of clients read (see the module's note on where they differ)."""
    results: list[dict[str, Any]] = []
    for r in resp.results:
        row: dict[str, Any] = {"index": r.index, "relevance_score": r.score}
        if req.return_documents:
            row["document"] = {"text": req.documents[r.index]}
        results.append(row)
    usage = {"prompt_tokens": resp.prompt_tokens, "total_tokens": resp.prompt_tokens}
    return msgspec.json.encode(
        {"id": response_id, "object": "list", "model": resp.model, "results": results, "usage": usage}
    )
