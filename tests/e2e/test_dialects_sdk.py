"""The Ollama and Anthropic dialects (and tool calling everywhere) with the official clients."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support import MODEL, DaemonProc

pytestmark = pytest.mark.slow

WEATHER_OPENAI = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_ANTHROPIC = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": WEATHER_OPENAI["function"]["parameters"],  # type: ignore[index]
}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def oll(daemon: DaemonProc) -> ollama.Client:
    return ollama.Client(host=daemon.url, timeout=60)


@pytest.fixture(scope="module")
def ant(daemon: DaemonProc) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=60)


# -- Ollama ---------------------------------------------------------------------


def test_ollama_probe_version_list_show(daemon: DaemonProc, oll: ollama.Client) -> None:
    import httpx

    assert httpx.get(daemon.url).text == "Ollama is running"
    assert httpx.head(daemon.url).status_code == 200
    major, minor, patch = httpx.get(f"{daemon.url}/api/version").json()["version"].split(".")
    assert all(part.isdigit() for part in (major, minor, patch))
    models = oll.list().models
    assert [m.model for m in models] == [f"{MODEL}:latest"]
    assert models[0].details is not None and models[0].details.quantization_level == "Q4_1"
    shown = oll.show(f"{MODEL}:latest")
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 8192
    assert shown.capabilities is not None and "completion" in shown.capabilities


def test_ollama_chat_and_generate(oll: ollama.Client) -> None:
    options = {"num_predict": 12, "temperature": 0, "seed": 3}
    r = oll.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], options=options)
    assert r.message.content and r.done and r.eval_count and r.eval_count <= 12
    assert r.prompt_eval_count and r.total_duration and r.eval_duration
    parts = list(
        oll.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], options=options, stream=True)
    )
    assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
    assert "".join(p.message.content or "" for p in parts) == r.message.content  # same seed, same answer
    g = oll.generate(model=MODEL, prompt="The sky is", options=options)
    assert g.response and g.done
    streamed = list(oll.generate(model=MODEL, prompt="The sky is", options=options, stream=True))
    assert "".join(p.response for p in streamed) == g.response


def test_ollama_embed_ps_and_unload(oll: ollama.Client) -> None:
    e = oll.embed(model=MODEL, input=["hello", "world"])
    assert len(e.embeddings) == 2 and len(e.embeddings[0]) == 576
    assert oll.embeddings(model=MODEL, prompt="hello").embedding
    running = oll.ps().models
    assert [m.model for m in running] == [f"{MODEL}:latest"]
    assert oll.generate(model=MODEL, keep_alive=0).done_reason == "unload"
    assert oll.ps().models == []
    assert oll.generate(model=MODEL).done_reason == "load"
    assert len(oll.ps().models) == 1


def test_ollama_pull_copy_delete(oll: ollama.Client) -> None:
    statuses = [p.status for p in oll.pull(MODEL, stream=True)]
    assert statuses[-1] == "success"
    assert oll.copy(MODEL, "smol-copy").status == "success"
    assert {m.model for m in oll.list().models} == {f"{MODEL}:latest", "smol-copy:latest"}
    assert oll.delete("smol-copy").status == "success"
    assert [m.model for m in oll.list().models] == [f"{MODEL}:latest"]


def test_a_pull_is_a_job(daemon: DaemonProc, oll: ollama.Client) -> None:
    import httpx

    assert [p.status for p in oll.pull(MODEL, stream=True)][-1] == "success"
    with pytest.raises(ollama.ResponseError) as info:
        oll.pull("ghost-model-xyz")
    assert info.value.status_code == 404
    jobs = httpx.get(f"{daemon.url}/v1/jobs", params={"kind": "pull"}).json()["data"]
    newest = [(j["model"], j["status"]) for j in jobs][:2]
    assert newest == [("ghost-model-xyz", "failed"), (MODEL, "completed")]
    events = httpx.get(f"{daemon.url}/v1/jobs/{jobs[1]['id']}/events").json()["data"]
    assert events and events[-1]["data"]["status"] == "success"


def test_ollama_errors(oll: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        oll.chat(model="ghost", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 404 and "blazar pull ghost" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        oll.push(MODEL)
    assert info.value.status_code == 403


# -- Anthropic ------------------------------------------------------------------


def test_anthropic_create_and_stream(ant: anthropic.Anthropic) -> None:
    system = [{"type": "text", "text": "Answer in one short sentence."}]
    m = ant.messages.create(
        model=MODEL, max_tokens=16, system=system, messages=[{"role": "user", "content": "Hi"}]
    )  # type: ignore[arg-type]
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens > 0
    with ant.messages.stream(
        model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text  # type: ignore[union-attr]
    assert final.usage.output_tokens > 0


def test_anthropic_count_tokens_matches_usage(ant: anthropic.Anthropic) -> None:
    kwargs = {
        "model": MODEL,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Count me, please."}],
    }
    counted = ant.messages.count_tokens(**kwargs).input_tokens  # type: ignore[arg-type]
    u = ant.messages.create(max_tokens=4, **kwargs).usage  # type: ignore[arg-type]
    assert counted == u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)


def test_anthropic_stream_reports_the_prompt_at_message_start(ant: anthropic.Anthropic) -> None:
    kwargs = {
        "model": MODEL,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Name three colours of the rainbow."}],
        "max_tokens": 8,
    }
    plain = ant.messages.create(**kwargs).usage  # type: ignore[arg-type]
    with ant.messages.stream(**kwargs) as stream:  # type: ignore[arg-type]
        start = next(e for e in stream if e.type == "message_start").message.usage
        final = stream.get_final_message().usage

    def prompt(u: anthropic.types.Usage) -> int:
        return u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)

    assert prompt(start) > 0 and prompt(start) == prompt(plain)
    # The engine reused the prompt it had just seen; both events say so alike.
    assert (start.input_tokens, start.cache_read_input_tokens) == (
        final.input_tokens,
        final.cache_read_input_tokens,
    )


def test_anthropic_tool_round_trip(ant: anthropic.Anthropic) -> None:
    first = ant.messages.create(
        model=MODEL,
        max_tokens=64,
        tools=[WEATHER_ANTHROPIC],  # type: ignore[list-item]
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": ASK}],
    )
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "get_weather" and isinstance(call.input, dict) and "city" in call.input
    second = ant.messages.create(
        model=MODEL,
        max_tokens=32,
        tools=[WEATHER_ANTHROPIC],  # type: ignore[list-item]
        tool_choice={"type": "none"},
        messages=[
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"}],
            },
        ],
    )
    assert second.content and second.content[0].type == "text"


def test_anthropic_error_types(ant: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        ant.messages.create(model="ghost", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        ant.messages.create(model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "x"}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "max_tokens" in bad.value.body["error"]["message"]  # type: ignore[index]


def test_claude_code_replay_with_a_system_turn_in_messages(daemon: DaemonProc) -> None:
    """Claude Code's request shape: a system turn after the user's, tools, a stream."""
    golden = Path(__file__).parents[1] / "blazar" / "golden" / "anthropic"
    doc = json.loads((golden / "claude_code_mid_conversation_system.request.json").read_bytes())
    replay = json.dumps({**doc, "model": MODEL, "max_tokens": 8}).encode()
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
        "mid-conversation-system-2026-04-07",
        "x-api-key": "unused",
        "content-type": "application/json",
    }
    with httpx.stream(
        "POST", f"{daemon.url}/v1/messages?beta=true", content=replay, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        events = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop" and "error" not in events


def _fresh_engine(daemon: DaemonProc) -> None:
    """Drop the model's engine, so the next request starts it with its configured context:
    the module's tests share one daemon, and a test that grew the context (``num_ctx``) is
    not undone by a pull of the same files any more."""
    httpx.post(f"{daemon.url}/admin/models/{MODEL}/forget", timeout=30).raise_for_status()


def test_anthropic_prompt_over_the_context_reads_as_anthropic_says_it(
    daemon: DaemonProc, ant: anthropic.Anthropic
) -> None:
    _fresh_engine(daemon)
    with pytest.raises(anthropic.BadRequestError) as exc:
        ant.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hello " * 6000}]
        )
    body = exc.value.body
    assert isinstance(body, dict) and body["blazar_code"] == "PROMPT_TOO_LONG"
    m = re.match(r"prompt is too long: (\d+) tokens > (\d+) maximum", body["error"]["message"])
    assert m is not None and int(m.group(1)) > int(m.group(2)) > 0, body
    assert "raise the context" in body["error"]["message"]


def test_openai_prompt_over_the_context_reads_as_openai_says_it(daemon: DaemonProc) -> None:
    _fresh_engine(daemon)
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hello " * 6000}]
        )
    body = exc.value.body
    assert isinstance(body, dict) and body["blazar_code"] == "PROMPT_TOO_LONG" and body["param"] == "messages"
    assert body["message"].startswith("This model's maximum context length is ")


# -- a required tool comes back well-formed through every dialect ------------------


def test_required_tool_openai(daemon: DaemonProc) -> None:
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": ASK}],
        tools=[WEATHER_OPENAI],
        tool_choice="required",  # type: ignore[list-item]
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    import json

    assert isinstance(json.loads(calls[0].function.arguments)["city"], str)  # type: ignore[union-attr]


def test_required_tool_ollama(oll: ollama.Client) -> None:
    r = oll.chat(
        model=MODEL,
        messages=[{"role": "user", "content": ASK}],
        tools=[WEATHER_OPENAI],
        format="json",
        options={"temperature": 0},
    )
    assert r.message.tool_calls and r.message.tool_calls[0].function.name == "get_weather"
    assert isinstance(r.message.tool_calls[0].function.arguments["city"], str)


def test_required_tool_anthropic(ant: anthropic.Anthropic) -> None:
    with ant.messages.stream(
        model=MODEL,
        max_tokens=64,
        tools=[WEATHER_ANTHROPIC],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": ASK}],
    ) as stream:
        final = stream.get_final_message()
    call = next(b for b in final.content if b.type == "tool_use")
    assert final.stop_reason == "tool_use" and isinstance(call.input["city"], str)  # type: ignore[index]


def test_ollama_create_from_model_and_from_blob(
    daemon: DaemonProc, oll: ollama.Client, model_path: Path
) -> None:
    created = oll.create(
        model="smol-pirate", from_=MODEL, system="You are a pirate.", parameters={"num_predict": 8}
    )
    assert created.status == "success"
    shown = oll.show("smol-pirate")
    assert shown.modelinfo is not None
    r = oll.chat(
        model="smol-pirate", messages=[{"role": "user", "content": "Hello"}], options={"temperature": 0}
    )
    assert r.eval_count is not None and r.eval_count <= 8  # the model's own num_predict applies
    relayed = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": "smol-pirate", "messages": [{"role": "user", "content": "Hello"}], "temperature": 0},
        timeout=60,
    ).json()
    assert relayed["usage"]["completion_tokens"] <= 8  # on the relayed OpenAI path too
    digest = oll.create_blob(model_path)
    assert digest.startswith("sha256:")
    made = oll.create(model="smol-from-blob", files={"model.gguf": digest})
    assert made.status == "success"
    assert oll.generate(model="smol-from-blob", prompt="Hi", options={"num_predict": 4}).response
    for name in ("smol-pirate", "smol-from-blob"):
        oll.delete(name)
    assert [m.model for m in oll.list().models] == [f"{MODEL}:latest"]


def test_ollama_blob_digest_is_checked(daemon: DaemonProc) -> None:
    bogus = "sha256:" + "0" * 64
    assert httpx.head(f"{daemon.url}/api/blobs/{bogus}").status_code == 404
    r = httpx.post(f"{daemon.url}/api/blobs/{bogus}", content=b"not the bytes")
    assert r.status_code == 400 and r.json()["blazar_code"] == "BAD_REQUEST"


def test_ollama_num_ctx_restarts_the_engine_once_and_only_to_grow(
    daemon: DaemonProc, oll: ollama.Client
) -> None:
    _fresh_engine(daemon)
    oll.generate(model=MODEL, prompt="Hi", options={"num_predict": 2})
    before = daemon.engines()[0]
    oll.generate(model=MODEL, prompt="Hi", options={"num_predict": 2, "num_ctx": 1024})
    assert daemon.engines()[0]["generation"] == before["generation"]  # it serves more already
    for _ in range(2):
        oll.generate(model=MODEL, prompt="Hi", options={"num_predict": 2, "num_ctx": 5000})
    after = daemon.engines()[0]
    # llama.cpp rounds a slot up to a multiple of 256: /api/ps reports what it serves.
    assert after["ctx_per_slot"] == 5000 and after["ctx_served"] == 5120
    assert after["generation"] == int(before["generation"]) + 1  # type: ignore[call-overload]
    assert oll.ps().models[0].context_length == 5120
