"""Reranking and embeddings through the real gateway, its engine the instant upstream (which
serves ``/v1/rerank`` with ``--reranking`` and pools as llama.cpp does for its flags).

The reranker in the store is the synthetic one (``tests.synthetic_reranker``): its GGUF header
is what makes Blazar start its engine with ``--reranking``; the instant engine scores it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from bench.instant_upstream import rerank_score, token_vector
from blazar.dialects.pooling import mean_pool
from registry.store import Store
from tests.instant import MODEL, Gateway, instant_config, serve_gateway
from tests.synthetic_reranker import cached_reranker

RERANKER = "tiny-reranker"
DOCS = ["a dog in the sea", "the cat sat on the mat", "blue sky", "the cat"]
QUERY = "the cat"


@pytest.fixture(scope="module")
def vector_models(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    models = tmp_path_factory.mktemp("vectors") / "models"
    store = Store(models)
    store.import_file(model_path, MODEL, source="test")
    store.import_file(cached_reranker(), RERANKER, source="test")
    return models


@pytest.fixture
def vector_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vector_models: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(vector_models)
    monkeypatch.setenv("BLAZAR_HOME", str(home))
    monkeypatch.setenv("BENCH_PYTHON", sys.executable)
    return home


@asynccontextmanager
async def gateway(**tunables: Any) -> AsyncIterator[Gateway]:
    async with serve_gateway(instant_config(slots=2, **tunables)) as gw:
        with trio.fail_after(60):
            yield gw


def _expected_order(docs: list[str]) -> list[int]:
    scores = [rerank_score(QUERY, d) for d in docs]
    return sorted(range(len(docs)), key=lambda i: (-scores[i], i))


# -- reranking ---------------------------------------------------------------------------------


async def test_rerank_sorts_cuts_and_returns_documents(vector_home: Path) -> None:
    async with gateway() as gw:
        r = await gw.client.post("/v1/rerank", json={"model": RERANKER, "query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["object"] == "list" and doc["model"] == RERANKER and doc["id"].startswith("rerank-")
        assert [x["index"] for x in doc["results"]] == _expected_order(DOCS) == [3, 1, 0, 2]
        assert all(x["document"] == {"text": DOCS[x["index"]]} for x in doc["results"])
        assert [x["relevance_score"] for x in doc["results"]] == [
            rerank_score(QUERY, DOCS[i]) for i in [3, 1, 0, 2]
        ]
        assert doc["usage"]["prompt_tokens"] == doc["usage"]["total_tokens"] > 0
        engine = await gw.runtime.engine_for(RERANKER)
        assert engine.spec.reranking

        objects = [{"text": d} for d in DOCS]
        body = {
            "model": RERANKER,
            "query": QUERY,
            "documents": objects,
            "top_n": 2,
            "return_documents": False,
        }
        for path in ("/v1/reranking", "/rerank", "/reranking"):
            r = await gw.client.post(path, json=body)
            assert r.status_code == 200, (path, r.text)
            assert r.json()["results"] == [
                {"index": i, "relevance_score": rerank_score(QUERY, DOCS[i])} for i in (3, 1)
            ]


async def test_ollama_rerank_answers_the_same_with_ollama_errors(vector_home: Path) -> None:
    async with gateway() as gw:
        body = {"model": RERANKER, "query": QUERY, "documents": DOCS, "top_n": 1, "keep_alive": "5m"}
        r = await gw.client.post("/api/rerank", json=body)
        assert r.status_code == 200, r.text
        assert [x["index"] for x in r.json()["results"]] == [3]
        r = await gw.client.post("/api/rerank", json={**body, "documents": []})
        assert r.status_code == 400
        assert r.json()["blazar_code"] == "BAD_REQUEST" and "documents" in r.json()["error"]
        r = await gw.client.post("/api/rerank", json={**body, "think": True})
        assert r.status_code == 200 and "think" in r.headers["x-blazar-ignored"]


async def test_rerank_on_a_model_without_a_ranking_head_is_refused_before_it_loads(vector_home: Path) -> None:
    async with gateway() as gw:
        r = await gw.client.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS})
        assert r.status_code == 400
        assert r.json()["error"]["blazar_code"] == "MODEL_CANNOT_RERANK"
        assert "not a reranker" in r.json()["error"]["message"]
        assert (await gw.runtime.engine_for(MODEL)).state.value == "stopped"
        r = await gw.client.post("/v1/embeddings", json={"model": RERANKER, "input": "hi"})
        assert r.status_code == 400 and r.json()["error"]["blazar_code"] == "MODEL_IS_RERANKER"
        chat = {"model": RERANKER, "messages": [{"role": "user", "content": "hi"}]}
        for path in ("/v1/chat/completions", "/api/chat"):
            r = await gw.client.post(path, json=chat)
            assert r.status_code == 400 and "is a reranker" in r.text, (path, r.text)
        r = await gw.client.post("/v1/completions", json={"model": RERANKER, "prompt": "hi"})
        assert r.status_code == 400 and "MODEL_IS_RERANKER" in r.text
        assert (await gw.runtime.engine_for(RERANKER)).state.value == "stopped"
        r = await gw.client.post(
            "/v1/rerank", json={"model": RERANKER, "query": QUERY, "documents": [{"x": 1}]}
        )
        assert r.status_code == 400 and "documents[0]" in r.json()["error"]["message"]
        r = await gw.client.post(
            "/v1/rerank", json={"model": RERANKER, "query": "q", "documents": ["d"], "top_n": 0}
        )
        assert r.status_code == 400


# -- embeddings --------------------------------------------------------------------------------


def _mean_of(tokens: list[int]) -> list[float]:
    return mean_pool([token_vector(t) for t in tokens])


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-5 for x, y in zip(a, b, strict=True))


async def test_token_arrays_are_embedded_in_one_call_and_dimensions_cut(vector_home: Path) -> None:
    async with gateway() as gw:
        r = await gw.client.post("/v1/embeddings", json={"model": MODEL, "input": [[1, 2, 3], [4, 5]]})
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert [d["index"] for d in data] == [0, 1]
        assert _close(data[0]["embedding"], _mean_of([1, 2, 3])) and _close(
            data[1]["embedding"], _mean_of([4, 5])
        )
        assert r.json()["usage"]["prompt_tokens"] == 5
        r = await gw.client.post("/v1/embeddings", json={"model": MODEL, "input": [7, 8], "dimensions": 4})
        (one,) = r.json()["data"]
        assert len(one["embedding"]) == 4 and abs(sum(x * x for x in one["embedding"]) - 1) < 1e-6
        assert _close(one["embedding"], mean_pool([_mean_of([7, 8])[:4]]))
        r = await gw.client.post("/v1/embeddings", json={"model": MODEL, "input": "hi", "dimensions": 9})
        assert r.status_code == 400 and "at most 8" in r.json()["error"]["message"]
        r = await gw.client.post("/v1/embeddings", json={"model": MODEL, "input": [[1], "x"]})
        assert r.status_code == 400 and "input[1]" in r.json()["error"]["message"]


async def test_late_chunking_pools_each_chunk_of_one_pass(vector_home: Path) -> None:
    async with gateway(late_chunking_max_tokens=8) as gw:
        before = (
            await gw.client.post("/v1/embeddings", json={"model": MODEL, "input": [[1, 2], [3]]})
        ).json()
        chunks = [[10, 11], [12, 13, 14]]
        r = await gw.client.post(
            "/v1/embeddings",
            json={"model": MODEL, "input": chunks},
            headers={"X-Blazar-Late-Chunking": "1"},
        )
        assert r.status_code == 200, r.text
        vectors = [d["embedding"] for d in r.json()["data"]]
        assert _close(vectors[0], _mean_of([10, 11])) and _close(vectors[1], _mean_of([12, 13, 14]))
        assert r.json()["usage"]["prompt_tokens"] == 5
        assert (await gw.runtime.engine_for(MODEL)).spec.token_embeddings  # restarted with --pooling none
        # the body field asks the same; strings are tokenized by the engine (4 characters a token here)
        r = await gw.client.post(
            "/v1/embeddings", json={"model": MODEL, "input": ["abcdefgh", "abcd"], "late_chunking": True}
        )
        assert r.status_code == 200 and len(r.json()["data"]) == 2
        # ordinary requests on the restarted engine are pooled by the gateway: the same vectors
        after = (await gw.client.post("/v1/embeddings", json={"model": MODEL, "input": [[1, 2], [3]]})).json()
        assert all(
            _close(a["embedding"], b["embedding"]) for a, b in zip(before["data"], after["data"], strict=True)
        )
        r = await gw.client.post(
            "/api/embed", json={"model": MODEL, "input": ["x" * 20, "y" * 20], "late_chunking": True}
        )
        assert r.status_code == 413 and r.json()["blazar_code"] == "LATE_CHUNKING_TOO_LONG"
        assert "late_chunking_max_tokens (8)" in r.json()["error"]


def test_rerank_routes_are_in_the_embeddings_key_scope_and_have_cards() -> None:
    from blazar.serve.cards import INFERENCE_PATHS
    from blazar.web.asgi.auth import family_of
    from blazar.web.routes.vectors import RERANK_ROUTES

    for path in (*RERANK_ROUTES, "/api/rerank"):
        assert family_of(path) == "embeddings" and path in INFERENCE_PATHS


async def test_ollama_show_names_a_rerankers_one_capability(vector_home: Path) -> None:
    async with gateway() as gw:
        r = await gw.client.post("/api/show", json={"model": RERANKER})
        assert r.status_code == 200, r.text
        assert r.json()["capabilities"] == ["rerank"]  # as an embedding model's is ["embedding"]
        r = await gw.client.post("/api/show", json={"model": MODEL})
        assert r.json()["capabilities"] == ["completion", "tools"]


async def test_a_models_own_late_chunking_limit_overrides_the_global_one(vector_home: Path) -> None:
    from actors.config import ModelOverride

    over = {MODEL: ModelOverride(late_chunking_max_tokens=4)}
    async with gateway(late_chunking_max_tokens=100, models=over) as gw:
        body = {"model": MODEL, "input": [[10, 11], [12]], "late_chunking": True}
        r = await gw.client.post("/v1/embeddings", json=body)
        assert r.status_code == 200, r.text  # 3 tokens: under the model's 4
        r = await gw.client.post("/v1/embeddings", json={**body, "input": [[10, 11], [12, 13, 14]]})
        assert r.status_code == 413 and r.json()["error"]["blazar_code"] == "LATE_CHUNKING_TOO_LONG"
        assert "late_chunking_max_tokens (4)" in r.json()["error"]["message"]
