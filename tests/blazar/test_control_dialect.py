"""The steered chat route's own fields, split off the OpenAI body (``blazar.dialects.control``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from blazar.dialects.control import Steering, Vector, split
from blazar.errors import BlazarError


def _body(**extra: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}).encode()


def test_the_steering_is_split_off_and_the_rest_is_plain_chat() -> None:
    steering, rest = split(
        _body(
            control_vectors=[{"name": "calm", "strength": 0.5}, {"path": "/v.gguf"}],
            control_vector_layers=[2, 9],
        )
    )
    assert steering == Steering(
        vectors=[Vector(name="calm", strength=0.5), Vector(path="/v.gguf", strength=1.0)], layers=(2, 9)
    )
    assert json.loads(rest) == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert split(_body(control_vectors=[{"name": "calm", "strength": -3}]))[0].layers is None


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({}, "control_vectors"),
        ({"control_vectors": []}, "control_vectors"),
        ({"control_vectors": {"name": "calm"}}, "control_vectors"),
        ({"control_vectors": ["calm"]}, "control_vectors[0]"),
        ({"control_vectors": [{"name": "calm", "strength": "high"}]}, "control_vectors[0].strength"),
        ({"control_vectors": [{"name": "calm", "strength": True}]}, "control_vectors[0].strength"),
        ({"control_vectors": [{"name": "calm", "path": "/v.gguf"}]}, "control_vectors[0]"),
        ({"control_vectors": [{"strength": 1}]}, "control_vectors[0]"),
        ({"control_vectors": [{"name": 3}]}, "control_vectors[0].name"),
        ({"control_vectors": [{"name": "calm", "scale": 1}]}, "control_vectors[0].scale"),
        ({"control_vectors": [{"name": "calm"}], "control_vector_layers": [5, 2]}, "control_vector_layers"),
        ({"control_vectors": [{"name": "calm"}], "control_vector_layers": [1.5, 2]}, "control_vector_layers"),
        ({"control_vectors": [{"name": "calm"}], "control_vector_layers": 3}, "control_vector_layers"),
    ],
)
def test_wrong_types_are_refused_naming_the_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(BlazarError) as refused:
        split(_body(**extra))
    assert refused.value.code == "BAD_REQUEST" and refused.value.param == param


def test_a_body_that_is_not_an_object_is_refused() -> None:
    for body in (b"[1]", b"{"):
        with pytest.raises(BlazarError):
            split(body)
