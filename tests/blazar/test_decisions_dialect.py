"""``blazar.dialects.decisions``: the request's checks (each refusal names its field), the
grammar that forces a label's tokens, the scores from log-probabilities and the answer."""

from __future__ import annotations

import math

import msgspec
import pytest

from blazar.dialects import decisions
from blazar.dialects.decisions import DecisionRequest
from blazar.dialects.neutral import DecodeError

NUMBER = {"kind": "number", "question": "q"}


def decode(**body: object) -> DecisionRequest:
    return decisions.decode_request(msgspec.json.encode({"model": "m", "input": "text", **body}))


def refusal(**body: object) -> DecodeError:
    with pytest.raises(DecodeError) as refused:
        decode(**body)
    return refused.value


def test_the_kind_follows_the_fields_sent() -> None:
    req = decode(labels=["safe", "unsafe"], keep_alive="5m")
    assert req.kind == "labels" and req.labels == ["safe", "unsafe"] and req.keep_alive_s == 300
    req = decode(kind="boolean", question="Is it safe?")
    assert req.kind == "boolean" and req.labels == ["yes", "no"]
    req = decode(question="How many?", min=1, max=5)
    assert req.kind == "number" and req.integer and (req.low, req.high) == (1, 5)
    assert not decode(question="How much?", min=0, max=1.5).integer
    assert not decode(question="How much?", min=0, max=1, integer=False).integer


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({}, "labels", "BAD_REQUEST"),
        ({"labels": []}, "labels", "BAD_REQUEST"),
        ({"labels": ["a"]}, "labels", "BAD_REQUEST"),
        ({"labels": ["a", "b", "a"]}, "labels", "BAD_REQUEST"),
        ({"labels": ["a", ""]}, "labels[1]", "BAD_REQUEST"),
        ({"labels": ["a", "x" * 201]}, "labels[1]", "BAD_REQUEST"),
        ({"labels": [str(i) for i in range(65)]}, "labels", "BAD_REQUEST"),
        ({"labels": ["a", "b"], "stream": True}, "stream", "DECISION_NOT_STREAMED"),
        ({"labels": ["a", "b"], "max": 3}, "max", "BAD_REQUEST"),
        ({"kind": "boolean"}, "question", "BAD_REQUEST"),
        ({"kind": "boolean", "question": "q", "labels": ["a", "b"]}, "labels", "BAD_REQUEST"),
        ({**NUMBER, "max": 3}, "min", "BAD_REQUEST"),
        ({**NUMBER, "min": 3, "max": 1}, "min", "BAD_REQUEST"),
        ({**NUMBER, "min": 1.2, "max": 1.8, "integer": True}, "max", "BAD_REQUEST"),
        (
            {**NUMBER, "min": 1, "max": 3, "method": "logprobs"},
            "method",
            "BAD_REQUEST",
        ),
    ],
)
def test_a_bad_body_names_its_field(body: dict[str, object], param: str, code: str) -> None:
    err = refusal(**body)
    assert err.param == param and err.code == code
    assert f"`{param.split('[')[0]}" in err.message


def test_empty_model_or_input_and_wrong_types_are_refused() -> None:
    assert refusal(model=" ", labels=["a", "b"]).param == "model"
    assert refusal(input="", labels=["a", "b"]).param == "input"
    with pytest.raises(DecodeError):
        decode(labels="a,b")
    with pytest.raises(DecodeError):
        decode(kind="ranking", labels=["a", "b"])


def test_the_prompt_names_the_labels_and_the_range() -> None:
    system, user = decisions.answer_messages(decode(labels=["safe", "unsafe"], question="Is it harmful?"))
    assert system.role == "system" and "safe, unsafe" in system.content and "Is it harmful?" in system.content
    assert user.content == "Text: text"
    system, user = decisions.answer_messages(decode(question="How many legs?", min=0, max=8))
    assert "whole number from 0 to 8" in system.content and user.content.endswith("Question: How many legs?")


def test_scores_are_the_labels_probabilities_normalised() -> None:
    scores = decisions.scored_labels({"a": math.log(0.3), "b": math.log(0.1), "c": -1000.0})
    assert list(scores) == ["a", "b", "c"]
    assert scores["a"] == pytest.approx(0.75) and scores["b"] == pytest.approx(0.25)
    assert math.isclose(sum(scores.values()), 1.0)
    assert decisions.label_decision(scores, "logprobs").label == "a"
    tie = decisions.label_decision({"x": 0.5, "y": 0.5}, "logprobs")
    assert tie.label == "x"
    yes = decisions.boolean_decision({"yes": 0.5, "no": 0.5}, "logprobs")
    assert yes.value is True and yes.probability == 0.5


def test_a_label_is_forced_token_by_token_and_summed() -> None:
    assert decisions.forced_grammar([12, 345]) == "root ::= <[12]> <[345]>"
    assert not decisions.needs_end([[1], [2, 3]])
    assert decisions.needs_end([[1], [1, 3]])
    doc = {
        "completion_probabilities": [
            {"id": 12, "logprob": -0.5},
            {"id": 345, "logprob": -1.0},
            {"id": 2, "logprob": -2.0},
        ]
    }
    assert decisions.label_logprob(doc, [12, 345], with_end=False) == -1.5
    assert decisions.label_logprob(doc, [12, 345], with_end=True) == -3.5
    with pytest.raises(ValueError, match="did not follow"):
        decisions.label_logprob(doc, [12, 346], with_end=False)
    with pytest.raises(ValueError, match="completion_probabilities"):
        decisions.label_logprob({"content": "x"}, [12], with_end=False)


def test_a_constrained_answer_is_read_and_held_to_the_range() -> None:
    assert decisions.constrained_label('"not spam"', ["spam", "not spam"]) == "not spam"
    with pytest.raises(ValueError, match="none of the labels"):
        decisions.constrained_label('"maybe"', ["spam", "not spam"])
    whole = decode(question="q", min=1, max=5)
    assert decisions.number_schema(whole) == {"type": "integer", "minimum": 1, "maximum": 5}
    got = decisions.number_decision("4", whole)
    assert got.value == 4 and not got.clamped
    fraction = decode(question="q", min=0, max=1, integer=False)
    assert decisions.number_schema(fraction) == {"type": "number", "minimum": 0, "maximum": 1}
    got = decisions.number_decision("1.0000000000", fraction)
    assert got.value == 1.0 and isinstance(got.value, float) and not got.clamped
    got = decisions.number_decision("1.5", fraction)
    assert got.value == 1.0 and got.clamped
    with pytest.raises(ValueError, match="not a number"):
        decisions.number_decision("true", whole)


def test_the_answer_carries_what_its_kind_has() -> None:
    labels = decisions.label_decision({"a": 0.9, "b": 0.1}, "logprobs")
    doc = msgspec.json.decode(
        decisions.encode_response(
            labels, model="m", decision_id="decision-1", prompt_tokens=40, completion_tokens=2
        )
    )
    assert doc == {
        "id": "decision-1",
        "object": "decision",
        "model": "m",
        "kind": "labels",
        "label": "a",
        "scores": {"a": 0.9, "b": 0.1},
        "method": "logprobs",
        "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42},
    }
    number = decisions.number_decision("9", decode(question="q", min=1, max=5))
    doc = msgspec.json.decode(
        decisions.encode_response(number, model="m", decision_id="d", prompt_tokens=1, completion_tokens=1)
    )
    assert doc["value"] == 5 and doc["clamped"] is True and "scores" not in doc and "label" not in doc
