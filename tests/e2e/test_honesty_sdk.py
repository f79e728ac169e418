"""Never silently ignore, on the real daemon with the official clients: every inference
response names the parameters that had no effect (``X-Blazar-Ignored``) and those run with
another value (``X-Blazar-Changed``), says its context, and strict mode refuses both;
routes of a dialect's API that Blazar does not serve answer 501."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support import MODEL, DaemonProc

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hi."}]
STRICT = {"x-blazar-strict": "1"}


@pytest.fixture(scope="module")
def oai(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ant(daemon: DaemonProc) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(daemon: DaemonProc) -> httpx.Client:
    return httpx.Client(base_url=daemon.url, timeout=120)


def _context(headers: Any) -> int:
    return int(headers["x-blazar-context"])


# -- OpenAI ---------------------------------------------------------------------


def test_openai_chat_names_what_it_ignores(oai: openai.OpenAI) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=HI,
        max_tokens=4,
        user="someone",
        logit_bias={"1": -1},
        seed=1,  # type: ignore[arg-type]
    )
    assert raw.headers["x-blazar-ignored"] == "user"
    assert "x-blazar-changed" not in raw.headers
    assert _context(raw.headers) > 0
    assert raw.parse().choices[0].message is not None


def test_openai_chat_stream_carries_the_headers(oai: openai.OpenAI) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=HI,  # type: ignore[arg-type]
        max_tokens=4,
        stream=True,
        service_tier="auto",
        store=True,
        metadata={"k": "v"},
    )
    assert raw.headers["x-blazar-ignored"] == "service_tier"  # store and metadata keep the stream
    assert _context(raw.headers) > 0
    assert list(raw.parse())  # the stream itself is unchanged


def test_openai_output_limit_above_the_context_is_changed_or_refused(oai: openai.OpenAI) -> None:
    # Streamed and left after the headers: the answer may run to the whole context (the engine
    # then decodes thousands of tokens, past the client's timeout on a busy machine), and only
    # the headers are what this test is about; leaving cancels the rest.
    with oai.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=HI,  # type: ignore[arg-type]
        max_tokens=100_000,
        stream=True,
    ) as raw:
        ctx = _context(raw.headers)
        assert raw.headers["x-blazar-changed"] == f"max_tokens={ctx}"
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=100_000, extra_headers=STRICT)  # type: ignore[arg-type]
    body: Any = err.value.body
    assert body["blazar_code"] == "PARAMETER_CHANGED" and body["param"] == "max_tokens"
    assert "max_tokens is too large: 100000" in body["message"]


def test_openai_strict_refuses_an_ignored_parameter(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, user="u", extra_headers=STRICT)  # type: ignore[arg-type]
    body: Any = err.value.body
    assert body["blazar_code"] == "PARAMETER_IGNORED" and body["param"] == "user"
    # nothing to report: strict mode lets it through
    ok = oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=HI, max_tokens=4, extra_headers=STRICT
    )  # type: ignore[arg-type]
    assert "x-blazar-ignored" not in ok.headers


def test_openai_refuses_what_llama_cpp_cannot_do(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, n=9)  # type: ignore[arg-type]
    body: Any = err.value.body
    assert body["blazar_code"] == "BAD_REQUEST" and "Invalid 'n'" in body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        oai.completions.create(model=MODEL, prompt="Hi", max_tokens=4, echo=True)
    assert (err.value.body or {})["param"] == "echo"  # type: ignore[index]


def test_openai_completions_and_responses_name_what_they_ignore(oai: openai.OpenAI) -> None:
    raw = oai.completions.with_raw_response.create(model=MODEL, prompt="Hi", max_tokens=4, user="u")
    assert raw.headers["x-blazar-ignored"] == "user" and _context(raw.headers) > 0
    resp = oai.responses.with_raw_response.create(
        model=MODEL, input="Say hi.", max_output_tokens=16, user="u", store=False
    )
    assert resp.headers["x-blazar-ignored"] == "user" and _context(resp.headers) > 0
    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(model=MODEL, input="Hi", user="u", store=False, extra_headers=STRICT)
    assert (err.value.body or {})["blazar_code"] == "PARAMETER_IGNORED"  # type: ignore[index]


def test_openai_unimplemented_route_is_501(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as err:
        oai.moderations.create(input="hello")
    assert err.value.status_code == 501
    body: Any = err.value.body
    assert body["blazar_code"] == "NOT_IMPLEMENTED" and "/v1/moderations" in body["message"]


# -- Anthropic ------------------------------------------------------------------


def test_anthropic_names_what_it_ignores(ant: anthropic.Anthropic) -> None:
    raw = ant.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=8,
        messages=HI,
        metadata={"user_id": "u"},
        extra_body={"top_k": 5},  # type: ignore[arg-type]
    )
    assert raw.headers["x-blazar-ignored"] == "metadata"
    assert _context(raw.headers) > 0
    assert raw.parse().content


def test_anthropic_stream_names_a_changed_output_limit(ant: anthropic.Anthropic) -> None:
    raw = ant.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=100_000,
        messages=HI,
        # greedy, the test model answers in a few tokens; sampled, it may run to the context
        extra_body={"temperature": 0},
        stream=True,  # type: ignore[arg-type]
    )
    assert raw.headers["x-blazar-changed"] == f"max_tokens={_context(raw.headers)}"
    assert "x-blazar-ignored" not in raw.headers
    assert [e.type for e in raw.parse()][-1] == "message_stop"


def test_anthropic_strict_refuses_in_its_own_shape(ant: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as err:
        ant.messages.create(
            model=MODEL, max_tokens=8, messages=HI, extra_body={"service_tier": "auto"}, extra_headers=STRICT
        )  # type: ignore[arg-type]
    body: Any = err.value.body
    assert body["type"] == "error" and body["error"]["blazar_code"] == "PARAMETER_IGNORED"
    assert "service_tier" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as err:
        ant.messages.create(model=MODEL, max_tokens=100_000, messages=HI, extra_headers=STRICT)  # type: ignore[arg-type]
    body = err.value.body
    assert body["error"]["blazar_code"] == "PARAMETER_CHANGED"
    assert body["error"]["message"].startswith("max_tokens: 100000 > ")


def test_anthropic_unimplemented_route_is_501(ant: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.APIStatusError) as err:
        # the legacy Text Completions route (this SDK no longer wraps it)
        body = {"model": MODEL, "prompt": "\n\nHuman: hi\n\nAssistant:", "max_tokens_to_sample": 4}
        ant.post("/v1/complete", body=body, cast_to=httpx.Response)
    assert err.value.status_code == 501
    body: Any = err.value.body
    assert body["type"] == "error" and body["error"]["blazar_code"] == "NOT_IMPLEMENTED"
    assert "/v1/messages" in body["error"]["message"]


# -- Ollama ---------------------------------------------------------------------


def test_ollama_chat_names_ignored_options(http: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "messages": HI,
        "stream": False,
        "options": {"num_predict": 4, "mirostat": 0, "num_gpu": 1, "use_mmap": False, "not_an_option": 1},
    }
    r = http.post("/api/chat", json=body)
    assert r.status_code == 200, r.text
    assert r.headers["x-blazar-ignored"] == "options.num_gpu,options.use_mmap,options.not_an_option"
    assert _context(r.headers) > 0
    assert r.json()["done"] is True


def test_ollama_generate_stream_names_a_changed_output_limit(http: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "Hi", "template": "{{ .Prompt }}", "options": {"num_predict": 100_000}}
    with http.stream("POST", "/api/generate", json={**body, "options": {"num_predict": 4}}) as r:
        assert r.status_code == 200
        assert r.headers["x-blazar-ignored"] == "template"
        assert "x-blazar-changed" not in r.headers
        assert r.read().strip().splitlines()[-1].endswith(b"}")
    with http.stream("POST", "/api/generate", json={**body, "template": ""}) as r:
        # cut at the context, not refused: the stream starts at once (its end is not waited for)
        assert r.headers["x-blazar-changed"] == f"options.num_predict={_context(r.headers)}"
        assert "x-blazar-ignored" not in r.headers


def test_ollama_strict_refuses_in_its_own_shape(http: httpx.Client) -> None:
    body = {"model": MODEL, "messages": HI, "stream": False, "options": {"num_thread": 2}}
    r = http.post("/api/chat", json=body, headers=STRICT)
    assert r.status_code == 400
    assert r.json()["blazar_code"] == "PARAMETER_IGNORED" and "options.num_thread" in r.json()["error"]
    r = http.post("/api/chat", json={**body, "options": {"num_ctx": 1_000_000}}, headers=STRICT)
    assert r.status_code == 400 and r.json()["blazar_code"] == "CONTEXT_TOO_LARGE"


def test_ollama_unimplemented_route_is_501(http: httpx.Client) -> None:
    r = http.post("/api/me")
    assert r.status_code == 501
    assert r.json()["blazar_code"] == "NOT_IMPLEMENTED" and "error" in r.json()


def test_embeddings_name_what_they_ignore(oai: openai.OpenAI, http: httpx.Client) -> None:
    raw = oai.embeddings.with_raw_response.create(model=MODEL, input="hello", user="u")
    assert raw.headers["x-blazar-ignored"] == "user" and _context(raw.headers) > 0
    r = http.post(
        "/api/embed", json={"model": MODEL, "input": "hello", "truncate": True, "options": {"a": 1}}
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-blazar-ignored"] == "truncate,options"


def test_ollama_num_ctx_above_the_model_is_clamped_and_named(http: httpx.Client) -> None:
    """Last: the engine restarts at the model's whole training context."""
    body = {
        "model": MODEL,
        "messages": HI,
        "stream": False,
        "options": {"num_predict": 4, "num_ctx": 1_000_000},
    }
    r = http.post("/api/chat", json=body)
    assert r.status_code == 200, r.text
    ctx = _context(r.headers)
    assert r.headers["x-blazar-changed"] == f"options.num_ctx={ctx}" and ctx < 1_000_000
