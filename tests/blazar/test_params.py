"""The parameter tables (blazar.dialects.params) against the decoders that use them: every
ignored or refused parameter a table lists is noticed by its route's decoder, and nothing else is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from blazar.dialects import (
    anthropic,
    images,
    ollama,
    openai,
    params,
    rerank,
    responses,
    unimplemented,
    videos,
)
from blazar.dialects.neutral import DecodeError
from blazar.dialects.params import Treatment
from tests.blazar.test_images_dialect import FakePart, png

_USER = [{"role": "user", "content": "hi"}]


def _as_form(decode: Callable[[images.Form], Any]) -> Callable[[bytes], Any]:
    """A multipart route's decoder, fed the JSON body's fields as form parts (its files
    are always a real image, whatever the value)."""

    def run(body: bytes) -> Any:
        fields: dict[str, list[FakePart]] = {}
        for name, value in msgspec.json.decode(body).items():
            if name in ("image", "mask", "input_reference"):
                fields[name] = [FakePart(png(64, 64, gray=name == "mask"), f"{name}.png")]
            else:
                text = str(value).lower() if isinstance(value, bool) else str(value)
                fields[name] = [FakePart(text.encode())]
        return decode(fields)

    return run


ROUTES: dict[str, tuple[Callable[[bytes], Any], dict[str, Any]]] = {
    "/v1/chat/completions": (openai.decode_chat_request, {"model": "m", "messages": _USER}),
    "/v1/completions": (openai.decode_completion_request, {"model": "m", "prompt": "hi"}),
    "/v1/embeddings": (lambda b: openai.decode_embeddings_request(b)[0], {"model": "m", "input": "hi"}),
    "/v1/responses": (responses.decode_request, {"model": "m", "input": "hi"}),
    "/api/chat": (ollama.decode_chat_request, {"model": "m", "messages": _USER}),
    "/api/generate": (ollama.decode_generate_request, {"model": "m", "prompt": "hi"}),
    "/api/embed": (ollama.decode_embed_request, {"model": "m", "input": "hi"}),
    "/api/embeddings": (ollama.decode_legacy_embeddings_request, {"model": "m", "prompt": "hi"}),
    "/v1/rerank": (rerank.decode_request, {"model": "m", "query": "q", "documents": ["d"]}),
    "/api/rerank": (rerank.decode_ollama_request, {"model": "m", "query": "q", "documents": ["d"]}),
    "/v1/messages": (
        anthropic.decode_messages_request,
        {"model": "m", "max_tokens": 2048, "messages": _USER},
    ),
    "/v1/images/generations": (images.decode_generation, {"model": "m", "prompt": "a cat"}),
    "/v1/images/edits": (_as_form(images.decode_edit), {"model": "m", "prompt": "a cat", "image": 1}),
    "/v1/images/variations": (_as_form(images.decode_variation), {"model": "m", "image": 1}),
    "/v1/images/upscale": (_as_form(images.decode_upscale), {"model": "m", "image": 1}),
    "/v1/videos": (_as_form(videos.decode_video), {"model": "m", "prompt": "waves"}),
}

PROBES: dict[str, Any] = {
    "n": 2,
    "best_of": 2,
    "echo": True,
    "modalities": ["text", "audio"],
    "context": [1, 2, 3],
    "truncate": True,
    "options": {"num_ctx": 512},
    "thinking.budget_tokens": 1024,
    "thinking.display": "omitted",
    "tool_choice.disable_parallel_tool_use": True,
    "include": ["reasoning.encrypted_content"],
    "top_logprobs": 3,
    "max_tool_calls": 2,
    "parallel_tool_calls": False,
    "truncation": "auto",
    "rank_fields": ["title"],
    "max_chunks_per_doc": 2,
    "max_tokens_per_doc": 100,
    "partial_images": 2,
    "stream": True,
    "repeats": 2,
}
"""A value that asks for something, per parameter (default: the string ``"x"``)."""

BASES: dict[str, dict[str, Any]] = {
    "thinking.budget_tokens": {"thinking": {"type": "enabled"}},
    "thinking.display": {"thinking": {"type": "adaptive"}},
    "tool_choice.disable_parallel_tool_use": {"tool_choice": {"type": "auto"}},
}


def _with(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    doc = msgspec.json.decode(msgspec.json.encode({**body, **BASES.get(path, {})}))
    *outer, last = path.split(".")
    node = doc
    for part in outer:
        node = node.setdefault(part, {})
    node[last] = value
    return doc


def _decode(route: str, doc: dict[str, Any]) -> Any:
    decoder, _ = ROUTES[route]
    return decoder(msgspec.json.encode(doc))


def _cases(*treatments: Treatment) -> list[tuple[str, str]]:
    return [(t.route, p.name) for t in params.TABLES for p in t.params.values() if p.treatment in treatments]


def test_every_table_has_a_decoder() -> None:
    assert sorted(t.route for t in params.TABLES) == sorted(ROUTES)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_plain_request_ignores_nothing(route: str) -> None:
    assert _decode(route, ROUTES[route][1]).ignored == []


@pytest.mark.parametrize(("route", "name"), _cases(Treatment.IGNORED))
def test_each_ignored_parameter_is_named(route: str, name: str) -> None:
    req = _decode(route, _with(ROUTES[route][1], name, PROBES.get(name, "x")))
    if name == "include":
        assert req.ignored == ["include:reasoning.encrypted_content"]
    else:
        assert req.ignored == [name]


@pytest.mark.parametrize(("route", "name"), _cases(Treatment.REFUSED))
def test_each_refused_parameter_is_refused_naming_it(route: str, name: str) -> None:
    with pytest.raises(DecodeError) as err:
        _decode(route, _with(ROUTES[route][1], name, PROBES.get(name, "x")))
    assert err.value.param == name
    assert f"`{name}`" in err.value.message


@pytest.mark.parametrize(
    ("route", "name", "value"),
    [
        ("/v1/chat/completions", "n", 1),
        ("/v1/chat/completions", "store", False),
        ("/v1/chat/completions", "modalities", ["text"]),
        ("/v1/completions", "echo", False),
        ("/v1/completions", "best_of", 1),
        ("/v1/responses", "parallel_tool_calls", True),
        ("/v1/responses", "truncation", "disabled"),
        ("/api/embed", "truncate", False),
        ("/api/generate", "suffix", ""),
        ("/v1/messages", "tool_choice.disable_parallel_tool_use", False),
    ],
)
def test_a_value_that_asks_for_nothing_is_not_named(route: str, name: str, value: Any) -> None:
    assert _decode(route, _with(ROUTES[route][1], name, value)).ignored == []


@pytest.mark.parametrize(("route", "name"), _cases(Treatment.HONOURED, Treatment.CHANGED))
def test_no_honoured_parameter_is_named(route: str, name: str) -> None:
    """Whatever an honoured parameter is set to, it is never reported as ignored (a value the
    decoder refuses for its type is fine: then it is refused, not ignored)."""
    for value in (1, "x", True):
        try:
            req = _decode(route, _with(ROUTES[route][1], name, value))
        except DecodeError:
            continue
        assert name not in req.ignored


def test_keys_outside_the_dialect_are_named_where_the_body_is_open() -> None:
    chat = _decode("/api/chat", {"model": "m", "messages": _USER, "shift": True, "options": {"foo": 1}})
    assert chat.ignored == ["shift", "options.foo"]
    msg = _decode("/v1/messages", {**ROUTES["/v1/messages"][1], "temprature": 0.5})
    assert msg.ignored == ["temprature"]
    # the OpenAI routes are relayed: a key of llama.cpp's own goes to the engine
    assert _decode("/v1/chat/completions", {"model": "m", "messages": _USER, "foo": 1}).ignored == []


def test_ollama_sampling_options_reach_the_engine() -> None:
    req = _decode(
        "/api/chat",
        {"model": "m", "messages": _USER, "options": {"mirostat": 2, "num_keep": 5, "typical_p": 0.5}},
    )
    assert req.ignored == []
    assert req.sampling == {"mirostat": 2, "n_keep": 5, "typical_p": 0.5}
    assert req.output_param == "options.num_predict"


def test_a_translation_drops_what_only_llama_cpp_honours() -> None:
    table = params.OPENAI_CHAT
    dropped = table.dropped_when_translated(
        ["model", "messages", "tools", "logprobs", "mirostat", "foo", "user"]
    )
    assert dropped == ["logprobs", "mirostat", "foo"]


def test_the_output_limit_is_named_in_the_callers_words() -> None:
    chat = _decode("/v1/chat/completions", {"model": "m", "messages": _USER, "max_completion_tokens": 5})
    assert chat.output_param == "max_completion_tokens"
    assert _decode("/v1/messages", ROUTES["/v1/messages"][1]).output_param == "max_tokens"


def test_keys_of_skips_values() -> None:
    body = b'{"model": "m", "options": {"a": [1, {"b": 2}], "c": null}, "x": {"y": 1}}'
    assert params.keys_of(body, ("", "options")) == {"": ["model", "options", "x"], "options": ["a", "c"]}


@pytest.mark.parametrize(
    ("path", "prefix"),
    [
        ("/v1/assistants", "/v1/assistants"),
        ("/v1/assistants/asst_1", "/v1/assistants"),
        ("/v1/fine_tuning/jobs", "/v1/fine_tuning"),
        ("/v1/audio/speech", "/v1/audio"),
        ("/v1/complete", "/v1/complete"),
        ("/api/me", "/api/me"),
    ],
)
def test_unimplemented_routes_are_found(path: str, prefix: str) -> None:
    entry = unimplemented.lookup(path)
    assert entry is not None and entry.prefix == prefix


@pytest.mark.parametrize("path", ["/v1/assistantsx", "/v1/completions", "/api/mex", "/no/such"])
def test_other_paths_are_not_unimplemented_routes(path: str) -> None:
    assert unimplemented.lookup(path) is None
