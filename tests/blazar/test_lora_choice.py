"""A request's ``lora``: by number or by name, checked against the model's adapters."""

from __future__ import annotations

import json

import pytest

from blazar.dialects.lora import choose, in_body
from blazar.errors import BlazarError

ADAPTERS = ["pirate", "poet"]


def test_names_become_the_engines_numbers() -> None:
    got = choose([{"name": "poet", "scale": 0.5}, {"id": 0, "scale": 0}], ADAPTERS, model="m")
    assert got == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.5}]
    assert choose([{"name": "pirate"}], ADAPTERS, model="m") == [{"id": 0, "scale": 1.0}]
    assert choose([], ADAPTERS, model="m") == []


@pytest.mark.parametrize(
    ("value", "adapters", "code", "fragment"),
    [
        ([{"id": 0}], [], "LORA_NOT_FOUND", "has none — add one with `blazar lora add m FILE.gguf`"),
        (
            [{"name": "sailor"}],
            ADAPTERS,
            "LORA_NOT_FOUND",
            "no LoRA adapter 'sailor' (it has 0: pirate, 1: poet)",
        ),
        ([{"id": 2}], ADAPTERS, "LORA_NOT_FOUND", "no LoRA adapter 2"),
        ([{"id": 0, "name": "pirate"}], ADAPTERS, "BAD_REQUEST", "by `id` or by `name`"),
        ([{"scale": 1}], ADAPTERS, "BAD_REQUEST", "by `id` or by `name`"),
        ([{"id": 0, "scale": 99}], ADAPTERS, "BAD_REQUEST", "out of range"),
        ([{"id": 0, "weight": 1}], ADAPTERS, "BAD_REQUEST", "weight"),
        ({"id": 0}, ADAPTERS, "BAD_REQUEST", "give a list"),
    ],
)
def test_bad_choices_are_refused_with_a_code(
    value: object, adapters: list[str], code: str, fragment: str
) -> None:
    with pytest.raises(BlazarError) as caught:
        choose(value, adapters, model="m")
    assert caught.value.code == code and fragment in caught.value.message
    assert caught.value.param == "lora"


def test_a_relayed_body_is_rewritten_only_when_it_has_lora() -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"lora"}]}'
    assert in_body(body, ADAPTERS, model="m") is body  # nothing to do: not even parsed into a dict
    asked = json.dumps({"model": "m", "messages": [], "lora": [{"name": "poet", "scale": 0.25}]}).encode()
    assert json.loads(in_body(asked, ADAPTERS, model="m"))["lora"] == [{"id": 1, "scale": 0.25}]
    with pytest.raises(BlazarError, match="invalid field `lora`"):
        in_body(b'{"lora": "pirate"}', ADAPTERS, model="m")
