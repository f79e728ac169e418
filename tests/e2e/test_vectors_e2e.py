"""Reranking and embeddings on the real daemon and llama.cpp: the synthetic reranker (a real
BERT cross-encoder with random weights, ``tests.synthetic_reranker``) and the test model.

No official rerank client exists, so reranking is driven with httpx; embeddings with the
official ``openai`` client (token arrays, ``dimensions``, late chunking by header)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from registry.store import Store
from tests.support import MODEL, DaemonProc, make_home, start_daemon
from tests.synthetic_reranker import cached_reranker

pytestmark = pytest.mark.slow

RERANKER = "tiny-reranker"
QUERY = "the cat"
DOCS = ["the cat sat on the mat", "a blue sky", "fish in the sea", "the dog", "cat"]


@pytest.fixture(scope="module")
def vectors_daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    home = make_home(
        tmp_path_factory.mktemp("vectors") / "home", model_path, config="slots = 2\ndefault_ctx = 1024\n"
    )
    Store(home / "models").import_file(cached_reranker(), RERANKER, source="test")
    d = start_daemon(home)
    try:
        yield d
    finally:
        d.stop()


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_rerank_order_is_deterministic_and_the_shape_right(vectors_daemon: DaemonProc) -> None:
    url = vectors_daemon.url
    body = {"model": RERANKER, "query": QUERY, "documents": DOCS}
    first = httpx.post(f"{url}/v1/rerank", json=body, timeout=120)
    assert first.status_code == 200, first.text
    doc = first.json()
    results = doc["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) > 1
    assert all(r["document"]["text"] == DOCS[r["index"]] for r in results)
    assert doc["model"] == RERANKER and doc["usage"]["prompt_tokens"] > 0
    # the same weights, the same answer: again, under another name, and cut by top_n
    again = httpx.post(f"{url}/rerank", json={**body, "top_n": 2, "return_documents": False}, timeout=60)
    assert again.json()["results"] == [{"index": r["index"], "relevance_score": r["relevance_score"]}
                                       for r in results[:2]]  # fmt: skip
    engine = next(e for e in vectors_daemon.engines() if e["model"] == RERANKER)
    assert engine["state"] == "ready"
    refused = httpx.post(f"{url}/v1/rerank", json={**body, "model": MODEL}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["blazar_code"] == "MODEL_CANNOT_RERANK"
    refused = httpx.post(f"{url}/v1/embeddings", json={"model": RERANKER, "input": "x"}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["blazar_code"] == "MODEL_IS_RERANKER"


def test_embeddings_batch_token_arrays_dimensions_and_late_chunks(vectors_daemon: DaemonProc) -> None:
    client = openai.OpenAI(base_url=f"{vectors_daemon.url}/v1", api_key="unused", max_retries=0, timeout=120)
    ids = [[28120, 905], [1195, 2644, 2643]]  # SmolLM2's tokens of the two texts (it adds no BOS)
    batch = client.embeddings.create(model=MODEL, input=["hello world", "the cat sat"])
    arrays = client.embeddings.create(model=MODEL, input=ids)
    assert [d.index for d in arrays.data] == [0, 1] and len(arrays.data[0].embedding) == 576
    for a, b in zip(arrays.data, batch.data, strict=True):  # the same tokens, the same vectors
        assert _cos(a.embedding, b.embedding) > 0.999
    # every input of a batch gets its own vector, as alone (not only the first: see --kv-unified)
    alone = client.embeddings.create(model=MODEL, input="the cat sat").data[0].embedding
    assert _cos(alone, batch.data[1].embedding) > 0.999
    short = client.embeddings.create(model=MODEL, input="hello world", dimensions=64)
    vec = short.data[0].embedding
    assert len(vec) == 64 and abs(sum(x * x for x in vec) - 1) < 1e-4
    assert _cos(vec, batch.data[0].embedding[:64]) > 0.999
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MODEL, input="hello", dimensions=10_000)

    chunks = ["The cat sat on the mat.", " It purred all afternoon."]
    late = client.embeddings.create(model=MODEL, input=chunks, extra_headers={"X-Blazar-Late-Chunking": "1"})
    assert len(late.data) == 2
    assert all(abs(sum(x * x for x in d.embedding) - 1) < 1e-4 for d in late.data)
    second = client.embeddings.create(model=MODEL, input=chunks[1]).data[0].embedding
    # the second chunk's tokens saw the first: not the vector of the chunk alone
    assert _cos(late.data[1].embedding, second) < 0.9999
    # longer than the CPU lane's usual prompt step (256): the engine reads a whole input per step
    long = ["the cat sat on the mat " * 25] * 3
    assert (
        len(
            client.embeddings.create(
                model=MODEL, input=long, extra_headers={"X-Blazar-Late-Chunking": "1"}
            ).data
        )
        == 3
    )
    assert len(client.embeddings.create(model=MODEL, input=long[0]).data[0].embedding) == 576
    # ordinary embeddings on the engine now pooling nothing: pooled by the gateway, the same vectors
    after = client.embeddings.create(model=MODEL, input=["hello world", "the cat sat"])
    assert all(_cos(a.embedding, b.embedding) > 0.999 for a, b in zip(after.data, batch.data, strict=True))
    # an input longer than a slot's context is the caller's error, not the engine's
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=MODEL, input="the cat sat on the mat " * 200)
    assert err.value.body["blazar_code"] == "PROMPT_TOO_LONG"  # type: ignore[index]
    assert "maximum context length is 1024 tokens" in err.value.message
