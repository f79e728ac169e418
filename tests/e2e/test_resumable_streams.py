"""Resumable streams on the real daemon and engine: a client cut off mid-answer resumes with
``GET /v1/stream`` and ``Last-Event-ID`` and gets the rest of the same answer; streams are
each key's own, deletable, listed by lookup, cancelled when nobody resumes within their grace,
and dropped after ``keep_s``. A stream that does not opt in still stops the engine at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk

from tests.support import MODEL, DaemonProc, add_key, make_home, start_daemon

pytestmark = pytest.mark.slow

GRACE_S = 3.0
KEEP_S = 5.0
CONFIG = f"""
[streams]
grace_s = {GRACE_S}
keep_s = {KEEP_S}
"""
RESUMABLE = {"X-Blazar-Resumable": "on"}
ASK: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a story about a brave little robot."}],
    "max_tokens": 160,
    "temperature": 0,
    "seed": 7,
}
LONG: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Write a very long story."}],
    "max_tokens": 2000,
    "ignore_eos": True,  # llama.cpp's own field: it runs to max_tokens, however the story goes
}


class Daemon:
    def __init__(self, proc: DaemonProc, keys: dict[str, str]) -> None:
        self.proc, self.url, self.keys = proc, proc.url, keys

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    def client(self, who: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.keys[who], max_retries=0, timeout=60)

    def busy_slots(self) -> int:
        slots = httpx.get(f"{self.url}/admin/engines/{MODEL}/slots", headers=self.auth("ops"), timeout=10)
        return sum(1 for s in slots.json() if s.get("is_processing"))

    def wait_idle(self, within_s: float) -> float:
        t0 = time.monotonic()
        while self.busy_slots() and time.monotonic() - t0 < within_s:
            time.sleep(0.02)
        assert self.busy_slots() == 0, f"the engine slot was still busy {within_s} s later"
        return time.monotonic() - t0

    def lookup(self, who: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        r = httpx.post(f"{self.url}/v1/streams/lookup", json=body, headers=self.auth(who), timeout=10)
        assert r.status_code == 200, r.text
        return r.json()["data"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Daemon]:
    home = make_home(tmp_path_factory.mktemp("resumable") / "home", model_path, config=CONFIG)
    keys = {name: add_key(home, name) for name in ("alice", "bob")}
    keys["ops"] = add_key(home, "ops", "admin")
    proc = start_daemon(home)
    try:
        yield Daemon(proc, keys)
    finally:
        proc.stop()


def _text(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _cut_after(
    daemon: Daemon, who: str, body: dict[str, Any], n: int
) -> tuple[str, list[ChatCompletionChunk]]:
    """Stream ``body`` resumably, read ``n`` chunks, and drop the connection; the stream's id
    and the chunks read."""
    own = {k: v for k, v in body.items() if k != "ignore_eos"}  # the SDK has no such parameter
    extra = {"ignore_eos": body["ignore_eos"]} if "ignore_eos" in body else None
    raw = daemon.client(who).chat.completions.with_raw_response.create(
        **own, stream=True, extra_headers=RESUMABLE, extra_body=extra
    )
    stream_id = raw.headers["x-blazar-stream-id"]
    stream = raw.parse()
    got = []
    for chunk in stream:
        got.append(chunk)
        if len(got) == n:
            break
    stream.close()  # the socket goes, mid-answer
    return stream_id, got


def _resume(daemon: Daemon, who: str, stream_id: str, last_event_id: int) -> list[ChatCompletionChunk]:
    """The rest of a stream, through the official client's own SSE reader."""
    client = daemon.client(who)
    stream = client.get(
        "/stream",
        cast_to=ChatCompletionChunk,
        options={"params": {"id": stream_id}, "headers": {"Last-Event-ID": str(last_event_id)}},
        stream=True,
        stream_cls=openai.Stream[ChatCompletionChunk],
    )
    return list(stream)


def test_resumed_answer_equals_an_uncut_one(daemon: Daemon) -> None:
    whole = list(daemon.client("alice").chat.completions.create(**ASK, stream=True, extra_headers=RESUMABLE))
    stream_id, head = _cut_after(daemon, "alice", ASK, 4)
    assert stream_id.startswith("strm_") and len(head) == 4
    tail = _resume(daemon, "alice", stream_id, 4)  # each chunk is one event: ids 1..4 were read
    assert tail and tail[-1].choices[0].finish_reason is not None
    assert _text(head) + _text(tail) == _text(whole) != ""
    assert {c.id for c in head + tail} == {head[0].id}  # one completion, not a second generation
    # read again from the start (no Last-Event-ID): the whole answer, ids in order
    with httpx.stream(
        "GET", f"{daemon.url}/v1/stream", params={"id": stream_id}, headers=daemon.auth("alice"), timeout=30
    ) as r:
        assert r.status_code == 200 and r.headers["x-blazar-stream-id"] == stream_id
        ids = [int(line[4:]) for line in r.iter_lines() if line.startswith("id: ")]
    assert ids == list(range(1, len(ids) + 1)) and len(ids) == len(head) + len(tail) + 1  # + [DONE]
    [info] = daemon.lookup("alice", {"ids": [stream_id]})
    assert info["state"] == "done" and info["last_event_id"] == ids[-1] and info["model"] == MODEL


def test_anthropic_stream_resumes_too(daemon: Daemon) -> None:
    client = anthropic.Anthropic(base_url=daemon.url, api_key=daemon.keys["alice"], max_retries=0, timeout=60)
    ask: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 120,
        "messages": ASK["messages"],
        "extra_body": {"temperature": 0},  # this SDK version no longer takes it as an argument
        "extra_headers": RESUMABLE,
    }

    def text(events: list[RawMessageStreamEvent]) -> str:
        deltas = [e.delta for e in events if e.type == "content_block_delta"]
        return "".join(d.text for d in deltas if d.type == "text_delta")

    whole = list(client.messages.create(**ask, stream=True))
    raw = client.messages.with_raw_response.create(**ask, stream=True)
    stream_id = raw.headers["x-blazar-stream-id"]
    stream, head = raw.parse(), []
    for event in stream:  # pings carry no id (the SDK skips them): each event yielded is one id
        head.append(event)
        if len(head) == 5:
            break
    stream.close()
    rest = client.get(
        "/v1/stream",
        cast_to=Message,
        options={"params": {"id": stream_id}, "headers": {"Last-Event-ID": "5"}},
        stream=True,
        stream_cls=anthropic.Stream[RawMessageStreamEvent],
    )
    tail = list(rest)
    assert tail[-1].type == "message_stop"
    assert text(head) + text(tail) == text(whole) != ""


def test_streams_are_the_keys_own(daemon: Daemon) -> None:
    stream_id, _ = _cut_after(daemon, "alice", {**ASK, "max_tokens": 8}, 1)
    for method in ("GET", "DELETE"):
        r = httpx.request(
            method,
            f"{daemon.url}/v1/stream",
            params={"id": stream_id},
            headers=daemon.auth("bob"),
            timeout=10,
        )
        assert r.status_code == 404, r.text
        assert r.json()["error"]["blazar_code"] == "STREAM_NOT_FOUND"
    assert daemon.lookup("bob", {"ids": [stream_id]}) == []
    assert [s["id"] for s in daemon.lookup("alice", {"ids": [stream_id, "strm_nope"]})] == [stream_id]
    unknown = httpx.get(f"{daemon.url}/v1/stream", params={"id": "strm_nope"}, headers=daemon.auth("alice"))
    assert unknown.status_code == 404 and unknown.json()["error"]["blazar_code"] == "STREAM_NOT_FOUND"


def test_malformed_last_event_id_is_400_naming_it(daemon: Daemon) -> None:
    stream_id, _ = _cut_after(daemon, "alice", {**ASK, "max_tokens": 8}, 1)
    for headers, params, named in (
        ({"Last-Event-ID": "seven"}, {}, "Last-Event-ID"),
        ({"Last-Event-ID": "-1"}, {}, "Last-Event-ID"),
        ({}, {"last_event_id": "1.5"}, "last_event_id"),
        ({"Last-Event-ID": "999999"}, {}, "Last-Event-ID"),  # past the stream's newest event
    ):
        r = httpx.get(
            f"{daemon.url}/v1/stream",
            params={"id": stream_id, **params},
            headers={**daemon.auth("alice"), **headers},
            timeout=10,
        )
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["blazar_code"] == "BAD_REQUEST" and named in error["message"]
        assert error["param"] == named


def test_bad_opt_in_value_is_400_naming_the_header(daemon: Daemon) -> None:
    r = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={**ASK, "stream": True},
        headers={**daemon.auth("alice"), "X-Blazar-Resumable": "maybe"},
        timeout=10,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Blazar-Resumable"


def test_delete_cancels_the_generation(daemon: Daemon) -> None:
    stream_id, _ = _cut_after(daemon, "alice", LONG, 4)
    time.sleep(0.5)
    assert daemon.busy_slots() == 1  # cut off, but the answer goes on for a resume
    [info] = daemon.lookup("alice", {"ids": [stream_id], "state": "live"})
    assert info["readers"] == 0
    r = httpx.delete(f"{daemon.url}/v1/stream", params={"id": stream_id}, headers=daemon.auth("alice"))
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert daemon.wait_idle(2.0) < 2.0
    gone = httpx.get(f"{daemon.url}/v1/stream", params={"id": stream_id}, headers=daemon.auth("alice"))
    assert gone.status_code == 404


def test_unresumed_stream_is_cancelled_after_its_grace(daemon: Daemon) -> None:
    stream_id, head = _cut_after(daemon, "alice", LONG, 4)
    time.sleep(GRACE_S / 2)
    assert daemon.busy_slots() == 1
    # a resume that is cut off in turn: its grace starts again from there
    with httpx.stream(
        "GET",
        f"{daemon.url}/v1/stream",
        params={"id": stream_id, "last_event_id": str(len(head))},
        headers=daemon.auth("alice"),
        timeout=30,
    ) as r:
        lines = r.iter_lines()
        assert next(lines) == f"id: {len(head) + 1}"
        assert daemon.lookup("alice", {"ids": [stream_id]})[0]["readers"] == 1
    time.sleep(GRACE_S * 0.75)
    assert daemon.busy_slots() == 1  # past the first grace: the resume stopped its clock
    daemon.wait_idle(GRACE_S + 2.0)
    [info] = daemon.lookup("alice", {"ids": [stream_id]})
    assert info["state"] == "cancelled" and info["readers"] == 0
    # what was made is still there; it ends with the cancellation, in the stream's dialect
    with pytest.raises(openai.APIError) as caught:
        _resume(daemon, "alice", stream_id, len(head))
    assert isinstance(caught.value.body, dict) and caught.value.body["blazar_code"] == "STREAM_CANCELLED"
    assert "nobody read it" in caught.value.body["message"]


def test_finished_stream_expires(daemon: Daemon) -> None:
    whole = daemon.client("alice").chat.completions.with_raw_response.create(
        **{**ASK, "max_tokens": 4}, stream=True, extra_headers=RESUMABLE
    )
    stream_id = whole.headers["x-blazar-stream-id"]
    list(whole.parse())
    assert daemon.lookup("alice", {"ids": [stream_id]})[0]["state"] == "done"
    time.sleep(KEEP_S + 1.0)
    assert daemon.lookup("alice", {"ids": [stream_id]}) == []
    r = httpx.get(f"{daemon.url}/v1/stream", params={"id": stream_id}, headers=daemon.auth("alice"))
    assert r.status_code == 404 and r.json()["error"]["blazar_code"] == "STREAM_NOT_FOUND"


def test_plain_stream_still_stops_at_disconnect(daemon: Daemon) -> None:
    with (
        httpx.Client(timeout=60, headers=daemon.auth("alice")) as http,
        http.stream("POST", f"{daemon.url}/v1/chat/completions", json={**LONG, "stream": True}) as r,
    ):
        assert "x-blazar-stream-id" not in r.headers
        lines = r.iter_lines()
        for _ in range(6):
            assert not next(lines).startswith("id:")  # no event ids either
        assert daemon.busy_slots() == 1
    assert daemon.wait_idle(2.0) < 2.0
