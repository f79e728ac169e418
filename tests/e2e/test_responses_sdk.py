"""The Responses API through the official ``openai`` SDK, on the real daemon and engine."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _comparable(resp: Any) -> dict[str, Any]:
    """A Response without what differs between two runs of one request (ids, times)."""
    doc = resp.model_dump(exclude_none=True)
    for key in ("id", "created_at", "completed_at"):
        doc.pop(key, None)
    for item in doc["output"]:
        item.pop("id", None)
    # the second run of one prompt reuses the engine's cache: a true difference
    doc["usage"]["input_tokens_details"].pop("cached_tokens")
    return doc


def test_create_plain(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL, input="Name three colours.", max_output_tokens=24, temperature=0, extra_body={"seed": 7}
    )
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.status in ("completed", "incomplete")
    assert resp.output_text.strip()
    message = resp.output[-1]
    assert message.type == "message" and message.role == "assistant"
    assert resp.usage is not None and resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens


def test_max_output_tokens_gives_incomplete(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL, input="Write a long story about a dragon.", max_output_tokens=5, temperature=0
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage is not None and resp.usage.output_tokens == 5


def test_stream_accumulates_to_the_same_response(client: openai.OpenAI) -> None:
    params: dict[str, Any] = dict(
        model=MODEL,
        input="Say hello to Ada in five words.",
        instructions="You are terse.",
        max_output_tokens=20,
        temperature=0,
        extra_body={"seed": 11},
    )
    whole = client.responses.create(**params)
    with client.responses.stream(**params) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in types
    for name in (
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ):
        assert name in types
    assert _comparable(final) == _comparable(whole)
    # both were stored
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_stream_events_are_numbered(daemon: DaemonProc) -> None:
    body = {"model": MODEL, "input": "Hi", "max_output_tokens": 8, "stream": True}
    events = []
    with httpx.stream("POST", f"{daemon.url}/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all({"item_id", "output_index", "content_index"} <= e.keys() for e in deltas)


def test_tool_call_and_its_output(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris? Use the tool.",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    )
    calls = [item for item in resp.output if item.type == "function_call"]
    assert calls, resp.output
    call = calls[0]
    assert call.name == "get_weather"
    assert isinstance(json.loads(call.arguments).get("city"), str)
    follow = client.responses.create(
        model=MODEL,
        previous_response_id=resp.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'}],
        tools=[WEATHER],  # type: ignore[list-item]
        max_output_tokens=32,
        temperature=0,
    )
    assert follow.status in ("completed", "incomplete")
    assert follow.previous_response_id == resp.id


def test_streamed_tool_call(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL,
        input="What is the weather in Oslo? Use the tool.",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    ) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in types
    call = next(item for item in final.output if item.type == "function_call")
    assert json.loads(call.arguments)


def test_chain_of_three_turns(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL, input="My name is Ada. Remember it.", max_output_tokens=16, temperature=0
    )
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, input="I live in Paris.", max_output_tokens=16
    )
    third = client.responses.create(
        model=MODEL, previous_response_id=second.id, input="What is my name?", max_output_tokens=16
    )
    # the third turn saw the whole chain: its prompt holds every earlier turn
    assert third.usage is not None and second.usage is not None and first.usage is not None
    assert third.usage.input_tokens > second.usage.input_tokens > first.usage.input_tokens
    count = client.responses.input_tokens.count(
        model=MODEL, previous_response_id=second.id, input="What is my name?"
    )
    assert count.input_tokens == third.usage.input_tokens
    items = client.responses.input_items.list(third.id)
    texts = [part.text for item in items.data for part in getattr(item, "content", []) or []]
    assert texts == ["What is my name?"]


def test_input_items_pagination(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "three"},
        ],
        max_output_tokens=4,
    )
    page = client.responses.input_items.list(resp.id, limit=2, order="asc")
    assert page.has_more and len(page.data) == 2
    rest = client.responses.input_items.list(resp.id, limit=2, order="asc", after=page.data[-1].id)
    assert not rest.has_more and len(rest.data) == 1
    newest = client.responses.input_items.list(resp.id)
    assert [i.id for i in newest.data] == [i.id for i in [*page.data, *rest.data]][::-1]


def test_delete_and_unknown_ids(client: openai.OpenAI) -> None:
    resp = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    client.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.retrieve(resp.id)
    assert err.value.body["blazar_code"] == "NOT_FOUND"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, previous_response_id="resp_nope", input="Hi")


def test_store_false_is_not_kept(client: openai.OpenAI) -> None:
    resp = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)


def test_conversation_threads_responses(client: openai.OpenAI) -> None:
    conv = client.conversations.create(metadata={"topic": "names"})
    client.responses.create(model=MODEL, conversation=conv.id, input="My name is Grace.", max_output_tokens=8)
    second = client.responses.create(
        model=MODEL, conversation=conv.id, input="And yours?", max_output_tokens=8
    )
    assert second.conversation is not None and second.conversation.id == conv.id
    items = client.conversations.items.list(conv.id, order="asc")
    kinds = [(i.type, getattr(i, "role", None)) for i in items.data]
    assert kinds[0] == ("message", "user") and kinds[1] == ("message", "assistant")
    assert len(items.data) == 4
    assert client.conversations.retrieve(conv.id).metadata == {"topic": "names"}
    assert client.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": MODEL, "input": "hi", "include": ["not.a.thing"]}, "include[0]"),
        ({"model": MODEL, "input": [{"type": "nope"}]}, "input[0].type"),
        ({"model": MODEL, "input": "hi", "temperature": 3}, "temperature"),
        ({"model": MODEL, "input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(daemon: DaemonProc, body: dict[str, Any], param: str) -> None:
    r = httpx.post(f"{daemon.url}/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["blazar_code"] == "BAD_REQUEST"


def test_json_schema_format(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        # An enum bounds the answer: a free string lets the 135M model ramble past any token cap.
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    resp = client.responses.create(
        model=MODEL,
        input="Name a colour.",
        text={"format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}},
        max_output_tokens=64,
        temperature=0,
    )
    assert resp.status == "completed", resp.incomplete_details
    assert json.loads(resp.output_text)["colour"] in {"red", "green", "blue"}


def test_include_it_cannot_give_is_named(daemon: DaemonProc) -> None:
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 4, "include": ["reasoning.encrypted_content"]}
    r = httpx.post(f"{daemon.url}/v1/responses", json=body, timeout=60)
    assert r.status_code == 200
    assert r.headers["x-blazar-ignored"] == "include:reasoning.encrypted_content"


@pytest.fixture
def own_daemon(tmp_path: Path, model_path: Path) -> Iterator[DaemonProc]:
    d = start_daemon(make_home(tmp_path / "home", model_path))
    try:
        yield d
    finally:
        d.stop()


def test_chain_survives_a_restart(own_daemon: DaemonProc) -> None:
    client = openai.OpenAI(base_url=f"{own_daemon.url}/v1", api_key="unused", max_retries=0, timeout=120)
    first = client.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=8)
    own_daemon.proc.kill()  # kill -9: the stored response was committed before the answer
    own_daemon.proc.wait()
    (own_daemon.home / "run" / "daemon.json").unlink()  # left behind by the killed daemon
    again = start_daemon(own_daemon.home)
    try:
        client = openai.OpenAI(base_url=f"{again.url}/v1", api_key="unused", max_retries=0, timeout=120)
        assert client.responses.retrieve(first.id).output_text == first.output_text
        second = client.responses.create(
            model=MODEL, previous_response_id=first.id, input="What is my name?", max_output_tokens=8
        )
        assert second.usage is not None and first.usage is not None
        assert second.usage.input_tokens > first.usage.input_tokens
    finally:
        again.stop()


def _wait_done(client: openai.OpenAI, response_id: str, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        resp = client.responses.retrieve(response_id)
        if resp.status not in ("queued", "in_progress"):
            return resp
        time.sleep(0.1)
    raise AssertionError(f"{response_id} still {resp.status}")


def test_background_poll_stream_again_and_jobs(client: openai.OpenAI, daemon: DaemonProc) -> None:
    resp = client.responses.create(
        model=MODEL, input="Name three colours.", max_output_tokens=24, background=True, temperature=0
    )
    assert resp.status == "queued" and resp.background
    done = _wait_done(client, resp.id)
    assert done.status in ("completed", "incomplete") and done.output_text
    # the stored stream replays, whole or after a sequence number
    with client.responses.stream(response_id=resp.id) as stream:
        replayed = [event for event in stream]
    assert [e.sequence_number for e in replayed] == list(range(len(replayed)))
    assert replayed[-1].type in ("response.completed", "response.incomplete")
    assert replayed[-1].response.output_text == done.output_text  # type: ignore[union-attr]
    url = f"{daemon.url}/v1/responses/{resp.id}"
    with httpx.stream("GET", url, params={"stream": "true", "starting_after": 3}, timeout=30) as r:
        seqs = [
            json.loads(line[6:])["sequence_number"] for line in r.iter_lines() if line.startswith("data: ")
        ]
    assert seqs == list(range(4, len(replayed)))
    job = httpx.get(f"{daemon.url}/v1/jobs/{resp.id}", timeout=10).json()
    assert job["object"] == "blazar.job" and job["kind"] == "response" and job["status"] == "completed"
    listed = httpx.get(f"{daemon.url}/v1/jobs", params={"kind": "response"}, timeout=10).json()
    assert resp.id in [j["id"] for j in listed["data"]]
    # a cancel of a finished job is refused, in OpenAI's shape
    with pytest.raises(openai.ConflictError) as err:
        client.responses.cancel(resp.id)
    assert err.value.body["blazar_code"] == "JOB_FINISHED"  # type: ignore[index]


def test_background_streamed_from_the_start(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL, input="Say hi.", max_output_tokens=200, temperature=0, background=True
    ) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete")
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_background_cancel(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL, input="Write a very long story about the sea.", max_output_tokens=3000, background=True
    )
    deadline = time.monotonic() + 60
    while client.responses.retrieve(resp.id).status == "queued" and time.monotonic() < deadline:
        time.sleep(0.05)
    cancelled = client.responses.cancel(resp.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(resp.id).status == "cancelled"


def test_background_response_survives_kill_9(own_daemon: DaemonProc) -> None:
    client = openai.OpenAI(base_url=f"{own_daemon.url}/v1", api_key="unused", max_retries=0, timeout=120)
    # Long enough that the daemon dies mid-answer (it is killed within a poll of the answer's
    # start), short enough that the second attempt does not spend seconds writing it again.
    resp = client.responses.create(
        model=MODEL, input="Write a story about a lighthouse.", max_output_tokens=128, background=True
    )
    deadline = time.monotonic() + 60
    while client.responses.retrieve(resp.id).status != "in_progress" and time.monotonic() < deadline:
        time.sleep(0.05)
    own_daemon.proc.kill()
    own_daemon.proc.wait()
    (own_daemon.home / "run" / "daemon.json").unlink()
    again = start_daemon(own_daemon.home)
    try:
        client = openai.OpenAI(base_url=f"{again.url}/v1", api_key="unused", max_retries=0, timeout=120)
        done = _wait_done(client, resp.id, timeout_s=180)
        assert done.status in ("completed", "incomplete") and done.output_text
        job = httpx.get(f"{again.url}/v1/jobs/{resp.id}", timeout=10).json()
        assert job["attempts"] == 2
    finally:
        again.stop()
    db = sqlite3.connect(own_daemon.home / "blazar.db")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        db.close()
