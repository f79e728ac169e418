"""Real clients' requests, recorded on the wire and replayed byte for byte against a real daemon.

The fixtures under ``replays/`` hold what Claude Code, aider and Codex sent to the daemon
when run as a new user runs them (method, path, the headers that matter, the body
and how the client encoded it). Each test asserts what that client needs in order to
work: a 2xx where it expects one, an answer well formed in its dialect, refusals in
the words it parses, and no engine restart between the turns of one session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

REPLAYS = Path(__file__).parent / "replays"

# Claude Code's prompt (system text, 24 tool schemas, the turn) is about 19,000 tokens:
# more than the test model's 8,192-token training context, so the model is given
# an explicit context extension, the way a user would configure it for this client.
EXTENDED = """\
[models."smollm2-135m"]
ctx = 32768
slots = 1
rope_scaling = "yarn"
"""


def recorded(name: str) -> list[dict[str, Any]]:
    return json.loads((REPLAYS / f"{name}.json").read_text())["requests"]


def encode(req: dict[str, Any]) -> bytes:
    """The body as the client wrote it: JavaScript's compact JSON or Python's default."""
    body = req["body"]
    if body is None:
        return b""
    if req["encoding"] == "compact":
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return json.dumps(body).encode()


def _body(req: dict[str, Any], **changes: Any) -> bytes:
    """The recorded body, ``changes`` replacing top-level fields."""
    return encode({**req, "body": {**req["body"], **changes}} if changes else req)


def replay(client: httpx.Client, url: str, req: dict[str, Any]) -> httpx.Request:
    """The recorded request, aimed at ``url``."""
    return client.build_request(req["method"], url + req["path"], headers=req["headers"], content=_body(req))


def sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs from a server-sent event stream."""
    name = ""
    for line in lines:
        if line.startswith("event:"):
            name = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            yield name, json.loads(line.removeprefix("data:"))


@pytest.fixture
def extended(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    # One daemon per test: a replay leaves after message_start, and the engine goes on
    # reading that 19,000-token prompt for minutes (llama.cpp notices a closed
    # connection only at its first token), holding the only slot. Stopping the daemon
    # ends the engine; sharing it made the next replay wait out queue_timeout_s.
    d = start_daemon(make_home(tmp_path_factory.mktemp("extended") / "home", model_path, config=EXTENDED))
    try:
        yield d
    finally:
        d.stop()


def _stream_head(d: DaemonProc, name: str) -> list[tuple[str, dict[str, Any]]]:
    """Replay a recorded Claude Code session up to its stream's first event.

    Reading the whole answer would cost the full prompt evaluation (minutes on two
    cores); the first event already proves the turn was accepted, fits the context
    and was counted. Leaving then is what the client does on Ctrl-C."""
    events: list[tuple[str, dict[str, Any]]] = []
    with httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
        for req in recorded(name):
            if req["method"] == "HEAD":
                assert client.send(replay(client, d.url, req)).is_success
                continue
            r = client.send(replay(client, d.url, req), stream=True)
            try:
                assert r.status_code == 200, r.read().decode()
                assert r.headers["content-type"].startswith("text/event-stream")
                for event in sse(r.iter_lines()):
                    events.append(event)
                    if event[0] == "message_start":
                        break
            finally:
                r.close()
    return events


def _assert_counted_start(events: list[tuple[str, dict[str, Any]]]) -> None:
    (name, start), *_ = events
    assert name == "message_start" and start["type"] == "message_start"
    message = start["message"]
    assert message["role"] == "assistant" and message["content"] == []
    assert message["model"] == "smollm2-135m"
    # The whole prompt, tool schemas included: the client budgets its context by it.
    assert message["usage"]["input_tokens"] > 15_000


def test_claude_code_first_turn_is_accepted_and_counted(extended: DaemonProc) -> None:
    # A system message after the user's turn, 24 tool schemas, adaptive thinking,
    # context management, cache_control: everything Claude Code sends by default.
    _assert_counted_start(_stream_head(extended, "claude_code_first"))


def test_claude_code_fallback_turn_is_accepted_and_counted(extended: DaemonProc) -> None:
    _assert_counted_start(_stream_head(extended, "claude_code_fallback"))


def test_claude_code_turn_over_the_context_is_refused_in_anthropic_words(daemon: DaemonProc) -> None:
    # The default context (4,096 per slot) cannot hold the prompt. Claude Code reads
    # both counts from this exact wording to decide how much to compact.
    for name in ("claude_code_first", "claude_code_fallback"):
        req = recorded(name)[-1]
        with httpx.Client(timeout=120.0) as client:
            r = client.send(replay(client, daemon.url, req))
        assert r.status_code == 400, name
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        m = re.match(r"prompt is too long: (\d+) tokens > (\d+) maximum", body["error"]["message"])
        assert m is not None, body
        assert int(m[1]) > 15_000 and int(m[2]) == 4096
        assert body["error"]["blazar_code"] == "PROMPT_TOO_LONG"


def test_codex_turn_names_web_search_then_the_context_in_openai_terms(daemon: DaemonProc) -> None:
    # Codex's recorded default turn: its namespace tool is taken, its web_search tool is
    # refused by name (docs/clients.md turns it off); without it, its 6,000-token prompt
    # overflows the default slot with the code Codex recognises as a full context.
    (req,) = recorded("codex-exec-responses")
    with httpx.Client(timeout=120.0) as client:
        r = client.send(replay(client, daemon.url, req))
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["param"] == "tools[8].type" and "web_search" in error["message"]
        tools = [t for t in req["body"]["tools"] if t["type"] != "web_search"]
        r = client.send(
            client.build_request(
                "POST", daemon.url + req["path"], headers=req["headers"], content=_body(req, tools=tools)
            )
        )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["blazar_code"] == "PROMPT_TOO_LONG"
    m = re.match(
        r"This model's maximum context length is (\d+) tokens. However, your messages resulted in (\d+)",
        error["message"],
    )
    assert m is not None and int(m[1]) == 4096 and int(m[2]) > 5000


def test_claude_code_without_tools_gets_a_whole_answer(daemon: DaemonProc) -> None:
    head, turn = recorded("claude_code_no_tools")
    events: list[tuple[str, dict[str, Any]]] = []
    with httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
        assert client.send(replay(client, daemon.url, head)).is_success
        # The recorded max_tokens (32,000) is shortened to keep the test's time bounded;
        # everything else is as the client sent it.
        with client.stream(
            turn["method"],
            daemon.url + turn["path"],
            headers=turn["headers"],
            content=_body(turn, max_tokens=12),
        ) as r:
            assert r.status_code == 200, r.read().decode()
            assert r.headers["content-type"].startswith("text/event-stream")
            events = list(sse(r.iter_lines()))
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    body = [n for n in names if n != "ping"]
    assert body[0] == "message_start" and body[-2:] == ["message_delta", "message_stop"]
    assert body[1] == "content_block_start" and body[-3] == "content_block_stop"
    assert set(body[2:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["usage"]["input_tokens"] > 1000
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text.strip()
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert 0 < delta["usage"]["output_tokens"] <= 12


def test_aider_session_answers_every_turn_with_one_engine_start(tmp_path: Path, model_path: Path) -> None:
    # A new user's daemon (no configuration) and two turns of one aider session: aider
    # sends num_ctx = its prompt estimate x 1.25 + 8,192, different at every turn.
    d = start_daemon(make_home(tmp_path / "home", model_path))
    try:
        with httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
            for req in recorded("aider_two_turns"):
                r = client.send(replay(client, d.url, req))
                assert r.status_code == 200, (req["path"], r.text)
                if req["path"] == "/api/show":
                    # litellm takes the model's context from a *context_length key.
                    info = r.json()["model_info"]
                    assert any("context_length" in k and v > 0 for k, v in info.items())
                    continue
                lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
                assert all(x["model"] == "smollm2-135m" for x in lines)
                assert all(x["message"]["role"] == "assistant" for x in lines)
                assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]
                assert "".join(x["message"]["content"] for x in lines).strip()
                last = lines[-1]
                assert last["done_reason"] == "stop"
                assert last["prompt_eval_count"] > 0 and last["eval_count"] > 0
        (engine,) = d.engines()
        assert (engine["generation"], engine["restarts"]) == (1, 0), engine
    finally:
        d.stop()
