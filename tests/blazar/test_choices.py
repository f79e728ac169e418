"""The pure decisions behind ``n``, ``best_of`` and cascades: what a candidate is worth,
which one wins, seeds, and what a request asks for."""

from __future__ import annotations

import json
from typing import Any

import pytest

from blazar.dialects.neutral import ResponseFormat
from blazar.errors import BlazarError
from blazar.serve.candidates import choices
from blazar.serve.candidates.choices import Candidate, Pick

SCHEMA = ResponseFormat(
    kind="json_schema",
    schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
)


def test_schema_check_by_format() -> None:
    assert choices.check_schema('{"n": 3}', SCHEMA) is None
    assert choices.check_schema('{"n": "three"}', SCHEMA) == "schema"
    assert choices.check_schema('{"n": 3', SCHEMA) == "schema"  # cut short: not JSON
    assert choices.check_schema("[1]", ResponseFormat(kind="json_object")) == "schema"
    assert choices.check_schema("{}", ResponseFormat(kind="json_object")) is None
    assert choices.check_schema("anything", None) is None
    assert choices.check_schema("anything", ResponseFormat(kind="text")) is None


def test_problem_order_and_kinds() -> None:
    assert choices.problem(text='{"n": 1}', finish_reason="length", fmt=SCHEMA) == "length"
    assert choices.problem(text="  ", finish_reason="stop") == "empty"
    assert choices.problem(text="", finish_reason="tool_calls", tool_calls=1) is None
    assert choices.problem(text="{}", finish_reason="stop", fmt=SCHEMA) == "schema"
    refusal = choices.refusals([r"\bI can(no|')t\b"])
    assert choices.problem(text="Sorry, I CAN'T do that", finish_reason="stop", refusal=refusal) == "refusal"
    assert choices.problem(text="Paris", finish_reason="stop", refusal=refusal) is None


def test_pick_prefers_valid_then_logprob_then_first() -> None:
    assert choices.pick([Candidate("length"), Candidate(None), Candidate(None)]) == Pick(1, "complete")
    assert choices.pick([Candidate("schema"), Candidate("length"), Candidate(None)]) == Pick(2, "schema")
    assert choices.pick([Candidate(None, -2.0), Candidate(None, -0.5), Candidate("length", -0.1)]) == Pick(
        1, "logprob"
    )
    # a valid candidate without a log-probability: no ranking by it, the first valid wins
    assert choices.pick([Candidate(None, -2.0), Candidate(None), Candidate(None, -0.1)]) == Pick(0, "first")
    assert choices.pick([Candidate("length"), Candidate("schema")]) == Pick(0, "none-valid")
    with pytest.raises(ValueError):
        choices.pick([])


def test_a_judge_ranks_valid_candidates_before_their_log_probabilities() -> None:
    ran = [Candidate(None, -0.1, 0.4), Candidate(None, -2.0, 0.9), Candidate("length", -0.1)]
    assert choices.pick(ran) == Pick(1, "judge")
    # ties go to the earlier one; a valid candidate the judge did not read: the usual rules
    assert choices.pick([Candidate(None, None, 0.7), Candidate(None, None, 0.7)]) == Pick(0, "judge")
    assert choices.pick([Candidate(None, -2.0, 0.9), Candidate(None, -0.5)]) == Pick(1, "logprob")


def test_rank_keeps_the_best_n_in_order() -> None:
    ran = [Candidate("length", -0.1), Candidate(None, -1.0), Candidate(None, -0.2), Candidate(None)]
    assert choices.rank(ran, 2) == [2, 1]
    assert choices.rank(ran, 4) == [2, 1, 3, 0]


def test_mean_logprob_of_both_shapes() -> None:
    assert choices.mean_logprob({"content": [{"logprob": -1.0}, {"logprob": -3.0}]}) == -2.0
    assert choices.mean_logprob({"token_logprobs": [-0.5, -1.5, None]}) == -1.0
    assert choices.mean_logprob(None) is None
    assert choices.mean_logprob({"content": []}) is None


def test_seeds_are_distinct_and_reproducible() -> None:
    assert choices.seeds(None, 3) == [None, None, None]
    assert choices.seeds(41, 3) == [41, 42, 43]
    assert choices.seeds(2**32 - 1, 2) == [2**32 - 1, 0]


def test_headers() -> None:
    assert choices.best_of_header(3, Pick(1, "schema")) == "ran=3, winner=1, why=schema"
    assert choices.cascade_header(2, 2, "strong", "valid") == "step=2/2, model=strong, why=valid"


CASCADES = {"smart": (["cheap", "strong"], [r"cannot help"])}


def _wanted(body: dict[str, object], headers: dict[str, str] | None = None, model: str = "m") -> Any:
    return choices.wanted(
        json.dumps(body).encode(), headers or {}, model=model, cascades=CASCADES, default_refusals=["nope"]
    )


def test_wanted_best_of_from_body_or_header() -> None:
    assert _wanted({}).best_of is None
    assert _wanted({"best_of": 3}).best_of == 3
    assert _wanted({}, {choices.BEST_OF_HEADER: "2"}).best_of == 2
    assert _wanted({"best_of": 4}, {choices.BEST_OF_HEADER: "2"}).best_of == 4  # the body wins
    assert _wanted({"best_of": 1}).best_of is None
    for bad in (5, 0, "x", True, 2.5):
        with pytest.raises(BlazarError) as err:
            _wanted({"best_of": bad})
        assert err.value.code == "BAD_REQUEST" and "2 to 4" in err.value.message
    with pytest.raises(BlazarError):
        _wanted({}, {choices.BEST_OF_HEADER: "9"})


def test_wanted_cascade_by_list_name_or_model() -> None:
    listed = _wanted({"cascade": ["a", "b"]})
    assert listed.cascade == ["a", "b"] and [p.pattern for p in listed.refusal] == ["nope"]
    named = _wanted({"cascade": "smart"})
    assert named.cascade == ["cheap", "strong"] and [p.pattern for p in named.refusal] == ["cannot help"]
    assert _wanted({}, model="smart").cascade == ["cheap", "strong"]
    assert _wanted({}, model="cheap").cascade is None
    with pytest.raises(BlazarError) as err:
        _wanted({"cascade": "dumb"})
    assert err.value.code == "CASCADE_NOT_FOUND" and "smart" in err.value.message
    for bad in ([], [1], {"a": 1}, [""]):
        with pytest.raises(BlazarError) as err:
            _wanted({"cascade": bad})
        assert err.value.code == "BAD_REQUEST"
    with pytest.raises(BlazarError, match="at most 4"):
        _wanted({"cascade": ["a", "b", "c", "d", "e"]})
    with pytest.raises(BlazarError, match="do not combine"):
        _wanted({"cascade": ["a", "b"], "best_of": 2})


def test_stats_per_runtime() -> None:
    class R:
        pass

    a, b = R(), R()
    choices.stats_for(a).note("n", candidates=3, tokens=30)
    choices.stats_for(a).note("n", candidates=2, tokens=5)
    assert choices.stats_for(a).candidates == {"n": 5} and choices.stats_for(a).tokens == {"n": 35}
    assert choices.stats_for(b).requests == {}


def test_best_of_alone_ignores_a_cascade_field() -> None:
    assert choices.best_of(3, {}) == 3
    assert choices.best_of(None, {choices.BEST_OF_HEADER: "4"}) == 4
    assert choices.best_of(None, {}) is None


def test_fanout_merges_choices_and_sums_usage() -> None:
    from blazar.serve.candidates import fanout

    def doc(text: str, finish: str, tokens: int, lp: float) -> dict[str, object]:
        return {
            "id": f"c-{text}",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish,
                    "logprobs": {"content": [{"logprob": lp}]},
                }
            ],
            "usage": {
                "prompt_tokens": 5,
                "completion_tokens": tokens,
                "prompt_tokens_details": {"cached_tokens": 2},
            },
            "timings": {"predicted_n": tokens},
        }

    ran = [doc("a", "length", 4, -0.1), doc('{"n": 1}', "stop", 3, -2.0), doc('{"n": 2}', "stop", 2, -0.5)]
    merged = fanout._merge([ran[2], ran[0]], ran, strip_logprobs=True)
    assert [c["index"] for c in merged["choices"]] == [0, 1]
    assert [c["message"]["content"] for c in merged["choices"]] == ['{"n": 2}', "a"]
    assert all(c["logprobs"] is None for c in merged["choices"])
    assert merged["usage"] == {
        "prompt_tokens": 15,
        "completion_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 6},
    }
    assert "timings" not in merged and merged["id"] == 'c-{"n": 2}'
    judged = [fanout._judge(d, SCHEMA, completions=False) for d in ran]
    assert [c.problem for c in judged] == ["length", None, None]
    assert choices.pick(judged) == Pick(2, "logprob")  # -0.5 beats -2.0; the cut one is out
