"""Rerank and embeddings on the wire, sans-io: decoding, ranking, pooling and late chunks."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from blazar.dialects import ollama, openai, rerank
from blazar.dialects.neutral import DecodeError, RerankRequest
from blazar.dialects.pooling import fit_dimensions, late_chunks, mean_pool, normalise


def _enc(doc: dict[str, Any]) -> bytes:
    return msgspec.json.encode(doc)


BODY = {"model": "r", "query": "q", "documents": ["a", {"text": "b"}, "c"]}


def test_rerank_request_takes_strings_and_text_objects() -> None:
    req = rerank.decode_request(_enc({**BODY, "top_n": 2, "max_tokens_per_doc": 100, "rank_fields": ["x"]}))
    assert req.documents == ["a", "b", "c"] and req.top_n == 2 and req.return_documents
    assert req.ignored == ["rank_fields", "max_tokens_per_doc"]
    assert not rerank.decode_request(_enc({**BODY, "return_documents": False})).return_documents


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"documents": []}, "documents"),
        ({"documents": [{"image": "x"}]}, "documents[0]"),
        ({"query": " "}, "query"),
        ({"model": ""}, "model"),
        ({"top_n": 0}, "top_n"),
        ({"documents": "a"}, "documents"),
    ],
)
def test_bad_rerank_requests_name_the_field(change: dict[str, Any], named: str) -> None:
    with pytest.raises(DecodeError) as err:
        rerank.decode_request(_enc({**BODY, **change}))
    assert named in err.value.message


def test_ollama_rerank_has_keep_alive_and_names_unknown_keys() -> None:
    req = rerank.decode_ollama_request(
        _enc({**BODY, "keep_alive": "1m", "options": {"a": 1}, "stream": True})
    )
    assert req.keep_alive_s == 60 and req.ignored == ["options", "stream"]


def test_rank_sorts_best_first_ties_in_document_order_and_cuts() -> None:
    req = RerankRequest(model="r", query="q", documents=["a", "b", "c", "d"], top_n=3)
    resp = rerank.rank(req, [0.5, 2.0, 0.5, -1.0], prompt_tokens=9)
    assert [(r.index, r.score) for r in resp.results] == [(1, 2.0), (0, 0.5), (2, 0.5)]
    doc = msgspec.json.decode(rerank.encode_response(resp, req, response_id="rerank-1"))
    assert doc == {
        "id": "rerank-1",
        "object": "list",
        "model": "r",
        "results": [
            {"index": 1, "relevance_score": 2.0, "document": {"text": "b"}},
            {"index": 0, "relevance_score": 0.5, "document": {"text": "a"}},
            {"index": 2, "relevance_score": 0.5, "document": {"text": "c"}},
        ],
        "usage": {"prompt_tokens": 9, "total_tokens": 9},
    }
    bare = msgspec.structs.replace(req, return_documents=False, top_n=None)
    doc = msgspec.json.decode(rerank.encode_response(rerank.rank(bare, [1, 2, 3, 4]), bare, response_id="x"))
    assert [r["index"] for r in doc["results"]] == [3, 2, 1, 0] and "document" not in doc["results"][0]


def test_engine_scores_are_read_back_into_document_order() -> None:
    doc = {"results": [{"index": 1, "relevance_score": 0.2}, {"index": 0, "relevance_score": -3}],
           "usage": {"prompt_tokens": 12}}  # fmt: skip
    assert rerank.decode_engine_scores(doc, 2) == ([-3.0, 0.2], 12)
    assert (
        rerank.engine_body(RerankRequest(model="r", query="q", documents=["a", "b"], top_n=1))["top_n"] == 2
    )
    for bad in (
        {"results": [{"index": 0, "relevance_score": 1}]},
        {"results": [{"index": 5, "score": 1}]},
        {},
    ):
        with pytest.raises(ValueError):
            rerank.decode_engine_scores(bad, 2)


@pytest.mark.parametrize(
    ("value", "inputs"),
    [
        ("hi", ["hi"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_openai_input_shapes(value: Any, inputs: Any) -> None:
    req, _ = openai.decode_embeddings_request(_enc({"model": "m", "input": value}))
    assert req.inputs == inputs and not req.late_chunking


@pytest.mark.parametrize("value", [[], [[1], "x"], [[]], [True, False], [[1.5]], [{"a": 1}]])
def test_openai_input_shapes_refused(value: Any) -> None:
    with pytest.raises(DecodeError):
        openai.decode_embeddings_request(_enc({"model": "m", "input": value}))


def test_late_chunking_is_a_body_field_in_both_dialects() -> None:
    req, _ = openai.decode_embeddings_request(_enc({"model": "m", "input": ["a"], "late_chunking": True}))
    assert req.late_chunking and req.ignored == []
    req = ollama.decode_embed_request(_enc({"model": "m", "input": ["a"], "late_chunking": True}))
    assert req.late_chunking and req.ignored == []


def test_dimensions_cut_and_normalise_and_refuse_more_than_there_are() -> None:
    assert fit_dimensions([3.0, 4.0, 12.0], 2, model="m") == pytest.approx([0.6, 0.8])
    assert fit_dimensions([1.0, 0.0], 2, model="m") == [1.0, 0.0]
    assert fit_dimensions([1.0, 0.0], None, model="m") == [1.0, 0.0]
    with pytest.raises(DecodeError, match="at most 2"):
        fit_dimensions([1.0, 0.0], 3, model="m")


def test_mean_pool_is_the_normalised_mean() -> None:
    assert mean_pool([[1.0, 0.0], [0.0, 1.0]]) == pytest.approx(normalise([0.5, 0.5]))
    with pytest.raises(ValueError):
        mean_pool([])


def test_late_chunks_sit_between_the_special_tokens() -> None:
    plan = late_chunks([[5, 6], [7]], prefix=[101], suffix=[102], max_tokens=5)
    assert plan.tokens == [101, 5, 6, 7, 102] and plan.spans == [(1, 3), (3, 4)]
    vectors = [[9.0, 9.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [9.0, -9.0]]
    assert plan.pool(vectors) == [pytest.approx([1.0, 0.0]), pytest.approx([0.0, 1.0])]
    with pytest.raises(ValueError):
        plan.pool(vectors[:4])
    with pytest.raises(DecodeError) as err:
        late_chunks([[5, 6], [7]], prefix=[101], suffix=[102], max_tokens=4)
    assert err.value.code == "LATE_CHUNKING_TOO_LONG" and "5 tokens" in err.value.message
    with pytest.raises(DecodeError, match=r"input\[1\]"):
        late_chunks([[5], []], max_tokens=10)


def test_an_input_over_the_engines_step_is_a_prompt_too_long() -> None:
    from blazar.dialects.llamacpp import classify_error

    body = (
        b'{"error":{"code":500,"message":"input (1301 tokens) is too large to process. increase the '
        b'physical batch size (current batch size: 1024)","type":"server_error"}}'
    )
    err = classify_error(500, body, ctx_limit=8192, model="m")
    assert err.code == "PROMPT_TOO_LONG" and "1301 tokens" in err.message and "1024" in err.message
